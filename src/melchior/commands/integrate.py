"""Write (or print) the configuration that puts melchior in front of a coding agent.

  melchior integrate claude-code [--scope user|project|local] [--print]
  melchior integrate codex [--codex-home DIR] [--print]
  melchior integrate pi [--scope user|project] [--print]

Claude Code: the bridge as an MCP server ('claude mcp add', which needs the claude CLI
on PATH) and its hooks (UserPromptSubmit, PreToolUse, PostToolUse, Stop) in the settings
file of the same scope. Codex: [mcp_servers.melchior], [features] hooks = true and the
notify program in $CODEX_HOME/config.toml, and the hooks in $CODEX_HOME/hooks.json.
pi: the plane's extension (the tools send_to and team, each running 'melchior tool')
in $PI_CODING_AGENT_DIR/extensions/melchior/ (default ~/.pi/agent), or .pi/extensions/
with --scope project. Existing servers and hooks of others are kept; running it twice
changes nothing; a setting it would have to overwrite stops it with the reason.
--print shows what would be written and touches nothing. See docs/integrations.md."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("agent", choices=("claude-code", "codex", "pi"), help="the coding agent")
    parser.add_argument("--print", action="store_true", help="print the configuration only")
    parser.add_argument(
        "--scope",
        choices=("user", "project", "local"),
        default="user",
        help="Claude Code: user (default: every session, kept outside working trees), "
        "project (.mcp.json and .claude/settings.json, shared) or local (this directory); "
        "pi: user (~/.pi/agent/extensions) or project (.pi/extensions)",
    )
    parser.add_argument(
        "--codex-home", metavar="DIR", help="Codex's home (default: $CODEX_HOME or ~/.codex)"
    )
    parser.add_argument(
        "--name", default="melchior", help="the MCP server's (pi: the extension's) name (melchior)"
    )
    parser.add_argument(
        "--as", dest="as_agent", metavar="AGENT", help="the bridge calls the relay as this agent"
    )
    parser.add_argument(
        "--channel",
        action="store_true",
        help="Claude Code: the bridge pushes channel notifications",
    )


def run(ns: argparse.Namespace) -> int:
    import re
    import shutil
    import subprocess

    from melchior.integrations import integrate as plans

    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", ns.name):
        print("melchior integrate: --name is letters, digits, '_' and '-'", file=sys.stderr)
        return 2
    base = plans.melchior_command()
    mcp_args = (["--as", ns.as_agent] if ns.as_agent else []) + (
        ["--channel"] if ns.channel else []
    )
    home = Path(os.environ.get("HOME") or Path.home())
    try:
        if ns.agent == "claude-code":
            plan = plans.claude_plan(
                scope=ns.scope,
                home=home,
                cwd=Path.cwd(),
                name=ns.name,
                mcp_args=mcp_args,
                base=base,
            )
        elif ns.agent == "pi":
            plan = plans.pi_plan(
                scope=ns.scope, env=os.environ, home=home, cwd=Path.cwd(), name=ns.name, base=base
            )
        else:
            codex_home = Path(ns.codex_home or os.environ.get("CODEX_HOME") or home / ".codex")
            plan = plans.codex_plan(
                codex_home=codex_home, name=ns.name, mcp_args=mcp_args, base=base
            )
    except plans.IntegrateError as exc:
        print(f"melchior integrate: {exc}", file=sys.stderr)
        return 1
    if ns.print:
        sys.stdout.write(plan.shown)
        for note in plan.notes:
            print(f"# {note}")
        return 0
    claude = shutil.which("claude") if plan.commands else None
    if plan.commands and claude is None:
        print(
            "melchior integrate: the claude CLI is not on PATH, and the MCP server is added "
            "with it; install Claude Code, or run with --print and follow what it prints",
            file=sys.stderr,
        )
        return 1
    for path in plans.write(plan):
        print(f"wrote {path}")
    for i, argv in enumerate(plan.commands):
        assert claude is not None
        done = subprocess.run([claude, *argv[1:]], capture_output=True, text=True, check=False)
        if i == 0:
            continue  # removing an earlier entry of ours: absent is fine
        if done.returncode != 0:
            print(
                f"melchior integrate: {' '.join(argv)} failed: {done.stderr.strip()}",
                file=sys.stderr,
            )
            return 1
        print(f"ran {' '.join(argv)}")
    for note in plan.notes:
        print(note)
    return 0
