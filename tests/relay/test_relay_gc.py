"""The relay's garbage-collection policy (``melchior.mellan.relay.server.gcpolicy``): a
real relay freezes what its start-up made, takes its young threshold from the one
settings table, and reports every collector pass in ``mellan_gc_pause_seconds``; in a
process that goes on, the policy is put back when serving ends."""

from __future__ import annotations

import gc
import subprocess
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from melchior.mellan.relay.metrics import Gauges, Metrics
from melchior.mellan.relay.server import gcpolicy
from relay_proc import MELLAN, RelayProc, relay_env, start_relay


def passes(relay: RelayProc) -> dict[str, float]:
    """Collector passes so far, by generation, as /metrics reports them."""
    r = httpx.get(f"{relay.url}/metrics", headers={"authorization": f"Bearer {relay.owner_token}"})
    assert r.status_code == 200, r.text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(r.text):
        if family.name == "mellan_gc_pause_seconds":
            for sample in family.samples:
                if sample.name.endswith("_count"):
                    out[sample.labels["generation"]] = sample.value
    return out


def said(relay: RelayProc, what: str) -> str:
    for _ in range(200):  # the drain thread reads the rest of the start-up lines
        line = next((ln for ln in relay.lines if what in ln), None)
        if line is not None:
            return line
        time.sleep(0.05)
    raise AssertionError(f"the relay never said {what!r}: {relay.lines}")


def test_the_young_threshold_is_the_setting_and_every_pass_is_counted(tmp_path: Path) -> None:
    """The same traffic to a relay at Python's own threshold and to one at the relay's:
    the first makes many more young passes, and both count theirs by generation."""
    counts = {}
    for threshold in (gcpolicy.PYTHON_YOUNG, gcpolicy.YOUNG):
        home = tmp_path / str(threshold)
        home.mkdir()
        args = () if threshold == gcpolicy.YOUNG else ("--gc-threshold", str(threshold))
        relay = start_relay(f"sqlite://{home / 'relay.db'}", home, *args)
        try:
            line = said(relay, "garbage collection:")
            assert f"a young pass every {threshold} allocations" in line
            frozen = int(line.split("garbage collection: ", 1)[1].split()[0])
            assert frozen > 1000  # the modules, the app: start-up's objects
            with httpx.Client(base_url=relay.url) as c:
                for _ in range(300):
                    assert c.get("/healthz").status_code == 200
            counts[threshold] = passes(relay)
        finally:
            assert relay.stop() == 0
    assert set(counts[gcpolicy.PYTHON_YOUNG]) == {"0", "1", "2"}
    assert counts[gcpolicy.PYTHON_YOUNG]["0"] > counts[gcpolicy.YOUNG]["0"]


def test_a_threshold_below_one_is_refused_with_the_setting_named(tmp_path: Path) -> None:
    done = subprocess.run(
        [MELLAN, "relay", "--database", f"sqlite://{tmp_path / 'r.db'}", "--gc-threshold", "0"],
        capture_output=True, text=True, env=relay_env(tmp_path), timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "gc_threshold" in done.stderr or "gc-threshold" in done.stderr, done.stderr


def test_the_policy_holds_while_serving_and_is_put_back_after() -> None:
    before = gc.get_threshold()
    metrics = Metrics()
    with gcpolicy.applied(1234, metrics.gc_pauses.callback) as frozen:
        assert frozen > 1000
        assert gc.get_freeze_count() > 1000
        assert gc.get_threshold() == (1234, *before[1:])
        assert metrics.gc_pauses.callback in gc.callbacks
        gc.collect(1)
        rendered = metrics.render(Gauges({}, {}, {}))
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
    assert metrics.gc_pauses.callback not in gc.callbacks
    counted = {
        s.labels["generation"]: s.value
        for f in text_string_to_metric_families(rendered)
        if f.name == "mellan_gc_pause_seconds"
        for s in f.samples
        if s.name.endswith("_count")
    }
    assert counted["1"] >= 1
