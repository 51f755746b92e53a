"""What a session answers over its socket, as data.

One table serves three readers: ``serve`` dispatches on it, ``melchior verbs`` prints
it, and the ``verbs`` call returns it, so the three cannot disagree.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Verb:
    name: str
    args: tuple[str, ...]
    summary: str
    anonymous: bool
    """May a caller without ``from`` (an operator's script) use it?"""

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["args"] = list(self.args)
        return d


VERBS: tuple[Verb, ...] = (
    Verb("status", (), "who this session is and what it is doing", True),
    Verb(
        "tell",
        ("text", "sort?"),
        "hand a message to this session's harness; sort 'attention' (default) or 'note'; "
        "an optional top-level 'chain' object carries the hop count",
        True,
    ),
    Verb("ask", ("text",), "ask a question; the result's 'about' is the handle to answer", False),
    Verb("answer", ("about", "text"), "answer a question this session asked you", False),
    Verb(
        "task",
        ("about",),
        "what this session knows of a question: pending, or answered with the answer",
        False,
    ),
    Verb("report", ("revision", "sha256"), "a child says it stored a new report", False),
    Verb("end", ("token",), "end this session; only the holder of its fork token may", True),
    Verb("verbs", (), "this list", True),
)

BY_NAME: dict[str, Verb] = {v.name: v for v in VERBS}
