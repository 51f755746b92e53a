"""The wall's pure parts: what a route may do with each adapter option, URL prefixes
compared as URLs, and leases read field by field (every function here is pure)."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from melchior.mellan.client.leases import ClaimedTask, MalformedLease, claimed
from melchior.policy import route_options as ro
from melchior.policy.urls import prefix_problem, within
from melchior.runtimes import ADAPTERS, route_rules
from paths_kit import REPO

MODULES = {
    "command": "melchior.runtimes.command",
    "claude-code": "melchior.runtimes.claude_code",
    "codex": "melchior.runtimes.codex",
    "a2a": "melchior.runtimes.a2a",
    "provider": "melchior.runtimes.provider",
    "pi": "melchior.runtimes.pi",
}


@pytest.mark.parametrize("adapter", list(ADAPTERS))
def test_every_option_of_every_adapter_has_a_rule(adapter: str) -> None:
    """An option added without saying what a route may do with it fails here, not in the
    field (an option without a rule would be refused to every route, silently useless)."""
    module = importlib.import_module(MODULES[adapter])
    assert set(route_rules(adapter)) == set(module.OPTIONS)
    for option in route_rules(adapter).values():
        assert option.kind in ro.KINDS


def wanted(key: str, value: Any, **kw: Any) -> ro.Wanted:
    return ro.Wanted("claude-code", "cap", key, value, **kw)


ORDER = ro.ordered(("plan", ("dontAsk", "manual"), "acceptEdits", "auto", "bypassPermissions"),
                   "acceptEdits", bypass=("bypassPermissions",))  # fmt: skip
CASES: list[tuple[ro.RouteOption | None, ro.Wanted, str | None]] = [
    (None, wanted("nope", 1), ro.RULE),
    (ro.free(), wanted("x", "anything"), None),
    (ro.free(ro.MODEL_NAME), wanted("model", "claude-sonnet-4-5"), None),
    (ro.free(ro.MODEL_NAME), wanted("model", "--dangerously-skip-permissions"), ro.RULE),
    (ro.free(ro.MODEL_NAME), wanted("model", "sonnet\n"), ro.RULE),
    (ro.limit(), wanted("max_turns", 10**6), None),
    (ro.limit(), wanted("max_turns", 5, local=10), None),
    (ro.limit(), wanted("max_turns", 11, local=10), ro.RULE),
    (ro.limit(5.0), wanted("grace", 6), ro.RULE),
    (ro.limit(5.0), wanted("grace", 0), None),
    (ro.limit(), wanted("max_turns", "5"), ro.RULE),
    (ro.limit(), wanted("max_turns", True), ro.RULE),
    (ro.limit(), wanted("max_turns", None, local=10), ro.RULE),
    (ro.limit(), wanted("max_turns", None), None),
    (ORDER, wanted("permission_mode", "plan"), None),
    (ORDER, wanted("permission_mode", "manual"), None),
    (ORDER, wanted("permission_mode", "auto"), ro.RULE),
    (ORDER, wanted("permission_mode", "auto", listed=frozenset({ro.canonical("auto")})), None),
    (ORDER, wanted("permission_mode", "acceptEdits", local="plan"), ro.RULE),
    (ORDER, wanted("permission_mode", "dontAsk", local="manual"), None),
    (ORDER, wanted("permission_mode", "bypassPermissions"), ro.BYPASS_RULE),
    (ORDER, wanted("permission_mode", "bypassPermissions", bypass=True), None),
    (ORDER, wanted("permission_mode", "bypassPermissions", local="bypassPermissions"), None),
    (ORDER, wanted("permission_mode", "yolo"), ro.RULE),
    (ORDER, wanted("permission_mode", None), ro.RULE),
    (ro.ordered((True, False), False), wanted("strict", 1), ro.RULE),  # true is not 1
    (ro.ordered((True, False), False), wanted("strict", True), None),
    (ro.ordered((True, False), False), wanted("strict", False, local=True), ro.RULE),
    (ro.adds(ro.TOOL_NAME), wanted("disallowed_tools", ["Bash", "Write"], local=["Bash"]), None),
    (ro.adds(ro.TOOL_NAME), wanted("disallowed_tools", ["Write"], local=["Bash"]), ro.RULE),
    (ro.adds(ro.TOOL_NAME), wanted("disallowed_tools", "Bash"), ro.RULE),
    (ro.adds(ro.TOOL_NAME), wanted("disallowed_tools", ["-x"]), ro.RULE),
    (ro.subset(), wanted("tools", ["read", "bash"]), None),  # none set locally: all are on
    (ro.subset(), wanted("tools", ["read"], local=["read", "grep"]), None),
    (ro.subset(), wanted("tools", ["read", "bash"], local=["read", "grep"]), ro.RULE),
    (ro.subset(), wanted("tools", "read"), ro.RULE),
    (ro.listed(), wanted("settings", "/etc/x.json"), ro.RULE),
    (ro.listed(), wanted("settings", "/etc/x.json", local="/etc/x.json"), None),
    (ro.listed(), wanted("extra_args", ["--verbose"],
                         listed=ro.listed_keys(ro.listed(), [["--verbose"]])), None),
    (ro.listed(), wanted("extra_args", ["--verbose", "--yolo"],
                         listed=ro.listed_keys(ro.listed(), [["--verbose"]])), ro.RULE),
    (ro.listed(items=True), wanted("allowed_tools", ["Read"], listed=frozenset({"Read"})), None),
    (ro.listed(items=True), wanted("allowed_tools", ["Read", "Bash"],
                                   listed=frozenset({"Read"})), ro.RULE),
    (ro.listed(items=True), wanted("allowed_tools", ["Grep"], local=["Grep"]), None),
    (ro.listed(items=True), wanted("config", {"a.b": "c"}, listed=frozenset({"a.b=c"})), None),
    (ro.listed(items=True), wanted("config", {"a.b": "d"}, listed=frozenset({"a.b=c"})), ro.RULE),
    (ro.listed(items=True), wanted("allowed_tools", [1]), ro.RULE),
    (ro.ENV_OPTION, wanted("env", {"A": "b"}), ro.ENV_RULE),
    (ro.ENV_OPTION, wanted("env", {"A": "b"}, route_env=True), None),
]  # fmt: skip


@pytest.mark.parametrize(("option", "w", "rule"), CASES)
def test_each_kind_of_rule(option: ro.RouteOption | None, w: ro.Wanted, rule: str | None) -> None:
    decision = ro.judge(option, w)
    if rule is None:
        assert decision is None
    else:
        assert decision is not None
        assert decision.rule == rule
        assert w.key in decision.reason
        assert "'cap'" in decision.reason


@given(st.lists(st.sampled_from(["Bash", "Read", "Write", "Grep"]), max_size=4),
       st.lists(st.sampled_from(["Bash", "Read", "Write", "Grep"]), max_size=4))  # fmt: skip
def test_a_route_never_drops_a_denied_tool(mine: list[str], theirs: list[str]) -> None:
    refused = ro.judge(ro.adds(ro.TOOL_NAME), wanted("disallowed_tools", theirs, local=mine))
    assert (refused is None) == (set(mine) <= set(theirs))


# -- URL prefixes -----------------------------------------------------------------------------

URLS = [
    ("http://127.0.0.1:19601/card", "http://127.0.0.1:19601", True),
    ("http://127.0.0.1:19601", "http://127.0.0.1:19601/", True),
    ("http://127.0.0.1:196019/", "http://127.0.0.1:19601", False),
    ("http://127.0.0.1:19601.attacker.example/", "http://127.0.0.1:19601", False),
    ("http://127.0.0.1:19601@attacker.example/", "http://127.0.0.1:19601", False),
    ("http://user@127.0.0.1:19601/", "http://127.0.0.1:19601", False),
    ("https://127.0.0.1:19601/", "http://127.0.0.1:19601", False),
    ("http://LOCALHOST:80/v1/x", "http://localhost/v1", True),
    ("http://localhost/v10", "http://localhost/v1", False),
    ("http://localhost/v1", "http://localhost/v1", True),
    ("http://localhost/v1/../admin", "http://localhost/v1", False),  # sent as /admin
    ("http://localhost/v1/./x", "http://localhost/v1", True),  # sent as /v1/x
    ("http://localhost/x", "http://localhost/v1/..", False),  # such a prefix covers nothing
    ("http://localhost/v1/%2e%2e/admin", "http://localhost/v1/", False),
    ("http://localhost/v1/x", "http://localhost/v1/", True),
    ("http://h\\@evil/", "http://h/", False),
    ("http://[::1]:8645/x", "http://[::1]:8645/", True),
    ("http://[::1]:8646/x", "http://[::1]:8645/", False),
    ("http://127.0.0.1:8645/", "127.0.0.1:8645", False),
    ("not a url", "http://h/", False),
]


@pytest.mark.parametrize(("url", "prefix", "inside"), URLS)
def test_urls_are_compared_as_urls(url: str, prefix: str, inside: bool) -> None:
    assert within(url, prefix) is inside


def test_a_prefix_that_covers_nothing_says_why() -> None:
    assert prefix_problem("http://127.0.0.1:8645/") is None
    assert "not an http" in str(prefix_problem("127.0.0.1:8645"))
    assert "user information" in str(prefix_problem("http://u:p@h/"))
    assert "query" in str(prefix_problem("http://h/?a=1"))
    assert "out of range" in str(prefix_problem("http://h:99999/"))


hosts = st.sampled_from(["127.0.0.1", "localhost", "evil.example", "127.0.0.10", "[::1]"])
ports = st.sampled_from(["", ":80", ":8645", ":86450", ":8646"])
paths = st.lists(st.sampled_from(["v1", "v10", "..", ".", "%2e%2e", "a", ""]), max_size=3)


@given(hosts, ports, paths, hosts, ports, paths, st.sampled_from(["", "u@", "a:b@"]))
def test_within_means_same_origin_and_below_the_path(
    h1: str, p1: str, s1: list[str], h2: str, p2: str, s2: list[str], userinfo: str
) -> None:
    url = f"http://{userinfo}{h1}{p1}/" + "/".join(s1)
    prefix = f"http://{h2}{p2}/" + "/".join(s2)
    if not within(url, prefix):
        return
    assert not userinfo
    assert h1 == h2
    assert (p1 or ":80") == (p2 or ":80")
    assert "%2e%2e" not in s1  # sent as written, a server may resolve it: never inside
    assert not {".", "..", "%2e%2e"} & set(s2)  # such a prefix covers nothing
    sent: list[str] = []  # the path as the client sends it: plain dot segments resolved
    for seg in s1:
        if seg == "..":
            sent = sent[:-1]
        elif seg != ".":
            sent.append(seg)
    clean, base = [x for x in sent if x], [x for x in s2 if x]
    assert clean[: len(base)] == base


# -- leases -----------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=20,
)  # fmt: skip
TASK = {"id": "t-1", "caller": "local/codex", "receiver": "private/ops",
        "capability": "incident.inspect", "turn": 1, "attempt": 1, "payload": {}}  # fmt: skip


@given(json_values, st.sampled_from(["task", "route", "history", "epoch", "expires_at", "whole"]))
def test_any_lease_is_read_or_refused_never_raises(junk: Any, where: str) -> None:
    item: Any = {"task": dict(TASK), "epoch": 1, "expires_at": "t", "route": None}
    if where == "whole":
        item = junk
    else:
        item[where] = junk
    got = claimed(item, "private/ops")
    assert isinstance(got, ClaimedTask | MalformedLease)
    if isinstance(got, MalformedLease):
        assert got.reason


def test_a_lease_is_for_this_agent_and_its_route_for_its_capability() -> None:
    base = {"task": dict(TASK), "epoch": 1, "expires_at": "t", "route": None}
    assert isinstance(claimed(base, "private/ops"), ClaimedTask)
    other = claimed(base, "private/elsewhere")
    assert isinstance(other, MalformedLease)
    assert "is not this agent" in other.reason
    route = {"id": "rt_1", "capability": "other", "adapter": "command", "options": {}}
    wrong = claimed({**base, "route": route}, "private/ops")
    assert isinstance(wrong, MalformedLease)
    assert "is not the task's" in wrong.reason
    fine = claimed({**base, "route": {**route, "capability": "incident.inspect",
                                      "options": {"timeout": ro.canonical(1)}}}, None)  # fmt: skip
    assert isinstance(fine, ClaimedTask)
    assert fine.route is not None


def test_the_receiver_docs_table_says_what_the_code_does() -> None:
    """docs/receiver.md "What a route may set" lists every option under its kind."""
    import re

    text = (REPO / "docs" / "receiver.md").read_text()
    section = text.split("### What a route may set", 1)[1].split("\n## ", 1)[0]
    columns = (ro.FREE, ro.LIMIT, ro.ORDERED, ro.ADDS, ro.SUBSET, ro.LISTED)
    plus = {"argv": ro.PROGRAM, "binary": ro.PROGRAM, "add_dirs": ro.DIRS,
            "card_url": ro.URL, "base_url": ro.URL, "env": ro.ENV}  # fmt: skip
    assert all(f"`{name}`" in section.split("Plus, where", 1)[1][:200] for name in plus)
    for adapter in ADAPTERS:
        row = next(line for line in section.splitlines() if line.startswith(f"| `{adapter}` |"))
        cells = [c.strip() for c in row.strip("|").split("|")][1:]
        said = {
            name: kind
            for cell, kind in zip(cells, columns, strict=True)
            for name in re.findall(r"`([a-z_]+)`", cell)
        }
        rules = route_rules(adapter)
        for name, rule in rules.items():
            assert said.get(name, plus.get(name)) == rule.kind, (adapter, name)
        assert set(said) <= set(rules), (adapter, set(said) - set(rules))


@pytest.mark.parametrize("name", ["private/ops\n", "incident.inspect\n", "rt_1\n", "-x", ""])
def test_names_with_a_trailing_newline_or_a_dash_are_no_ids(name: str) -> None:
    """``$`` also matches before a final newline; every id pattern ends with ``\\Z``."""
    from melchior.mellan.ids import AGENT_ID, CAPABILITY_ID, ROUTE_ID, TASK_ID
    from melchior.policy.task_routes import PROFILE, SESSION

    for pattern in (AGENT_ID, CAPABILITY_ID, ROUTE_ID, TASK_ID, PROFILE, SESSION):
        assert pattern.match(name) is None
    assert AGENT_ID.match("private/ops") is not None
