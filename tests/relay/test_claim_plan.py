"""The claim's plan on PostgreSQL at depth: the partial index ``task_ready``, whatever
the retained history.

A claim wants the oldest few *queued* rows of one receiver. Walking ``task_pkey``
(``seq`` order) with a filter finds the same rows but first reads every finished row
ahead of the queue head — retained history the claim pays for on every call. The plan
is read with ``EXPLAIN`` (``auto_explain`` on the statement exactly as the store sends
it, parameters and all) on a database seeded with finished history ahead of a queue,
with fresh statistics; once with a custom plan and once with the generic plan a
prepared statement falls back to after five executions."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.rows import dict_row

from melchior.mellan.relay.store import open_store
from melchior.mellan.relay.store.postgres import _Tx
from storekit import RECEIVER, WS, new_task, seed

pytestmark = pytest.mark.postgres

HISTORY, QUEUED = 50_000, 2_000


def _copies(conn: psycopg.Connection[dict[str, object]], n: int, state: str) -> None:
    """``n`` copies of the first task in ``state`` (fresh ids, no dedupe key)."""
    cols = [
        str(r["column_name"])
        for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'task'"
            " AND column_name <> 'seq' ORDER BY ordinal_position"
        )
    ]
    picked = {
        "id": "md5(random()::text || g::text)",
        "state": f"'{state}'",
        "message_id": "NULL",
        "finished_at": "now()" if state != "queued" else "NULL",
    }
    select = ", ".join(picked.get(c, f"t.{c}") for c in cols)
    conn.execute(
        f"INSERT INTO task ({', '.join(cols)}) SELECT {select}"
        " FROM (SELECT * FROM task ORDER BY seq LIMIT 1) t, generate_series(1, %s) g",
        (n,),
    )


@pytest.fixture(name="deep")
def deep_fixture(pg_url: str) -> str:
    """Finished history first (low seqs), then the queue; statistics up to date."""
    store = open_store(pg_url)
    seed(store)
    store.enqueue(new_task())
    store.close()
    with psycopg.connect(pg_url, autocommit=True, row_factory=dict_row) as conn:
        _copies(conn, HISTORY, "succeeded")
        _copies(conn, QUEUED, "queued")
        conn.execute("ANALYZE task")
    return pg_url


def _claim_plan(url: str, mode: str, limit: int) -> str:
    notices: list[str] = []
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        conn.execute("LOAD 'auto_explain'")
        for setting, value in (
            ("auto_explain.log_min_duration", "0"),
            ("auto_explain.log_level", "notice"),
            ("plan_cache_mode", mode),
        ):
            conn.execute("SELECT set_config(%s, %s, false)", (setting, value))
        with conn.transaction(force_rollback=True), conn.cursor() as cur:
            leases = _Tx(cur).claim(WS, RECEIVER, "plan-test", limit, 30_000)
    assert len(leases) == limit
    plans = [n for n in notices if "WITH cand AS" in n]
    assert len(plans) == 1, notices
    return plans[0]


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
@pytest.mark.parametrize("limit", [1, 50])
def test_claim_reads_the_ready_index_at_depth(deep: str, mode: str, limit: int) -> None:
    plan = _claim_plan(deep, mode, limit)
    candidates = plan.split("CTE cand", 1)[1].split("->  Nested Loop", 1)[0]
    assert "using task_ready on task" in candidates, plan
    assert "task_pkey" not in candidates, plan
