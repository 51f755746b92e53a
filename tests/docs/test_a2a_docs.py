"""docs/a2a.md's webhook verification snippets, run as written: both accept what the relay
signs and refuse a changed body, another secret and a stale timestamp."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import pytest

from melchior.mellan.signing import sign
from paths_kit import REPO

DOC = REPO / "docs" / "a2a.md"

Check = Callable[[str, dict[str, str], bytes, float], bool]


def section(title: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def snippets() -> dict[str, Check]:
    blocks = re.findall(r"```python\n(.*?)```", section("Push notifications"), re.S)
    assert len(blocks) == 2, "the section shows the helper and the stdlib-only check"
    found: dict[str, Any] = {}
    for block in blocks:
        namespace: dict[str, Any] = {}
        exec(compile(block, str(DOC), "exec"), namespace)  # the doc's code, as written
        found.update({k: v for k, v in namespace.items() if k.startswith("accept")})
    assert set(found) == {"accept", "accept_stdlib"}
    return found


@pytest.mark.parametrize("name", ["accept", "accept_stdlib"])
def test_the_documented_checks_agree_with_what_the_relay_signs(name: str) -> None:
    check = snippets()[name]
    body = b'{"statusUpdate":{"taskId":"t-1","status":{"state":"TASK_STATE_WORKING"}}}'
    now = time.time()
    headers = {"Content-Type": "application/a2a+json", **sign("mps_secret", body, now)}
    assert check("mps_secret", headers, body, now)
    lowered = {k.lower(): v for k, v in headers.items()}  # header names are case-free
    assert check("mps_secret", lowered, body, now + 10)
    assert not check("mps_secret", headers, body + b" ", now)
    assert not check("another", headers, body, now)
    assert not check("mps_secret", headers, body, now + 301)  # outside the replay window
    assert not check("mps_secret", {"Content-Type": "application/a2a+json"}, body, now)
