"""Run a team of agents turn by turn, and read what passed between them.

  melchior plane run PLANE.toml             the operator console (a terminal UI)
  melchior plane run PLANE.toml --headless  no UI: operator lines from stdin, events on stdout
  melchior plane log PLANE.toml [--json]    the message log
  melchior plane status PLANE.toml [--json] each agent's turns, cost, ceiling and questions

PLANE.toml lists [[agents]] with id, description, talksTo, runtime (command,
claude-code, codex, pi, a2a, provider), options, workspace and ceiling (turns, cost_usd);
see docs/plane.md. State (doors, held notes, the log, hops, ceilings spent) is kept in
SQLite beside it and survives a restart.

Headless input, one line each:  NAME> TEXT   a line typed at NAME's prompt
(/team lines and @mentions included);  NAME? KEY   answers NAME's oldest held
question ('y' sends, anything else is no);  wait   waits until no turn runs or is
queued. At the end of input the plane waits until quiet and exits (held notes stay
held), or with --serve keeps running (for the webhook) until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from melchior.plane.config import PlaneConfig
    from melchior.plane.delivery import Event
    from melchior.plane.runner import Plane

EXIT_CONFIG = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="run|log|status")
    run = sub.add_parser(
        "run",
        help="run the plane (the console, or --headless)",
        description="Run the plane: the operator console, or --headless with lines on stdin.",
    )
    run.add_argument("config", type=Path, metavar="PLANE.toml")
    run.add_argument(
        "--headless", action="store_true", help="no terminal UI: lines from stdin, events out"
    )
    run.add_argument(
        "--serve",
        action="store_true",
        help="headless: keep running after the end of input, until SIGINT or SIGTERM",
    )
    log = sub.add_parser(
        "log", help="print the message log", description="Print the plane's message log."
    )
    log.add_argument("config", type=Path, metavar="PLANE.toml")
    log.add_argument("--json", action="store_true", help="one JSON reply with every entry")
    log.add_argument("--after", type=int, default=0, metavar="ID", help="only entries after ID")
    status = sub.add_parser(
        "status",
        help="each agent's turns, cost, ceiling and questions",
        description="Each agent's turns, cost, ceiling, queued wake-ups and held questions.",
    )
    status.add_argument("config", type=Path, metavar="PLANE.toml")
    status.add_argument("--json", action="store_true", help="one JSON reply")


def _config(path: Path) -> PlaneConfig | None:
    from melchior.plane.config import PlaneConfigError, load

    try:
        return load(path)
    except PlaneConfigError as exc:
        print(f"melchior plane: {exc}", file=sys.stderr)
        return None


def run(ns: argparse.Namespace) -> int:
    config = _config(ns.config)
    if config is None:
        return EXIT_CONFIG
    if ns.action == "log":
        return _log(config, ns.json, ns.after)
    if ns.action == "status":
        return _status(config, ns.json)
    import asyncio

    from melchior.plane.state import StateBusy
    from melchior.runtimes import RuntimeConfigError, preflight

    for agent in config.agents:  # a coding agent's CLI out of range: say so before any turn
        try:
            preflight([agent.runtime], {agent.runtime: agent.options})
        except RuntimeConfigError as exc:
            print(f"melchior plane: {agent.id}: {exc}", file=sys.stderr)
            return EXIT_CONFIG
    try:
        if ns.headless:
            return asyncio.run(headless(config, sys.stdin, sys.stdout, serve=ns.serve))
    except StateBusy as exc:
        print(f"melchior plane: {exc}", file=sys.stderr)
        return 1
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        print(
            "melchior plane run: the console needs a terminal; use --headless for scripts",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    from melchior.plane.console import run_console

    return run_console(config)


# -- reading the state ------------------------------------------------------------------------


def _open_state(config: PlaneConfig) -> Any:
    from melchior.plane.state import State

    if not config.state.exists():
        print(
            f"melchior plane: no state at {config.state} yet; has the plane run?", file=sys.stderr
        )
        return None
    return State(config.state, readonly=True)


def _log(config: PlaneConfig, as_json: bool, after: int) -> int:
    from melchior.wire import argv
    from melchior.wire.calls import ok

    state = _open_state(config)
    if state is None:
        return 1
    try:
        entries = state.entries(after)
    finally:
        state.close()
    if as_json:
        argv.emit(ok(entries))
        return 0
    for e in entries:
        route = f"{e.get('sender', '')}->{e.get('recipient', '')}"
        what = " ".join(str(e[k]) for k in ("receipt", "rule") if k in e)
        hop = f"hop {e['hop']}" if "hop" in e else ""
        text = (e.get("text") or e.get("reason") or "").replace("\n", " ")[:80]
        print(f"{e['id']:>5} {e['kind']:<8} {route:<24} {what:<24} {hop:<6} {text}")
    return 0


def _status(config: PlaneConfig, as_json: bool) -> int:
    from melchior.wire import argv
    from melchior.wire.calls import ok

    state = _open_state(config)
    if state is None:
        return 1
    rows = []
    try:
        for agent in config.agents:
            turns, cost = state.spent(agent.id)
            rows.append(
                {
                    "agent": agent.id,
                    "turns": turns,
                    "cost_usd": round(cost, 6),
                    "ceiling": agent.ceiling.describe(turns, cost),
                    "spent": agent.ceiling.reached(turns, cost) is not None,
                    "queued": len(state.pending(agent.id)),
                    "questions": [
                        f"write to {h.recipient}? y / n" for h in state.waiting(agent.id)
                    ],
                }
            )
    finally:
        state.close()
    if as_json:
        argv.emit(ok(rows))
    else:
        for r in rows:
            q = "; ".join(r["questions"])
            print(f"{r['agent']:<16} {r['ceiling']:<28} queued {r['queued']:<3} {q}")
    return 0


# -- headless ---------------------------------------------------------------------------------


def event_line(event: Event) -> str:
    """One event as a line (continuation lines indented) for the headless printer."""
    text = event.text.rstrip("\n").replace("\n", "\n    ")
    if event.kind == "question":
        text += f"   (answer with: {event.agent}? y)"
    return f"{event.agent} | {event.kind}: {text}"


def _watchable(fd: int) -> bool:
    """Can the event loop wait on ``fd``? Pipes, sockets and terminals, yes; a regular
    file or ``/dev/null`` (a character device epoll refuses) never blocks, so it is read
    straight through instead — asked before, because asyncio only finds out in a callback
    after ``connect_read_pipe`` has returned, and the read then never ends."""
    import os
    import stat

    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        return True
    return stat.S_ISCHR(mode) and os.isatty(fd)


async def _lines(stdin: TextIO) -> Any:
    """stdin line by line without a thread that could outlive the loop.

    A pipe, a socket or a terminal is watched by the loop (a closed pipe is the end of
    input); a file or ``/dev/null`` is read at once. A terminal's flags are put back as
    they were, so the shell the operator returns to is not left non-blocking."""
    import asyncio
    import os

    try:
        fd = stdin.fileno()
    except (OSError, ValueError):
        fd = -1
    if fd < 0 or not _watchable(fd):
        text = stdin.read() if fd < 0 else os.read(fd, 1 << 30).decode("utf-8", "replace")
        for line in text.splitlines():
            yield line
        return
    blocking = os.get_blocking(fd)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(os.dup(fd), "rb", buffering=0)
    )
    try:
        while True:
            raw = await reader.readline()
            if not raw:
                return
            yield raw.decode("utf-8", "replace").rstrip("\r\n")
    finally:
        transport.close()
        os.set_blocking(fd, blocking)


async def _script(plane: Plane, stdin: TextIO, say: Any) -> None:
    async for line in _lines(stdin):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped == "wait":
            await plane.quiet()
            continue
        name, sep, rest = stripped.partition(">")
        if sep and name.strip() in plane.config.by_id:
            plane.operator_line(name.strip(), rest.strip())
            continue
        name, sep, rest = stripped.partition("?")
        if sep and name.strip() in plane.config.by_id:
            await plane.quiet()
            asked = plane.questions(name.strip())
            if not asked:
                say(f"melchior plane: {name.strip()} has no question waiting")
                continue
            plane.answer(asked[0].id, rest.strip()[:1])
            continue
        say(f"melchior plane: not a line for the plane: {stripped[:80]!r} (NAME> TEXT, NAME? y)")


async def headless(config: PlaneConfig, stdin: TextIO, out: TextIO, *, serve: bool = False) -> int:
    """Run the plane without a UI; see the module docstring for the input."""
    import asyncio
    import os
    import signal

    from melchior.plane.runner import Plane

    def say(line: str) -> None:
        print(line, file=out, flush=True)

    plane = Plane(config)
    plane.listeners.append(lambda e: say(event_line(e)))
    webhook = None
    where = ""
    if config.webhook is not None:
        from melchior.plane.webhook import Webhook, WebhookPortError

        token = os.environ.get(config.webhook.token_env, "")
        if not token:
            say(f"melchior plane: the webhook needs a token in ${config.webhook.token_env}")
            plane.state.close()
            return EXIT_CONFIG
        try:
            webhook = Webhook(plane, token, config.webhook.listen, config.webhook.port)
        except WebhookPortError as exc:
            print(f"melchior plane: {exc}", file=sys.stderr)
            plane.state.close()
            return EXIT_CONFIG
        where = f"http://{config.webhook.listen}:{webhook.port}/agents/NAME/lines"
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    async def script_then_stop() -> None:
        # SIGINT / SIGTERM are looked at all along, not once the input has ended: a
        # terminal or a pipe nobody closes would otherwise keep the plane up for ever.
        stopped = asyncio.ensure_future(stop.wait())
        script = asyncio.ensure_future(_script(plane, stdin, say))
        try:
            await asyncio.wait({script, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if script.done() and not stopped.done():
                script.result()  # a broken script says so
                if serve:
                    await stopped
                else:
                    quiet = asyncio.ensure_future(plane.quiet())
                    await asyncio.wait({quiet, stopped}, return_when=asyncio.FIRST_COMPLETED)
                    quiet.cancel()
        finally:
            script.cancel()
            stopped.cancel()
            plane.stop()
            if webhook is not None:
                webhook.stop()

    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(plane.run())
            if webhook is not None:
                group.create_task(webhook.serve(lambda port: say(f"webhook: listening on {where}")))
            group.create_task(script_then_stop())
    except* asyncio.CancelledError:
        pass
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        plane.state.close()
    return 0
