"""What ``melchior integrate`` writes: the bridge and its hooks in Claude Code's or Codex's config.

Everything here builds data (commands, JSON, TOML text) from a few facts — where the
``melchior`` executable is, which scope, which server name — and merges it into what
the user already has, so running it twice changes nothing and nobody else's servers or
hooks are touched. The shapes are the ones the real CLIs accepted (Claude Code 2.1.332,
Codex 0.171.0; docs/integrations.md):

Claude Code
    the MCP server through ``claude mcp add -s SCOPE NAME -- MELCHIOR mcp`` (user and
    local scope live in ``~/.claude.json``, outside any working tree; project scope is
    ``.mcp.json``), and the hooks (``UserPromptSubmit``, ``PreToolUse``, ``PostToolUse``,
    ``Stop``) in the settings file of the same scope.
pi
    the plane's extension (``send_to`` and ``team``, a TypeScript file shipped in this
    package as data) in pi's extensions directory, with a ``melchior.json`` beside it
    naming the melchior executable its tools run.
Codex
    ``[mcp_servers.NAME]`` (its tools approved, since ``codex exec`` never asks, and the
    variables the bridge needs passed through: Codex gives servers almost none),
    ``[features] hooks = true`` and the top-level ``notify`` program in
    ``$CODEX_HOME/config.toml``, and the hooks in ``$CODEX_HOME/hooks.json`` (Codex runs
    hooks only once trusted: review them with ``/hooks``, or pass
    ``--dangerously-bypass-hook-trust`` to ``codex exec``).

A setting of the user's that would have to be overwritten (another ``notify`` program, a
different server under our name, hooks switched off) stops the write with the reason.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

AGENTS = ("claude-code", "codex", "pi")
SCOPES = ("user", "project", "local")
HOOK_EVENTS = ("UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop")
"""Hooks both agents get; PreToolUse and PostToolUse match every tool."""
TOOL_EVENTS = frozenset({"PreToolUse", "PostToolUse"})
CODEX_ENV_VARS = (
    "XDG_RUNTIME_DIR",
    "XDG_CONFIG_HOME",
    "MAGI_MELCHIOR_PROJECT",
    "MAGI_MELCHIOR_ID",
    "MAGI_MELCHIOR_PARENT",
    "MAGI_MELCHIOR_TOKEN",
    "MAGI_MELCHIOR_CHAIN",
    "MELLAN_TOKEN",
    "MELLAN_RELAY",
)
"""What Codex must pass its MCP server: it starts servers with a few variables only (PATH,
HOME, …), and without these the bridge would bind its socket in another directory than
its hooks look in, forget a forked child's identity, and lose the relay credential."""


class IntegrateError(Exception):
    """The configuration cannot be written as asked; the message says what to do."""


class Plan(NamedTuple):
    """What integrating one agent takes: files to write, commands to run, what to print."""

    files: tuple[tuple[Path, str], ...]
    commands: tuple[tuple[str, ...], ...]
    shown: str
    notes: tuple[str, ...] = ()


def melchior_command() -> list[str]:
    """How the agent should run melchior: the installed script beside this Python, by
    absolute path (agents start servers and hooks without the user's shell PATH)."""
    script = Path(sys.executable).parent / "melchior"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    found = shutil.which("melchior")
    if found:
        return [str(Path(found).resolve())]
    return [sys.executable, "-m", "melchior.cli"]


def _shell(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


# -- hooks (both agents read the same JSON shape) -----------------------------------------------


def hook_commands(base: Sequence[str], agent: str, server: str) -> dict[str, str]:
    flags = ["--agent=codex"] if agent == "codex" else []
    if server != "melchior":
        flags.append(f"--server={server}")
    return {e: _shell([*base, "hook", e, *flags]) for e in HOOK_EVENTS}


def hook_settings(commands: Mapping[str, str]) -> dict[str, Any]:
    hooks: dict[str, Any] = {}
    for event, command in commands.items():
        entry: dict[str, Any] = {"hooks": [{"type": "command", "command": command}]}
        if event in TOOL_EVENTS:
            entry = {"matcher": "*", **entry}
        hooks[event] = [entry]
    return {"hooks": hooks}


def _ours(command: Any, base: Sequence[str]) -> bool:
    """A hook command this tool wrote (now or before, from this installation or another)."""
    if not isinstance(command, str):
        return False
    return command.startswith(_shell([*base, "hook"]) + " ") or bool(
        re.search(r"(^|[/\s])melchior(\.cli)?['\"]? hook ", command)
    )


def merge_hooks(
    existing: Mapping[str, Any], ours: Mapping[str, Any], base: Sequence[str]
) -> dict[str, Any]:
    """``existing`` settings with our hook entries replaced and everyone else's kept."""
    merged = json.loads(json.dumps(existing))
    hooks = merged.setdefault("hooks", {})
    if not isinstance(hooks, dict):
        raise IntegrateError("the settings' 'hooks' is not an object; fix it by hand first")
    for event, entries in ours["hooks"].items():
        kept = []
        for entry in hooks.get(event, []) or []:
            if not isinstance(entry, dict):
                kept.append(entry)
                continue
            inner = [h for h in entry.get("hooks", []) if not _ours(h.get("command"), base)]
            if inner:
                kept.append({**entry, "hooks": inner})
            elif not entry.get("hooks"):
                kept.append(entry)
        hooks[event] = [*kept, *entries]
    return dict(merged)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise IntegrateError(
            f"{path} cannot be read as JSON ({exc}); fix or move it first"
        ) from None
    if not isinstance(data, dict):
        raise IntegrateError(f"{path} does not hold a JSON object; fix or move it first")
    return data


# -- Claude Code -----------------------------------------------------------------------------


def claude_settings_path(scope: str, home: Path, cwd: Path) -> Path:
    return {
        "user": home / ".claude" / "settings.json",
        "project": cwd / ".claude" / "settings.json",
        "local": cwd / ".claude" / "settings.local.json",
    }[scope]


def claude_plan(
    *, scope: str, home: Path, cwd: Path, name: str, mcp_args: Sequence[str], base: Sequence[str]
) -> Plan:
    if scope not in SCOPES:
        raise IntegrateError(f"scope is one of {', '.join(SCOPES)}")
    add = ("claude", "mcp", "add", "-s", scope, name, "--", *base, "mcp", *mcp_args)
    settings_path = claude_settings_path(scope, home, cwd)
    ours = hook_settings(hook_commands(base, "claude-code", name))
    merged = merge_hooks(_read_json(settings_path), ours, base)
    where = {"user": "~/.claude.json", "local": "~/.claude.json, for this directory",
             "project": ".mcp.json"}[scope]  # fmt: skip
    shown = (
        f"# Claude Code: the bridge as an MCP server ({scope} scope, written to {where})\n"
        f"{_shell(add)}\n\n"
        f"# the hooks, merged into {settings_path}\n"
        f"{json.dumps(ours, indent=2)}\n"
    )
    return Plan(
        files=((settings_path, json.dumps(merged, indent=2) + "\n"),),
        commands=(("claude", "mcp", "remove", "-s", scope, name), add),
        shown=shown,
    )


# -- Codex --------------------------------------------------------------------------------------

_TABLE = re.compile(r"^\s*\[", re.M)


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a TOML basic string is a JSON string for what we write


def _toml_list(values: Sequence[str]) -> str:
    return "[" + ", ".join(_toml_str(v) for v in values) + "]"


def codex_fragments(
    name: str, base: Sequence[str], mcp_args: Sequence[str]
) -> tuple[str, str, str]:
    """(top-level notify line, the features table, the server table) as TOML text."""
    notify = f"notify = {_toml_list([*base, 'hook', 'notify', '--agent=codex'])}"
    features = "[features]\nhooks = true"
    server = (
        f"[mcp_servers.{name}]\n"
        f"command = {_toml_str(base[0])}\n"
        f"args = {_toml_list([*base[1:], 'mcp', *mcp_args])}\n"
        'default_tools_approval_mode = "approve"\n'
        f"env_vars = {_toml_list(CODEX_ENV_VARS)}"
    )
    return notify, features, server


def merge_codex_config(text: str, name: str, base: Sequence[str], mcp_args: Sequence[str]) -> str:
    """``config.toml`` with our three entries added; refuses to overwrite anyone's."""
    import tomllib

    from melchior import tomlfile

    try:
        data = tomlfile.loads(text, "config.toml")
    except tomlfile.TomlFileError as exc:
        raise IntegrateError(f"{exc}; fix it first") from None
    notify, features, server = codex_fragments(name, base, mcp_args)
    want = tomllib.loads("\n".join((notify, features, server)))
    out = text
    if "notify" in data:
        if data["notify"] != want["notify"]:
            raise IntegrateError(
                f"config.toml already runs another notify program ({data['notify']!r}); Codex "
                f"runs only one, so chain ours from yours: {want['notify']!r}"
            )
    else:
        # A top-level key must come before the first table, or it belongs to that table.
        first = _TABLE.search(out)
        at = first.start() if first else len(out)
        out = out[:at] + notify + "\n" + ("\n" if first else "") + out[at:]
    feats = data.get("features", {})
    if not isinstance(feats, dict):
        raise IntegrateError("config.toml's 'features' is not a table; fix it first")
    if feats.get("hooks") is False:
        raise IntegrateError("config.toml switches hooks off ([features] hooks = false)")
    if "hooks" not in feats:
        header = re.search(r"^\[features\]\s*$", out, re.M)
        if header is not None:
            out = out[: header.end()] + "\nhooks = true" + out[header.end() :]
        elif "features" in data:
            raise IntegrateError("config.toml defines features inline; add hooks = true to it")
        else:
            out = out.rstrip("\n") + "\n\n" + features + "\n"
    servers = data.get("mcp_servers", {})
    if name in servers:
        if servers[name] != want["mcp_servers"][name]:
            raise IntegrateError(
                f"config.toml already has a different [mcp_servers.{name}]; remove it, or "
                "integrate under another --name"
            )
    else:
        out = out.rstrip("\n") + "\n\n" + server + "\n"
    result = tomllib.loads(out)  # what we wrote must read back as what we meant
    assert result["notify"] == want["notify"]
    assert result["features"]["hooks"] is True
    assert result["mcp_servers"][name] == want["mcp_servers"][name]
    return out.lstrip("\n")


def codex_plan(
    *, codex_home: Path, name: str, mcp_args: Sequence[str], base: Sequence[str]
) -> Plan:
    config = codex_home / "config.toml"
    try:
        text = config.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = ""
    except OSError as exc:
        raise IntegrateError(f"cannot read {config}: {exc}") from None
    hooks_path = codex_home / "hooks.json"
    ours = hook_settings(hook_commands(base, "codex", name))
    merged = merge_hooks(_read_json(hooks_path), ours, base)
    notify, features, server = codex_fragments(name, base, mcp_args)
    shown = (
        f"# Codex: add to {config} (notify is a top-level key: keep it above every [table])\n"
        f"{notify}\n\n{features}\n\n{server}\n\n"
        f"# the hooks, merged into {hooks_path}\n"
        f"{json.dumps(ours, indent=2)}\n"
    )
    return Plan(
        files=(
            (config, merge_codex_config(text, name, base, mcp_args)),
            (hooks_path, json.dumps(merged, indent=2) + "\n"),
        ),
        commands=(),
        shown=shown,
        notes=(
            "Codex runs hooks only once they are trusted: start codex and review them with "
            "/hooks, or pass --dangerously-bypass-hook-trust to codex exec.",
        ),
    )


# -- pi ---------------------------------------------------------------------------------------

PI_SCOPES = ("user", "project")
PI_MARK = "melchior's plane tools for pi"
"""A line of the shipped extension: an ``index.ts`` without it is somebody else's."""


def pi_extension() -> str:
    """The extension's source, as shipped in this package."""
    from importlib.resources import files

    return (files("melchior.integrations") / "pi_extension" / "index.ts").read_text("utf-8")


def pi_extensions_dir(scope: str, env: Mapping[str, str], home: Path, cwd: Path) -> Path:
    """Where pi discovers extensions: ``$PI_CODING_AGENT_DIR/extensions`` (default
    ``~/.pi/agent/extensions``) for every project, ``.pi/extensions`` for this one."""
    if scope == "project":
        return cwd / ".pi" / "extensions"
    agent = env.get("PI_CODING_AGENT_DIR")
    return (Path(agent).expanduser() if agent else home / ".pi" / "agent") / "extensions"


def pi_plan(
    *, scope: str, env: Mapping[str, str], home: Path, cwd: Path, name: str, base: Sequence[str]
) -> Plan:
    if scope not in PI_SCOPES:
        raise IntegrateError(f"for pi the scope is one of {', '.join(PI_SCOPES)}")
    folder = pi_extensions_dir(scope, env, home, cwd) / name
    index, config = folder / "index.ts", folder / "melchior.json"
    try:
        present = index.read_text(encoding="utf-8")
    except FileNotFoundError:
        present = None
    except (OSError, UnicodeDecodeError) as exc:
        raise IntegrateError(f"cannot read {index}: {exc}") from None
    if present is not None and PI_MARK not in present:
        raise IntegrateError(
            f"{index} is another extension, not melchior's; move it, or integrate under "
            "another --name"
        )
    source = pi_extension()
    command = json.dumps({"command": list(base)}, indent=2) + "\n"
    shown = (
        f"# pi: the plane's extension (send_to and team), discovered by pi from {folder}\n"
        f"# {index}: the extension shipped with melchior ({len(source.splitlines())} lines)\n"
        f"# {config}: how its tools run melchior\n{command}"
    )
    return Plan(
        files=((index, source), (config, command)),
        commands=(),
        shown=shown,
        notes=(
            'pi offers send_to and team only inside a plane turn (runtime = "pi" in '
            "PLANE.toml); elsewhere the extension registers nothing.",
        ),
    )


def write(plan: Plan) -> list[Path]:
    """Write the plan's files (atomically, private); returns what was written."""
    from melchior.files import atomic_write

    done = []
    for path, text in plan.files:
        try:
            if path.read_text(encoding="utf-8") == text:
                continue
        except (FileNotFoundError, UnicodeDecodeError):
            pass
        atomic_write(path, text.encode("utf-8"), make_parent=True)
        done.append(path)
    return done
