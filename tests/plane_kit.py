"""Planes for tests: a PLANE.toml of stand-in agents, run in-process until quiet."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

from melchior.plane.config import PlaneConfig, load
from melchior.plane.delivery import Event
from melchior.plane.runner import Plane

AGENT = Path(__file__).resolve().parent / "plane_agents" / "agent.py"


def toml_value(value: Any) -> str:
    return json.dumps(value)


def write_plane(
    root: Path,
    agents: Sequence[dict[str, Any]],
    *,
    webhook: dict[str, Any] | None = None,
) -> Path:
    """A PLANE.toml under ``root``; each agent dict gives id and optionally talksTo,
    description, ceiling (turns), cost; the runtime is the stand-in."""
    lines: list[str] = []
    if webhook is not None:
        lines.append("[webhook]")
        lines += [f"{k} = {toml_value(v)}" for k, v in webhook.items()]
        lines.append("")
    for a in agents:
        lines.append("[[agents]]")
        lines.append(f"id = {toml_value(a['id'])}")
        lines.append(f"description = {toml_value(a.get('description', 'a stand-in'))}")
        lines.append(f"talksTo = {toml_value(a.get('talksTo', []))}")
        lines.append('runtime = "command"')
        argv = a.get("argv", [sys.executable, str(AGENT)])
        lines.append(f"options = {{ argv = {toml_value(argv)} }}")
        if "turns" in a:
            lines.append(f"ceiling = {{ turns = {a['turns']} }}")
        lines.append("")
    path = root / "PLANE.toml"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


class Watch:
    """Everything the plane emitted, for assertions."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def __call__(self, event: Event) -> None:
        self.events.append(event)

    def of(self, agent: str, kind: str | None = None) -> list[Event]:
        return [e for e in self.events if e.agent == agent and (kind is None or e.kind == kind)]

    def questions(self, agent: str) -> list[Event]:
        return self.of(agent, "question")


@contextlib.asynccontextmanager
async def running(config: PlaneConfig) -> AsyncIterator[tuple[Plane, Watch]]:
    """A plane running in this loop; stopped (and its state closed) on exit."""
    plane = Plane(config)
    watch = Watch()
    plane.listeners.append(watch)
    task = asyncio.create_task(plane.run())
    try:
        yield plane, watch
    finally:
        plane.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        plane.state.close()


async def settle(plane: Plane, timeout: float = 60.0) -> None:  # noqa: ASYNC109 (a hang guard)
    """Wait until no turn runs or is queued (a hang guard, not a threshold)."""
    await asyncio.wait_for(plane.quiet(), timeout)


def turns(config: PlaneConfig, agent: str) -> list[dict[str, Any]]:
    """What the stand-in ``agent`` recorded, one entry per turn."""
    path = config.by_id[agent].workspace / "turns.ndjson"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def log(plane: Plane, kind: str | None = None) -> list[dict[str, Any]]:
    return [e for e in plane.state.entries() if kind is None or e["kind"] == kind]


def run(coro_fn: Callable[[], Any]) -> Any:
    return asyncio.run(coro_fn())


def load_plane(path: Path) -> PlaneConfig:
    return load(path)
