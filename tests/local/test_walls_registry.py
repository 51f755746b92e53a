"""The walls as the registry feeds them: notes on disk, sockets in a directory."""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from melchior import names
from melchior.policy.walls import TALK_VALUES, between
from melchior.session.registry import Registry


@st.composite
def layouts(draw: st.DrawFn) -> list[tuple[str | None, str, bool]]:
    """(parent index, role, alive) per session; dead ones keep only their notes."""
    n = draw(st.integers(min_value=2, max_value=9))
    out: list[tuple[str | None, str, bool]] = []
    for i in range(n):
        parent = draw(st.one_of(st.none(), st.integers(0, i - 1))) if i else None
        role = "main" if parent is None else draw(st.sampled_from(("main", "sub")))
        out.append((None if parent is None else str(parent), role, draw(st.booleans())))
    return out


@settings(max_examples=40, deadline=None)
@given(layouts(), st.data())
def test_a_pairs_ancestries_decide_like_the_whole_tree(
    layout: list[tuple[str | None, str, bool]], data: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        reg = Registry(Path(tmp), "demo")
        ids = [names.choose_id(set()) + f"-{names.GREEK[i]}" for i in range(len(layout))]
        socks = []
        try:
            for sid, (parent, role, alive) in zip(ids, layout, strict=True):
                if parent is not None:
                    reg.write_notes(sid, ids[int(parent)], "main" if role == "main" else "sub")
                if alive:
                    s = socket.socket(socket.AF_UNIX)
                    s.bind(os.fspath(reg.path(sid)))
                    socks.append(s)
            listed = reg.listed()
            if not listed:
                return
            full = reg.tree()
            assert set(listed) <= set(full)
            a = full[data.draw(st.sampled_from(listed))]
            b = full[data.draw(st.sampled_from(listed))]
            part = reg.ancestry_tree(reg.session(a.id), reg.session(b.id))
            for talk in TALK_VALUES:
                assert between(a, b, part, talk) == between(a, b, full, talk)
        finally:
            for s in socks:
                s.close()
