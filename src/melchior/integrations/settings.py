"""The bridge's settings: the per-turn quota and the taint window, from the operator only.

They are read from the user's melchior config (``$XDG_CONFIG_HOME/melchior/config.toml``,
the file ``melchior.talk`` lives in) and from ``melchior mcp``'s own flags, never from
the working tree or from anything a peer can write: an agent that could edit its own
quota or taint patterns by writing a file in its project would not be bounded by them::

    [melchior.mcp]
    sends_per_turn = 3                 # messages a turn may send (0: none)
    taint_calls = 10                   # calls one window asks about before it stops the turn
    harmless_patterns = ["Bash(make test)", "mcp__github__get_*"]   # also run unasked
    risky_patterns = ["Bash(make deploy*)"]                         # asked even if harmless

    [melchior.project.demo.mcp]        # one project; wins over the table above
    taint_calls = 10

A value that cannot be one (a negative count, an unknown class, a malformed pattern) is
an error that stops the bridge, not a default: a typo must not quietly switch a guard off.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from melchior.configfile import ConfigError, config_path
from melchior.integrations.taint import MAX_TAINT_CALLS, TAINT_CALLS
from melchior.policy import taint as taint_policy
from melchior.policy.turn_quota import SENDS_PER_TURN, check_limit


class Settings(NamedTuple):
    sends_per_turn: int = SENDS_PER_TURN
    taint_calls: int = TAINT_CALLS
    rules: taint_policy.Rules = taint_policy.Rules()
    channel: bool = False


KEYS = ("sends_per_turn", "taint_calls", "risky_patterns", "harmless_patterns")
REMOVED = {
    "risky": "'risky' (the classes of call asked about) is gone: after peer text every call "
    "not known to be harmless is asked about; list what may run unasked in harmless_patterns",
}
"""Keys that meant something once: refused with what to write instead."""


def _table(data: Mapping[str, Any], project: str, where: str) -> dict[str, Any]:
    """``[melchior.mcp]`` with ``[melchior.project.<project>.mcp]`` over it."""
    section = data.get("melchior", {})
    projects = section.get("project", {}) if isinstance(section, dict) else None
    own = projects.get(project, {}) if isinstance(projects, dict) else None
    if not isinstance(section, dict) or not isinstance(projects, dict) or not isinstance(own, dict):
        raise ConfigError(f"{where}: 'melchior' and 'melchior.project.{project}' must be tables")
    merged: dict[str, Any] = {}
    for name, table in (
        ("melchior.mcp", section.get("mcp", {})),
        (f"melchior.project.{project}.mcp", own.get("mcp", {})),
    ):
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: '{name}' must be a table")
        for key in sorted(set(table) & set(REMOVED)):
            raise ConfigError(f"{where}: [{name}] {REMOVED[key]}")
        unknown = sorted(set(table) - set(KEYS))
        if unknown:
            raise ConfigError(
                f"{where}: unknown key(s) {', '.join(unknown)} in [{name}]; the keys are "
                f"{', '.join(KEYS)}"
            )
        merged.update(table)
    return merged


def parse(
    text: str,
    project: str,
    *,
    where: str = "config",
    sends_per_turn: int | None = None,
    taint_calls: int | None = None,
    patterns: Sequence[str] = (),
    harmless: Sequence[str] = (),
    channel: bool = False,
) -> Settings:
    """Settings from a config file's text, then the command line's flags on top."""
    from melchior import tomlfile

    try:
        data = tomlfile.loads(text, where) if text else {}
    except tomlfile.TomlFileError as exc:
        raise ConfigError(str(exc)) from None
    table = _table(data, project, where)
    try:
        sends = check_limit(
            sends_per_turn
            if sends_per_turn is not None
            else table.get("sends_per_turn", SENDS_PER_TURN)
        )
        calls = taint_calls if taint_calls is not None else table.get("taint_calls", TAINT_CALLS)
        if (
            isinstance(calls, bool)
            or not isinstance(calls, int)
            or not 0 <= calls <= MAX_TAINT_CALLS
        ):
            raise ValueError(
                f"taint_calls must be a whole number from 0 to {MAX_TAINT_CALLS}, got {calls!r}"
            )
        risky = table.get("risky_patterns", [])
        known = table.get("harmless_patterns", [])
        if not isinstance(risky, list) or not isinstance(known, list):
            raise ValueError("risky_patterns and harmless_patterns are lists of strings")
        rules = taint_policy.rules([*risky, *patterns], [*known, *harmless])
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return Settings(sends, calls, rules, channel)


def read(
    project: str,
    env: Mapping[str, str],
    *,
    sends_per_turn: int | None = None,
    taint_calls: int | None = None,
    patterns: Sequence[str] = (),
    harmless: Sequence[str] = (),
    channel: bool = False,
) -> Settings:
    path = config_path(env)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = ""
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    return parse(
        text,
        project,
        where=str(path),
        sends_per_turn=sends_per_turn,
        taint_calls=taint_calls,
        patterns=patterns,
        harmless=harmless,
        channel=channel,
    )
