"""Pictures, drawn on the server as SVG: the network of agents and grants, and task
activity over time. No charting library and no script: each picture is a string of
SVG built from store values (every text escaped), styled by class names from the
dashboard's stylesheet, with a title and a description in words for screen readers.

The network: agents on a circle, one arrow per (caller, receiver) pair with active
grants, pointing from the agent that asks to the agent that does the work, labelled
with the capabilities granted. A pair granted both ways gets two separate arrows,
drawn apart, so a direction is never implied that was not granted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from markupsafe import Markup, escape

from melchior.mellan.relay.store.base import Activity, Agent, Grant

CHAR_W = 7.4  # average width of a 13px label character, for sizing boxes
NODE_H = 30.0
PAD = 18.0


@dataclass(frozen=True)
class Node:
    id: str
    x: float
    y: float
    w: float
    h: float = NODE_H

    def edge_point(self, toward_x: float, toward_y: float) -> tuple[float, float]:
        """Where the line from this box's centre toward a point leaves the box."""
        dx, dy = toward_x - self.x, toward_y - self.y
        if dx == 0 and dy == 0:
            return self.x, self.y
        scale = min(
            (self.w / 2 + 4) / abs(dx) if dx else math.inf,
            (self.h / 2 + 4) / abs(dy) if dy else math.inf,
        )
        return self.x + dx * scale, self.y + dy * scale


@dataclass(frozen=True)
class Arrow:
    caller: str
    receiver: str
    capabilities: tuple[str, ...]


def _f(v: float) -> str:
    return f"{v:.1f}"


def arrows(grants: Iterable[Grant]) -> list[Arrow]:
    """One arrow per (caller, receiver) with active grants, its capabilities merged."""
    merged: dict[tuple[str, str], dict[str, None]] = {}
    for g in grants:
        if g.revoked_at is not None:
            continue
        merged.setdefault((g.caller, g.receiver), {}).update(dict.fromkeys(g.capabilities))
    return [Arrow(c, r, tuple(caps)) for (c, r), caps in sorted(merged.items())]


def layout(agent_ids: Sequence[str], width: float) -> tuple[list[Node], float]:
    """Boxes on a circle (one in the middle, two side by side); the picture's height."""
    n = len(agent_ids)
    sizes = [min(len(a) * CHAR_W + 2 * 12, 220.0) for a in agent_ids]
    if n == 0:
        return [], 120.0
    if n == 1:
        return [Node(agent_ids[0], width / 2, 60, sizes[0])], 120.0
    widest = max(sizes)
    radius_x = max(width / 2 - widest / 2 - PAD, 60.0)
    radius_y = min(max(70.0, n * 22.0), 260.0) if n > 2 else 0.0
    height = 2 * radius_y + NODE_H + 2 * PAD + (40 if n > 2 else 60)
    cx, cy = width / 2, height / 2
    nodes = []
    for i, (agent, w) in enumerate(zip(agent_ids, sizes, strict=True)):
        angle = math.pi + 2 * math.pi * i / n  # first agent on the left, clockwise
        nodes.append(
            Node(agent, cx + radius_x * math.cos(angle), cy + radius_y * math.sin(angle), w)
        )
    return nodes, height


def _label(caps: Sequence[str]) -> str:
    text = ", ".join(caps)
    return text if len(text) <= 48 else text[:45] + "…"


def network(agents: Sequence[Agent], grants: Iterable[Grant], *, width: float = 760) -> Markup:
    """The agents and the directional grants between them, as an inline SVG element."""
    ids = [a.id for a in agents]
    nodes, height = layout(ids, width)
    where = {n.id: n for n in nodes}
    drawn = [a for a in arrows(grants) if a.caller in where and a.receiver in where]
    pairs = {(a.caller, a.receiver) for a in drawn}
    words = [f"{a.caller} may ask {a.receiver} for {', '.join(a.capabilities)}" for a in drawn] or [
        "no grants: no agent may ask another for anything"
    ]
    out = [
        f'<svg class="network" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_f(width)} '
        f'{_f(height)}" role="img" aria-labelledby="net-title net-desc">',
        '<title id="net-title">Agents and the grants between them</title>',
        f'<desc id="net-desc">{escape("; ".join(words))}. Each arrow points from the agent '
        "that asks to the agent that does the work.</desc>",
        "<defs>",
        '<marker id="arrowhead" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="9" '
        'markerHeight="9" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'class="arrowhead"/></marker>',
        "</defs>",
    ]
    for a in drawn:
        src, dst = where[a.caller], where[a.receiver]
        dx, dy = dst.x - src.x, dst.y - src.y
        length = math.hypot(dx, dy) or 1.0
        # a pair granted both ways: each arrow moves to its own side of the centre line
        shift = 9.0 if (a.receiver, a.caller) in pairs else 0.0
        nx, ny = -dy / length * shift, dx / length * shift
        x1, y1 = src.edge_point(dst.x + nx, dst.y + ny)
        x2, y2 = dst.edge_point(src.x + nx, src.y + ny)
        x1, y1, x2, y2 = x1 + nx, y1 + ny, x2 + nx, y2 + ny
        # the label sits past the middle, nearer the receiver, off the arrow on its own side
        # (anchored away from the line, so a long label never covers it)
        lx, ly = x1 + (x2 - x1) * 0.6, y1 + (y2 - y1) * 0.6
        side = 1.0 if shift else -1.0
        px, py = -dy / length * side, dx / length * side
        anchor = "start" if px > 0.5 else "end" if px < -0.5 else "middle"
        lx, ly = lx + px * 8, ly + py * (8 if anchor != "middle" else 14)
        said = f"{a.caller} may ask {a.receiver} for {', '.join(a.capabilities)}"
        out.append(
            f'<g class="grant" data-caller="{escape(a.caller)}" '
            f'data-receiver="{escape(a.receiver)}"><title>{escape(said)}</title>'
            f'<line x1="{_f(x1)}" y1="{_f(y1)}" x2="{_f(x2)}" y2="{_f(y2)}" '
            'class="grant-line" marker-end="url(#arrowhead)"/>'
            f'<text x="{_f(lx)}" y="{_f(ly)}" class="grant-label" text-anchor="{anchor}" '
            f'dominant-baseline="middle">{escape(_label(a.capabilities))}</text></g>'
        )
    for n in nodes:
        out.append(
            f'<g class="agent" data-agent="{escape(n.id)}"><title>{escape(n.id)}</title>'
            f'<rect x="{_f(n.x - n.w / 2)}" y="{_f(n.y - n.h / 2)}" width="{_f(n.w)}" '
            f'height="{_f(n.h)}" rx="6" class="agent-box"/>'
            f'<text x="{_f(n.x)}" y="{_f(n.y)}" class="agent-label" text-anchor="middle" '
            f'dominant-baseline="central">{escape(n.id)}</text></g>'
        )
    out.append("</svg>")
    return Markup("".join(out))


# -- task activity over time ---------------------------------------------------------------------

SERIES = (
    ("succeeded", "completed"),
    ("input_required", "input asked"),
    ("failed", "failed"),
    ("cancelled", "canceled"),
)


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def _tick(moment: datetime, bucket_seconds: int) -> str:
    return moment.strftime("%H:%M" if bucket_seconds < 3 * 3600 else "%d %b %H:%M")


def _axis(act: Activity, x0: float, plot_w: float, y: float) -> list[str]:
    n = len(act.accepted)
    start = _instant(act.start)
    out = []
    for k in sorted({0, n // 2, n}):
        moment = start + timedelta(seconds=act.bucket_seconds * k)
        x = x0 + plot_w * k / n
        anchor = "start" if k == 0 else "end" if k == n else "middle"
        out.append(
            f'<text x="{_f(x)}" y="{_f(y)}" class="axis" text-anchor="{anchor}">'
            f"{escape(_tick(moment, act.bucket_seconds))}</text>"
        )
    return out


def throughput(act: Activity, *, width: float = 520, height: float = 200) -> Markup:
    """Tasks finished per bucket, stacked by outcome, with tasks accepted as a line."""
    n = len(act.accepted)
    x0, y0, plot_w, plot_h = 40.0, 12.0, width - 52.0, height - 44.0
    finished = [sum(act.finished.get(s, (0,) * n)[k] for s, _ in SERIES) for k in range(n)]
    top = max([*finished, *act.accepted, 1])
    bar = plot_w / max(n, 1)
    totals = {label: sum(act.finished.get(state, ())) for state, label in SERIES}
    said = ", ".join(f"{v} {k}" for k, v in totals.items())
    out = [
        f'<svg class="chart throughput" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 '
        f'{_f(width)} {_f(height)}" role="img" aria-labelledby="tp-title tp-desc">',
        '<title id="tp-title">Task throughput</title>',
        f'<desc id="tp-desc">{sum(act.accepted)} accepted and {escape(said)} in the window '
        "shown.</desc>",
        f'<line x1="{_f(x0)}" y1="{_f(y0 + plot_h)}" x2="{_f(x0 + plot_w)}" '
        f'y2="{_f(y0 + plot_h)}" class="baseline"/>',
        f'<text x="{_f(x0 - 6)}" y="{_f(y0 + 4)}" class="axis" text-anchor="end">{top}</text>',
        f'<text x="{_f(x0 - 6)}" y="{_f(y0 + plot_h)}" class="axis" text-anchor="end">0</text>',
    ]
    for k in range(n):
        level = y0 + plot_h
        for state, label in SERIES:
            count = act.finished.get(state, (0,) * n)[k]
            if not count:
                continue
            h = plot_h * count / top
            level -= h
            out.append(
                f'<rect x="{_f(x0 + k * bar + bar * 0.12)}" y="{_f(level)}" '
                f'width="{_f(bar * 0.76)}" height="{_f(h)}" class="bar {state}">'
                f"<title>{count} {label}</title></rect>"
            )
    points = " ".join(
        f"{_f(x0 + (k + 0.5) * bar)},{_f(y0 + plot_h - plot_h * v / top)}"
        for k, v in enumerate(act.accepted)
    )
    out.append(f'<polyline points="{points}" class="accepted-line"/>')
    out += _axis(act, x0, plot_w, height - 10)
    out.append("</svg>")
    return Markup("".join(out))


def depth(act: Activity, *, width: float = 520, height: float = 200) -> Markup:
    """Open tasks (accepted, not finished) at the end of each bucket, as an area."""
    levels = act.depth
    n = len(levels)
    x0, y0, plot_w, plot_h = 40.0, 12.0, width - 52.0, height - 44.0
    top = max([*levels, 1])
    step = plot_w / max(n, 1)
    pts = [(x0 + (k + 1) * step, y0 + plot_h - plot_h * v / top) for k, v in enumerate(levels)]
    line = " ".join(f"{_f(x)},{_f(y)}" for x, y in [(x0, pts[0][1]) if pts else (x0, y0), *pts])
    area = f"{_f(x0)},{_f(y0 + plot_h)} {line} {_f(x0 + plot_w)},{_f(y0 + plot_h)}"
    out = [
        f'<svg class="chart depth" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 '
        f'{_f(width)} {_f(height)}" role="img" aria-labelledby="qd-title qd-desc">',
        '<title id="qd-title">Queue depth</title>',
        f'<desc id="qd-desc">Open tasks (accepted, not finished): {act.open_now} now, at most '
        f"{max(levels, default=0)} in the window shown.</desc>",
        f'<polygon points="{area}" class="depth-area"/>',
        f'<polyline points="{line}" class="depth-line"/>',
        f'<line x1="{_f(x0)}" y1="{_f(y0 + plot_h)}" x2="{_f(x0 + plot_w)}" '
        f'y2="{_f(y0 + plot_h)}" class="baseline"/>',
        f'<text x="{_f(x0 - 6)}" y="{_f(y0 + 4)}" class="axis" text-anchor="end">{top}</text>',
        f'<text x="{_f(x0 - 6)}" y="{_f(y0 + plot_h)}" class="axis" text-anchor="end">0</text>',
    ]
    out += _axis(act, x0, plot_w, height - 10)
    out.append("</svg>")
    return Markup("".join(out))
