"""The receiver beside a destination agent: run it, see what it does, install it as a service.

  mellan receiver run [--config FILE]        claim and run this agent's tasks (foreground)
  mellan receiver status [--config FILE] [--json]
  mellan receiver install [--config FILE] [--print]

The configuration (TOML, default $XDG_CONFIG_HOME/mellan/receiver.toml) names the relay,
the agent credential, how many tasks run at once, and the allow-list: which adapters,
working directories and programs this machine will ever run. docs/receiver.md has a
walk-through and one example per adapter.

Exit status of 'run': 0 when stopped by a signal, 77 when the relay refuses the
credential (revoked), 78 for a configuration error, 3 when the relay is unreachable at
start.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from melchior import __version__


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="version", version=f"mellan {__version__}")
    subs = parser.add_subparsers(dest="sub", metavar="SUBCOMMAND", required=True)
    run = subs.add_parser(
        "run", help="claim and run this agent's tasks", description="Claim and run tasks "
        "in the foreground, printing one line per event; stop with Ctrl-C or SIGTERM.",
    )  # fmt: skip
    status = subs.add_parser(
        "status", help="what the running receiver is doing",
        description="What the receiver of this configuration runs, for how long, and the "
        "last progress of each task (from its status file).",
    )  # fmt: skip
    status.add_argument("--json", action="store_true", help="print the status file's JSON")
    install = subs.add_parser(
        "install", help="install a user systemd unit",
        description="Write a Linux user systemd unit that runs 'mellan receiver run' with "
        "this configuration, and print the commands that enable and follow it.",
    )  # fmt: skip
    install.add_argument("--print", action="store_true", help="print the unit, write nothing")
    for sp in (run, status, install):
        sp.add_argument("--version", action="version", version=f"mellan {__version__}")
        sp.add_argument(
            "--config",
            metavar="FILE",
            type=Path,
            help="the receiver configuration (default $XDG_CONFIG_HOME/mellan/receiver.toml)",
        )


def _load(ns: argparse.Namespace) -> object:
    from melchior.mellan.receiver.config import ConfigError, load

    try:
        return load(ns.config.absolute() if ns.config else None)
    except ConfigError as exc:
        print(f"mellan receiver: {exc}", file=sys.stderr)
        return None


def run(ns: argparse.Namespace) -> int:
    from melchior.mellan.receiver.config import ReceiverConfig
    from melchior.mellan.receiver.loop import EXIT_CONFIG

    config = _load(ns)
    if not isinstance(config, ReceiverConfig):
        return EXIT_CONFIG
    if ns.sub == "run":
        from melchior.mellan.receiver import loop

        try:
            return loop.run(config)
        except KeyboardInterrupt:
            return 130
    if ns.sub == "status":
        from melchior.mellan.receiver import status

        state = status.read(config.state_file)
        if state is None:
            print(
                f"mellan receiver: no status file at {config.state_file}; the receiver of "
                f"this configuration has not run here",
                file=sys.stderr,
            )
            return 1
        is_alive = isinstance(state.get("pid"), int) and status.alive(state["pid"])
        if ns.json:
            print(json.dumps({**state, "alive": is_alive}, ensure_ascii=False))
        else:
            status.render(state, is_alive)
        return 0 if is_alive else 1
    from melchior.mellan.receiver import install

    source = config.source or Path(ns.config or "receiver.toml").absolute()
    if ns.print:
        print(install.unit_text(config.name, install.mellan_path(), source), end="")
        print(f"# save as {install.unit_path(config.name)}, then:")
        for line in install.commands(config.name):
            print(f"#   {line}")
        return 0
    path = install.install(config.name, source)
    print(f"wrote {path}; enable, start and follow it with:")
    for line in install.commands(config.name):
        print(f"  {line}")
    return 0
