"""``PLANE.toml``: the team, each agent's runtime, workspace and ceiling. Strict.

A typo in a plane's configuration would run an agent with doors or ceilings nobody
chose, so every table refuses keys it does not know, naming the key and where it is,
and every runtime's options are checked by its adapter when the file is read rather
than on the first turn::

    [plane]
    state = ".plane/state.db"        # default, relative to this file
    workspaces = "agents"            # each agent's default workspace is agents/ID

    [webhook]                        # optional: lines from outside, at stranger trust
    listen = "127.0.0.1"             # loopback only
    port = 8790                      # the default; 0: any free port (printed at start)
    token_env = "PLANE_WEBHOOK_TOKEN"

    [[agents]]
    id = "planner"
    description = "plans the work"
    talksTo = ["ledger"]
    runtime = "command"              # command | claude-code | codex | pi | a2a | provider
    options = { argv = ["python3", "/srv/agents/planner.py"] }
    ceiling = { turns = 50, cost_usd = 2.0 }
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from melchior import tomlfile
from melchior.policy.doors import is_agent_id
from melchior.policy.outbound import loopback

TOP_KEYS = ("plane", "webhook", "agents")
PLANE_KEYS = ("state", "workspaces")
WEBHOOK_KEYS = ("listen", "port", "token_env")
WEBHOOK_PORT = 8790
"""The webhook's default port: not the relay's 8787, so a plane and a relay on one
machine do not fight over it out of the box."""
AGENT_KEYS = ("id", "description", "talksTo", "runtime", "options", "workspace", "ceiling")
CEILING_KEYS = ("turns", "cost_usd")
MAX_AGENTS = 64
MAX_DESCRIPTION = 2000
DEFAULT_TURNS = 100


class PlaneConfigError(ValueError):
    """The plane's configuration is wrong; the message names the key and the file."""


@dataclass(frozen=True)
class Ceiling:
    """What an agent may spend: turns, and cost where its runtime reports one."""

    turns: int = DEFAULT_TURNS
    cost_usd: float | None = None

    def describe(self, turns: int, cost: float) -> str:
        text = f"{turns}/{self.turns} turns"
        if self.cost_usd is not None:
            text += f", ${cost:.2f}/${self.cost_usd:.2f}"
        return text

    def reached(self, turns: int, cost: float) -> str | None:
        """Why no further turn may start, or None while there is room."""
        if turns >= self.turns:
            return f"it has taken {turns} of its {self.turns} turns"
        if self.cost_usd is not None and cost >= self.cost_usd:
            return f"it has spent ${cost:.2f} of its ${self.cost_usd:.2f}"
        return None


@dataclass(frozen=True)
class AgentConfig:
    id: str
    description: str
    talks_to: tuple[str, ...]
    runtime: str
    options: Mapping[str, Any]
    workspace: Path
    ceiling: Ceiling


@dataclass(frozen=True)
class WebhookConfig:
    listen: str = "127.0.0.1"
    port: int = 0
    token_env: str = "PLANE_WEBHOOK_TOKEN"


@dataclass(frozen=True)
class PlaneConfig:
    path: Path
    state: Path
    agents: tuple[AgentConfig, ...]
    webhook: WebhookConfig | None = None
    by_id: Mapping[str, AgentConfig] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_id", {a.id: a for a in self.agents})

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(a.id for a in self.agents)


def _where(path: Path, place: str) -> str:
    return f"{path}: {place}"


def _strict(table: Any, known: tuple[str, ...], path: Path, place: str) -> Mapping[str, Any]:
    if not isinstance(table, Mapping):
        raise PlaneConfigError(_where(path, f"{place} must be a table"))
    for key in table:
        if key not in known:
            raise PlaneConfigError(
                _where(path, f"unknown key {place}.{key}; the keys there are {', '.join(known)}")
            )
    return table


def _text(value: Any, path: Path, place: str, *, empty: bool = False) -> str:
    if not isinstance(value, str) or (not value and not empty) or "\0" in value:
        raise PlaneConfigError(_where(path, f"{place} must be text"))
    return value


def _dir(value: Any, base: Path, path: Path, place: str) -> Path:
    p = Path(_text(value, path, place)).expanduser()
    return p if p.is_absolute() else base / p


def _ceiling(raw: Any, path: Path, place: str) -> Ceiling:
    if raw is None:
        return Ceiling()
    table = _strict(raw, CEILING_KEYS, path, place)
    turns = table.get("turns", DEFAULT_TURNS)
    if isinstance(turns, bool) or not isinstance(turns, int) or not 1 <= turns <= 1_000_000:
        raise PlaneConfigError(_where(path, f"{place}.turns must be a whole number 1-1000000"))
    cost = table.get("cost_usd")
    if cost is not None and (
        isinstance(cost, bool)
        or not isinstance(cost, int | float)
        or not math.isfinite(cost)
        or cost <= 0
    ):
        raise PlaneConfigError(_where(path, f"{place}.cost_usd must be a positive number"))
    return Ceiling(turns, None if cost is None else float(cost))


def _agent(raw: Any, base: Path, workspaces: Path, path: Path, i: int) -> AgentConfig:
    from melchior.runtimes import RuntimeConfigError, runtime_for

    place = f"agents[{i}]"
    if isinstance(raw, Mapping) and is_agent_id(raw.get("id")):
        place = f"agents[{i}] ({raw['id']})"
    table = _strict(raw, AGENT_KEYS, path, place)
    agent_id = table.get("id")
    if not is_agent_id(agent_id):
        raise PlaneConfigError(
            _where(
                path, f"agents[{i}].id must be a word (letters, digits, '_', '-'; from a letter)"
            )
        )
    assert isinstance(agent_id, str)
    place = f"agents[{i}] ({agent_id})"
    description = _text(table.get("description", ""), path, f"{place}.description", empty=True)
    if len(description) > MAX_DESCRIPTION:
        raise PlaneConfigError(_where(path, f"{place}.description is over {MAX_DESCRIPTION} chars"))
    talks = table.get("talksTo", [])
    if not isinstance(talks, list) or not all(isinstance(t, str) for t in talks):
        raise PlaneConfigError(_where(path, f"{place}.talksTo must be a list of agent ids"))
    runtime = _text(table.get("runtime"), path, f"{place}.runtime")
    options = table.get("options", {})
    if not isinstance(options, Mapping):
        raise PlaneConfigError(_where(path, f"{place}.options must be a table"))
    try:
        runtime_for(runtime, options)
    except RuntimeConfigError as exc:
        raise PlaneConfigError(_where(path, f"{place}: {exc}")) from None
    workspace = (
        _dir(table["workspace"], base, path, f"{place}.workspace")
        if "workspace" in table
        else workspaces / agent_id
    )
    return AgentConfig(
        id=agent_id,
        description=description,
        talks_to=tuple(dict.fromkeys(talks)),
        runtime=runtime,
        options=dict(options),
        workspace=workspace,
        ceiling=_ceiling(table.get("ceiling"), path, f"{place}.ceiling"),
    )


def _webhook(raw: Any, path: Path) -> WebhookConfig:
    table = _strict(raw, WEBHOOK_KEYS, path, "webhook")
    listen = _text(table.get("listen", "127.0.0.1"), path, "webhook.listen")
    if not loopback(listen) or listen.startswith("["):  # an address to bind, unbracketed
        raise PlaneConfigError(
            _where(path, "webhook.listen must be a loopback address (127.0.0.1, ::1, localhost)")
        )
    port = table.get("port", WEBHOOK_PORT)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise PlaneConfigError(_where(path, "webhook.port must be a port number (0: any free)"))
    token_env = _text(table.get("token_env", "PLANE_WEBHOOK_TOKEN"), path, "webhook.token_env")
    return WebhookConfig(listen, port, token_env)


def parse(text: str, path: Path) -> PlaneConfig:
    """Read a plane's configuration from ``text`` (the file at ``path``)."""
    try:
        doc = tomlfile.loads(text, str(path))
    except tomlfile.TomlFileError as exc:
        raise PlaneConfigError(str(exc)) from None
    _strict(doc, TOP_KEYS, path, "the file")
    base = path.resolve().parent
    plane = _strict(doc.get("plane", {}), PLANE_KEYS, path, "plane")
    state = _dir(plane.get("state", ".plane/state.db"), base, path, "plane.state")
    workspaces = _dir(plane.get("workspaces", "agents"), base, path, "plane.workspaces")
    raw_agents = doc.get("agents")
    if not isinstance(raw_agents, list) or not raw_agents:
        raise PlaneConfigError(_where(path, "no [[agents]]: a plane needs at least one agent"))
    if len(raw_agents) > MAX_AGENTS:
        raise PlaneConfigError(_where(path, f"at most {MAX_AGENTS} agents"))
    agents = [_agent(a, base, workspaces, path, i) for i, a in enumerate(raw_agents)]
    ids = [a.id for a in agents]
    for a in agents:
        if ids.count(a.id) > 1:
            raise PlaneConfigError(_where(path, f"agent id {a.id!r} is used twice"))
        for t in a.talks_to:
            if t not in ids:
                raise PlaneConfigError(
                    _where(path, f"{a.id}.talksTo names {t!r}, which is not an agent here")
                )
            if t == a.id:
                raise PlaneConfigError(_where(path, f"{a.id}.talksTo names itself"))
    webhook = _webhook(doc["webhook"], path) if "webhook" in doc else None
    return PlaneConfig(path=path.resolve(), state=state, agents=tuple(agents), webhook=webhook)


def load(path: Path) -> PlaneConfig:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PlaneConfigError(f"{path}: cannot be read: {exc}") from None
    return parse(text, path)
