"""``melchior models`` against fake providers on loopback: fresh, cached, stale, refreshed,
failed (the cache is kept), emptied (the cache is replaced), static, misconfigured."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from melchior import cli
from provider_kit import Conn, LoopbackServer, Request

pytestmark = pytest.mark.streaming


class FakeProvider:
    """An OpenAI-style ``/v1/models`` whose answer a test changes between runs."""

    def __init__(self, models: list[str]) -> None:
        self.models = models
        self.status = 200
        self.server = LoopbackServer(routes={"/v1/models": self.handle})

    async def handle(self, request: Request, conn: Conn) -> None:
        if self.status != 200:
            await conn.reply(self.status, b'{"error": "unavailable"}')
            return
        data = [{"id": m, "object": "model", "created": 1700000000} for m in self.models]
        await conn.reply(200, json.dumps({"object": "list", "data": data}).encode())

    @property
    def hits(self) -> int:
        return self.server.hits("/v1/models")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("WORK_KEY", "sk-work-0123456789")
    (tmp_path / "config" / "melchior").mkdir(parents=True)
    return tmp_path


@pytest.fixture
def work() -> Iterator[FakeProvider]:
    fake = FakeProvider(["beta", "alpha"])
    with fake.server:
        yield fake


def configure(home: Path, text: str) -> None:
    (home / "config" / "melchior" / "config.toml").write_text(text)


def provider(name: str, fake: FakeProvider, **extra: str) -> str:
    lines = [f"[providers.{name}]", 'kind = "openai"', f'base_url = "{fake.server.url}/v1"']
    lines += [f"{key} = {value}" for key, value in extra.items()]
    return "\n".join(lines) + "\n"


def models(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any, str]:
    code = cli.main(["models", *args])
    out, err = capsys.readouterr()
    return code, json.loads(out) if "--json" in args else out, err


def ids(reply: dict[str, Any]) -> list[tuple[str, str]]:
    return [(card["provider"], card["id"]) for card in reply["result"]]


def cache_file(home: Path, name: str) -> Path:
    return home / "cache" / "melchior" / "models" / f"{name}.json"


def age_cache(home: Path, name: str, seconds: float) -> None:
    path = cache_file(home, name)
    record = json.loads(path.read_text())
    record["fetched_at"] -= seconds
    path.write_text(json.dumps(record))


def test_fresh_listing_is_fetched_cached_and_replied(
    home: Path, work: FakeProvider, capsys: pytest.CaptureFixture[str]
) -> None:
    configure(home, provider("work", work, api_key_env='"WORK_KEY"'))
    code, reply, err = models(capsys, "--json")
    assert code == 0
    assert err == ""
    assert reply == {
        "ok": True,
        "family": 1,
        "n": 2,
        "result": [
            {
                "provider": "work",
                "id": "alpha",
                "kind": "openai",
                "created": "2023-11-14T22:13:20Z",
            },
            {"provider": "work", "id": "beta", "kind": "openai", "created": "2023-11-14T22:13:20Z"},
        ],
        "refreshed": False,
        "failed": [],
    }
    assert work.server.requests[0].headers["authorization"] == "Bearer sk-work-0123456789"
    record = json.loads(cache_file(home, "work").read_text())
    assert sorted(record["models"], key=lambda c: c["id"]) == reply["result"]
    assert abs(record["fetched_at"] - time.time()) < 600
    assert "sk-work" not in cache_file(home, "work").read_text()
    assert [p.name for p in cache_file(home, "work").parent.iterdir()] == ["work.json"]


def test_a_fresh_cache_is_served_without_asking(
    home: Path, work: FakeProvider, capsys: pytest.CaptureFixture[str]
) -> None:
    configure(home, provider("work", work))
    models(capsys, "--json")
    work.models = ["changed"]
    code, reply, _ = models(capsys, "--json")
    assert code == 0
    assert work.hits == 1
    assert ids(reply) == [("work", "alpha"), ("work", "beta")]
    assert reply["refreshed"] is False


def test_a_cache_older_than_24_hours_is_fetched_again(
    home: Path, work: FakeProvider, capsys: pytest.CaptureFixture[str]
) -> None:
    configure(home, provider("work", work))
    models(capsys, "--json")
    age_cache(home, "work", 23 * 3600)
    models(capsys, "--json")
    assert work.hits == 1
    age_cache(home, "work", 2 * 3600)
    work.models = ["gamma"]
    _, reply, _ = models(capsys, "--json")
    assert work.hits == 2
    assert ids(reply) == [("work", "gamma")]


def test_refresh_bypasses_a_fresh_cache(
    home: Path, work: FakeProvider, capsys: pytest.CaptureFixture[str]
) -> None:
    configure(home, provider("work", work))
    models(capsys, "--json")
    work.models = ["gamma"]
    code, reply, _ = models(capsys, "--refresh", "--json")
    assert code == 0
    assert work.hits == 2
    assert reply["refreshed"] is True
    assert reply["failed"] == []
    assert ids(reply) == [("work", "gamma")]


def test_a_failed_refresh_keeps_the_last_listing(
    home: Path, work: FakeProvider, capsys: pytest.CaptureFixture[str]
) -> None:
    configure(home, provider("work", work))
    models(capsys, "--json")
    before = cache_file(home, "work").read_text()
    work.status = 400  # not retried: one request
    code, reply, err = models(capsys, "--refresh", "--json")
    assert reply["failed"] == ["work"]
    assert reply["refreshed"] is True
    assert ids(reply) == [("work", "alpha"), ("work", "beta")]
    assert cache_file(home, "work").read_text() == before
    assert "HTTP 400" in err
    assert "showing its listing from" in err
    assert "unavailable" not in err
    assert code == 1  # the only provider failed: nothing current to show


def test_an_empty_listing_replaces_the_cache(
    home: Path, work: FakeProvider, capsys: pytest.CaptureFixture[str]
) -> None:
    configure(home, provider("work", work))
    models(capsys, "--json")
    work.models = []
    code, reply, _ = models(capsys, "--refresh", "--json")
    assert code == 0
    assert reply["n"] == 0
    assert reply["result"] == []
    assert reply["failed"] == []
    assert json.loads(cache_file(home, "work").read_text())["models"] == []
    work.models = ["back"]
    _, reply, _ = models(capsys, "--json")  # the empty listing is fresh: served, not refetched
    assert reply["result"] == []
    assert work.hits == 2


def test_one_failure_among_several_providers_is_reported_and_exits_0(
    home: Path, work: FakeProvider, capsys: pytest.CaptureFixture[str]
) -> None:
    down = FakeProvider(["x"])
    down.status = 503
    with down.server:
        configure(
            home,
            provider("work", work)
            + provider("down", down)
            + '[providers.fixed]\nkind = "anthropic"\ndiscover = false\nmodels = ["c-1", "c-2"]\n',
        )
        code, reply, err = models(capsys, "--json")
        assert down.hits == 3  # 503 is retried within the bound
    assert code == 0
    assert reply["failed"] == ["down"]
    assert ids(reply) == [
        ("work", "alpha"),
        ("work", "beta"),
        ("fixed", "c-1"),
        ("fixed", "c-2"),
    ]
    assert "provider 'down'" in err
    assert "nothing cached to show" in err


def test_static_providers_are_never_asked_even_on_refresh(
    home: Path, work: FakeProvider, capsys: pytest.CaptureFixture[str]
) -> None:
    configure(home, provider("work", work, discover="false", models='["pinned"]'))
    code, reply, _ = models(capsys, "--refresh", "--json")
    assert code == 0
    assert work.hits == 0
    assert reply["result"] == [{"provider": "work", "id": "pinned", "kind": "openai"}]


def test_a_missing_key_fails_that_provider_without_a_request(
    home: Path, work: FakeProvider, capsys: pytest.CaptureFixture[str]
) -> None:
    configure(home, provider("work", work, api_key_env='"UNSET_KEY_FOR_TEST"'))
    code, reply, err = models(capsys, "--json")
    assert code == 1
    assert reply["failed"] == ["work"]
    assert work.hits == 0
    assert "$UNSET_KEY_FOR_TEST is not set" in err


def test_a_cache_for_another_endpoint_or_a_corrupt_one_is_not_served(
    home: Path, work: FakeProvider, capsys: pytest.CaptureFixture[str]
) -> None:
    configure(home, provider("work", work))
    models(capsys, "--json")
    configure(home, provider("work", work).replace("/v1", "/v1/"))  # another base_url
    models(capsys, "--json")
    assert work.hits == 2
    cache_file(home, "work").write_text("{not json")
    _, reply, _ = models(capsys, "--json")
    assert work.hits == 3
    assert len(reply["result"]) == 2


def test_a_listing_with_terminal_escapes_is_not_printed_raw(
    home: Path, work: FakeProvider, capsys: pytest.CaptureFixture[str]
) -> None:
    work.models = ["fine", "evil\x1b]0;pwned\x07"]
    configure(home, provider("work", work))
    code, out, _ = models(capsys)
    assert code == 0
    assert "\x1b" not in out
    assert "evil" not in out
    assert "fine" in out


def test_the_human_table(
    home: Path, work: FakeProvider, capsys: pytest.CaptureFixture[str]
) -> None:
    configure(
        home,
        provider("work", work)
        + '[providers.fixed]\nkind = "ollama"\ndiscover = false\nmodels = ["m"]\n',
    )
    code, out, err = models(capsys)
    lines = out.splitlines()
    assert code == 0
    assert err == ""
    assert lines[0].split() == ["PROVIDER", "MODEL", "CONTEXT", "LISTED"]
    assert lines[1].split() == ["work", "alpha", "-", "now"]
    assert lines[3].split() == ["fixed", "m", "-", "config"]
    _, out, _ = models(capsys)
    assert out.splitlines()[1].split() == ["work", "alpha", "-", "0", "s", "ago"]


def test_a_wrong_config_file_is_refused_with_exit_2(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    configure(home, '[providers.x]\nkind = "gemini"\n')
    code, reply, err = models(capsys, "--json")
    assert code == 2
    assert reply["ok"] is False
    assert reply["error"]["code"] == "bad-config"
    assert "kind must be one of" in err


def test_no_providers_is_an_empty_answer(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, reply, _ = models(capsys, "--json")
    assert code == 0
    assert reply["n"] == 0
    assert reply["failed"] == []
    code, _, err = models(capsys)
    assert code == 0
    assert "no [providers.NAME]" in err


def test_the_cache_dir_defaults_to_home_dot_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from melchior.providers.discovery import cache_dir

    assert cache_dir({"HOME": str(tmp_path)}) == tmp_path / ".cache" / "melchior" / "models"
    assert cache_dir({"HOME": "/h", "XDG_CACHE_HOME": "relative"}) == Path(
        "/h/.cache/melchior/models"
    )
    assert os.fspath(cache_dir({"XDG_CACHE_HOME": "/c"})) == "/c/melchior/models"
