"""The one credential rule (``melchior.mellan.credentials``) from values: which
credential, relay and CA file a client uses, for every precedence, with the environment
given as a mapping (no process state read or changed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from melchior.mellan.credentials import (
    DEFAULT_RELAY,
    CredentialError,
    agent_credential,
    agent_file,
    login_file,
    read_credential,
    stored_agents,
    target,
)


def home(tmp: Path, **more: str) -> dict[str, str]:
    return {"HOME": str(tmp), "XDG_CONFIG_HOME": str(tmp / "config"), **more}


def store(path: Path, data: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")


def test_the_files_live_under_the_config_home(tmp_path: Path) -> None:
    env = home(tmp_path)
    assert login_file(env) == tmp_path / "config" / "mellan" / "login.json"
    assert agent_file("local/codex", env) == tmp_path / "config/mellan/agents/local/codex.json"
    assert login_file({"HOME": str(tmp_path)}) == tmp_path / ".config/mellan/login.json"


def test_as_agent_wins_then_the_token_then_the_one_stored(tmp_path: Path) -> None:
    env = home(tmp_path)
    store(agent_file("local/codex", env),
          {"token": "joined", "relay": "http://127.0.0.1:9000/", "workspace": "acme"})  # fmt: skip
    found = agent_credential(as_agent="local/codex", environ={**env, "MELLAN_TOKEN": "env"})
    assert (found.relay, found.token, found.workspace) == (
        "http://127.0.0.1:9000",
        "joined",
        "acme",
    )
    by_env = agent_credential(environ={**env, "MELLAN_TOKEN": "env"})
    assert (by_env.token, by_env.workspace, by_env.relay) == ("env", None, DEFAULT_RELAY)
    only = agent_credential(environ=env)
    assert only.token == "joined"
    flagged = agent_credential(relay="http://127.0.0.1:1", environ={**env, "MELLAN_RELAY": "x"})
    assert flagged.relay == "http://127.0.0.1:1"
    assert agent_credential(environ={**env, "MELLAN_RELAY": "http://e:1"}).relay == "http://e:1"


def test_two_stored_and_no_token_is_a_question_not_a_guess(tmp_path: Path) -> None:
    env = home(tmp_path)
    for agent in ("local/a", "local/b"):
        store(agent_file(agent, env), {"token": agent})
    assert len(stored_agents(env)) == 2
    with pytest.raises(CredentialError, match="pass --as AGENT or set MELLAN_TOKEN") as no:
        agent_credential(environ=env)
    assert no.value.usage
    with pytest.raises(CredentialError, match="no stored credential for agent 'local/c'"):
        agent_credential(as_agent="local/c", environ=env)


def test_a_broken_file_is_named_and_not_a_usage_error(tmp_path: Path) -> None:
    env = home(tmp_path)
    path = agent_file("local/a", env)
    path.parent.mkdir(parents=True)
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(CredentialError, match="cannot read") as no:
        agent_credential(as_agent="local/a", environ=env)
    assert not no.value.usage
    path.write_text('{"token": 7}', encoding="utf-8")
    with pytest.raises(CredentialError, match="is not a mellan agent credential"):
        read_credential(path)
    login = login_file(env)
    login.write_text("[", encoding="utf-8")
    with pytest.raises(CredentialError, match="cannot read the stored login"):
        target(environ={**env, "MELLAN_TOKEN": "t"})


def test_target_uses_the_login_and_needs_a_token_unless_told(tmp_path: Path) -> None:
    env = home(tmp_path)
    with pytest.raises(CredentialError, match="no credential: set MELLAN_TOKEN"):
        target(environ=env)
    assert target(need_token=False, environ=env).token is None
    store(login_file(env), {"relay": "http://127.0.0.1:7/", "token": "owner"})
    got = target(environ=env)
    assert (got.relay, got.token) == ("http://127.0.0.1:7", "owner")
    assert target(environ={**env, "MELLAN_TOKEN": "env"}).token == "env"


def test_the_ca_file_comes_from_the_value_then_the_environment_then_the_file(
    tmp_path: Path,
) -> None:
    env = home(tmp_path)
    store(agent_file("local/a", env), {"token": "t", "ca_file": "/stored.pem"})
    stored = agent_credential(as_agent="local/a", environ=env).tls
    assert stored is not None
    assert stored.ca_file == Path("/stored.pem")
    from_env = agent_credential(as_agent="local/a", environ={**env, "MELLAN_CA_FILE": "/e.pem"})
    assert from_env.tls is not None
    assert from_env.tls.ca_file == Path("/e.pem")
    given_ = agent_credential(as_agent="local/a", ca_file="/v.pem", environ=env)
    assert given_.tls is not None
    assert given_.tls.ca_file == Path("/v.pem")
    with pytest.raises(CredentialError, match="MELLAN_CLIENT_KEY"):
        agent_credential(as_agent="local/a", environ={**env, "MELLAN_CLIENT_KEY": "/k.pem"})


@given(st.one_of(st.none(), st.text(min_size=1)), st.one_of(st.none(), st.text(min_size=1)))
def test_an_explicit_relay_always_wins(relay: str | None, env_relay: str | None) -> None:
    env = {"HOME": "/nonexistent-home", "XDG_CONFIG_HOME": "/nonexistent-config",
           "MELLAN_TOKEN": "t"}  # fmt: skip
    if env_relay is not None:
        env["MELLAN_RELAY"] = env_relay
    got = agent_credential(relay=relay, environ=env).relay
    assert got == (relay or env_relay or DEFAULT_RELAY).rstrip("/")
