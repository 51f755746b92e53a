"""The plane's pure rules, property-based: doors, the per-turn quota, hops and routing."""

from __future__ import annotations

import string

from hypothesis import assume, given
from hypothesis import strategies as st

from melchior.policy.doors import (
    OPERATOR,
    PEER,
    STRANGER,
    TeamCommand,
    agent_may_change_team,
    door,
    may_write_now,
    mentions,
    operator_changes_team,
    team_command,
)
from melchior.policy.hops import MAX_HOPS, Chain, first_hop
from melchior.policy.quotas import per_turn
from melchior.policy.routing import ANSWER, NOTE, WEBHOOK, Origin, note_chain, route_answer
from melchior.policy.routing import OPERATOR as FROM_OPERATOR

NAME = st.text(string.ascii_lowercase, min_size=1, max_size=6)
NAMES = st.frozensets(NAME, max_size=6)


@given(NAME, NAME, NAMES, NAMES, NAMES)
def test_a_door_is_open_exactly_when_one_of_the_three_ways_opened_it(
    a: str, b: str, talks: frozenset[str], opened: frozenset[str], mentioned: frozenset[str]
) -> None:
    d = door(a, b, talks_to=talks, opened=opened, mentioned=mentioned)
    if a == b:
        assert not d.allowed
        assert d.rule == "self"
    else:
        assert d.allowed == (b in talks | opened | mentioned)
        expected = (
            "talks-to"
            if b in talks
            else "team"
            if b in opened
            else "mention"
            if b in mentioned
            else "no-door"
        )
        assert d.rule == expected
        if not d.allowed:
            assert f"write to {b}? y / n" in d.reason


@given(NAME, NAME, NAMES, NAMES)
def test_doors_are_one_way(a: str, b: str, talks: frozenset[str], opened: frozenset[str]) -> None:
    """Opening a's door to b says nothing about b writing to a."""
    assume(a != b)
    assert door(a, b, talks_to=talks, opened=opened | {b}, mentioned=frozenset()).allowed
    assert not door(b, a, talks_to=frozenset(), opened=frozenset(), mentioned=frozenset()).allowed


@given(st.lists(NAME, max_size=8, unique=True), NAME, NAMES, NAMES, NAMES)
def test_the_roster_lists_whom_an_agent_may_write_to(
    roster: list[str], me: str, talks: frozenset[str], opened: frozenset[str], men: frozenset[str]
) -> None:
    allowed = may_write_now(me, roster, talks_to=talks, opened=opened, mentioned=men)
    assert allowed == [n for n in roster if n != me and n in talks | opened | men]


@given(st.text(max_size=60), st.sampled_from([PEER, STRANGER]), NAMES)
def test_only_operator_lines_mention_or_type_team(
    line: str, trust: str, known: frozenset[str]
) -> None:
    assert mentions(line, known, trust) == frozenset()
    assert team_command(line, trust) is None
    assert mentions("ask @" + "x" + " " + line, {"x"}, trust) == frozenset()
    assert team_command("/team x", trust) is None


@given(st.lists(NAME, min_size=1, max_size=4), st.text(alphabet=" ,.?!", max_size=3))
def test_operator_mentions_find_roster_names_only(named: list[str], sep: str) -> None:
    line = " ".join(f"@{n}{sep}" for n in named) + " @ghost and mail@example.org"
    assert mentions(line, set(named), OPERATOR) == frozenset(named)
    assert "example" not in mentions(line, {"example", *named}, OPERATOR)


def test_team_lines() -> None:
    assert team_command("/team") == TeamCommand("list")
    assert team_command("  /team ledger ") == TeamCommand("open", "ledger")
    assert team_command("/team drop ledger") == TeamCommand("drop", "ledger")
    assert team_command("/teams") is None
    assert team_command("please /team ledger") is None
    assert team_command("/team a b") is None


@given(NAME, st.sampled_from(["open", "drop"]), NAME)
def test_an_agent_reads_the_team_but_is_told_the_operators_line(
    agent: str, action: str, name: str
) -> None:
    cmd = TeamCommand(action, name)
    d = agent_may_change_team(agent, cmd)
    assert not d.allowed
    assert d.rule == "operator-only"
    assert d.reason.endswith(cmd.line())
    assert agent in d.reason
    assert team_command(cmd.line()) == cmd  # the printed line is the one that works
    assert agent_may_change_team(agent, TeamCommand("list")).allowed


def test_operator_team_changes() -> None:
    roster, talks = {"planner", "ledger", "clerk"}, {"clerk"}
    judge = lambda c, opened=frozenset(): operator_changes_team(  # noqa: E731
        "planner", c, roster=roster, talks_to=talks, opened=opened
    )
    assert judge(TeamCommand("open", "ledger")).allowed
    assert judge(TeamCommand("open", "ghost")).rule == "unknown-agent"
    assert judge(TeamCommand("open", "planner")).rule == "self"
    assert judge(TeamCommand("drop", "ledger"), {"ledger"}).allowed
    assert judge(TeamCommand("drop", "ledger")).rule == "no-door"
    assert judge(TeamCommand("drop", "clerk")).rule == "talks-to"


@given(st.lists(NAME, max_size=6), NAME, st.integers(0, 6))
def test_three_a_turn_and_once_each(sent: list[str], to: str, limit: int) -> None:
    d = per_turn(sent, to, limit)
    if to in sent:
        assert d.rule == "once-each"
        assert not d.allowed
        assert "put all of it in one" in d.reason
    elif len(sent) >= limit:
        assert d.rule == "per-turn"
        assert not d.allowed
    else:
        assert d.allowed


@given(st.lists(NAME, max_size=12))
def test_a_turn_never_sends_more_than_three_or_twice_to_one(tries: list[str]) -> None:
    sent: list[str] = []
    for to in tries:
        if per_turn(sent, to):
            sent.append(to)
    assert len(sent) <= 3
    assert len(set(sent)) == len(sent)
    assert sent == list(dict.fromkeys(tries))[:3]


CHAIN = st.builds(
    Chain, st.text(string.hexdigits, min_size=1, max_size=8), st.integers(1, 8), st.tuples(NAME)
)


@given(NAME, NAME, CHAIN, st.text(max_size=40))
def test_an_answer_goes_back_to_the_notes_sender_one_hop_further(
    sender: str, me: str, chain: Chain, payload: str
) -> None:
    assume(sender != me)
    route, decision = route_answer(Origin(NOTE, sender, chain), me)
    assert route.chain is not None
    assert route.chain.hop == chain.hop + 1
    assert route.chain.chain == chain.chain
    assert route.chain.path[-1] == me
    if chain.hop + 1 <= MAX_HOPS:
        assert decision.allowed
        assert route.to == sender
        assert route.place == "agent"
    else:
        assert not decision.allowed
        assert decision.rule == "hop-limit"
        assert route.to is None


@given(st.sampled_from([FROM_OPERATOR, WEBHOOK, ANSWER]), st.none() | NAME, st.none() | CHAIN, NAME)
def test_answers_to_anything_but_a_note_wake_nobody(
    kind: str, sender: str | None, chain: Chain | None, me: str
) -> None:
    route, decision = route_answer(Origin(kind, sender, chain), me)
    assert decision.allowed
    assert route.to is None
    assert route.place == kind


@given(NAME, st.lists(NAME, min_size=1, max_size=10))
def test_a_chain_through_any_agents_is_bounded(start: str, agents: list[str]) -> None:
    """Operator line → note (hop 1) → each next note one further: the fifth is refused."""
    origin = Origin(FROM_OPERATOR)
    sender = start
    hops = []
    for nxt in agents * 3:
        chain = note_chain(origin, sender)
        hops.append(chain.hop)
        if chain.hop > MAX_HOPS:
            break
        origin, sender = Origin(NOTE, sender, chain), nxt
    assert hops[0] == 1
    assert hops == list(range(1, len(hops) + 1))
    assert max(hops) <= MAX_HOPS + 1
    # the next operator line starts again at 1
    assert note_chain(Origin(FROM_OPERATOR, None, first_hop("x")), start).hop == 1
