"""Who may see a relay task: one pure rule for every surface, against an oracle."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from melchior.policy.visibility import Parties, Viewer, may_see_task, party_filters

NAMES = st.sampled_from(["a", "b", "c"])
WORKSPACES = st.sampled_from(["w", "v"])


def oracle(v: Viewer, t: Parties, party: str, through: str | None) -> bool:
    if v.workspace != t.workspace or (through is not None and through != t.receiver):
        return False
    if v.owner:
        return True
    as_caller = v.subject == t.caller and party in ("any", "caller")
    as_receiver = v.subject == t.receiver and party in ("any", "receiver")
    return as_caller or as_receiver


@given(
    v=st.builds(Viewer, WORKSPACES, st.booleans(), NAMES),
    t=st.builds(Parties, WORKSPACES, NAMES, NAMES),
    party=st.sampled_from(["any", "caller", "receiver"]),
    through=st.none() | NAMES,
)
def test_visibility_matches_the_oracle_and_names_its_rule(
    v: Viewer, t: Parties, party: str, through: str | None
) -> None:
    d = may_see_task(v, t, party=party, through=through)  # type: ignore[arg-type]
    assert d.allowed == oracle(v, t, party, through)
    assert d.rule
    assert d.reason
    if not d.allowed:
        assert d.rule in ("other-workspace", "other-agent", "not-a-party")


@given(
    v=st.builds(Viewer, st.just("w"), st.just(False), NAMES),
    caller=st.none() | NAMES,
    receiver=st.none() | NAMES,
    rows=st.lists(st.tuples(NAMES, NAMES), max_size=12),
)
def test_an_agents_listing_filters_yield_exactly_its_rows(
    v: Viewer, caller: str | None, receiver: str | None, rows: list[tuple[str, str]]
) -> None:
    """Listing through ``party_filters`` gives the rows an agent is a party to that match
    the requested filter: nothing else, nothing missing."""

    def query(c: str | None, r: str | None) -> set[tuple[str, str]]:
        return {x for x in rows if (c is None or x[0] == c) and (r is None or x[1] == r)}

    got: set[tuple[str, str]] = set()
    for c, r in party_filters(v, caller, receiver):
        got |= query(c, r)
    want = {x for x in query(caller, receiver) if may_see_task(v, Parties("w", x[0], x[1])).allowed}
    assert got == want
