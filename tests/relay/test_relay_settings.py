"""The relay's settings table: flags, TOML keys and MELLAN_* variables derived from one
table, precedence file < env < flag, unknown keys and wrong types refused by name, and
``--print-config`` showing the effective values with secrets masked."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from melchior.mellan.relay.server import settings
from melchior.mellan.relay.server.settings import SETTINGS, SettingsError
from relay_proc import MELLAN, relay_env, start_relay


def parser() -> argparse.ArgumentParser:
    from melchior.mellan.commands.relay import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    return p


def resolve(argv: list[str], env: dict[str, str] | None = None) -> settings.Resolved:
    return settings.resolve(parser().parse_args(argv), env or {})


def mellan(
    home: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [MELLAN, "relay", *args], capture_output=True, text=True, timeout=60,
        env=relay_env(home) | (env or {}),
    )  # fmt: skip


def test_every_setting_has_one_flag_key_and_variable() -> None:
    keys = [s.key for s in SETTINGS]
    flags = [s.option for s in SETTINGS]
    envs = [s.env for s in SETTINGS]
    assert len(set(keys)) == len(set(flags)) == len(set(envs)) == len(SETTINGS)
    known = {a.dest for a in parser()._actions}
    assert {s.dest for s in SETTINGS} <= known
    # the flags the relay had before the table keep their names
    for old in ("--database", "--host", "--port", "--public-url", "--owner-token-file",
                "--mint-owner-token", "--json", "--max-body", "--body-timeout"):  # fmt: skip
        assert old in flags


def test_defaults_are_the_relays_defaults() -> None:
    r = resolve([])
    assert r["host"] == "127.0.0.1"
    assert r["port"] == 8787
    assert r["max_body"] == 16 * 1024 * 1024
    assert r["body_timeout"] == 30.0
    assert all(r.source(s.key) == "default" for s in SETTINGS)


def test_precedence_file_env_flag(tmp_path: Path) -> None:
    cfg = tmp_path / "relay.toml"
    cfg.write_text('port = 1111\nhost = "127.0.0.2"\nmax_body = 5\n[tls]\ncert = "c.pem"\n')
    r = resolve(
        ["--config", str(cfg), "--port", "3333"], {"MELLAN_PORT": "2222", "MELLAN_HOST": "::1"}
    )
    assert (r["port"], r.source("port")) == (3333, "flag --port")
    assert (r["host"], r.source("host")) == ("::1", "env MELLAN_HOST")
    assert (r["max_body"], r.source("max_body")) == (5, f"file {cfg}")
    # a relative path in a file is relative to the file
    assert r["tls.cert"] == tmp_path / "c.pem"


sources = st.sampled_from(["none", "file", "env", "flag"])


@given(st.sets(sources))
def test_precedence_is_total(given_in: set[str]) -> None:
    """Whatever subset of sources sets ``port``, the highest one wins."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "relay.toml"
        cfg.write_text("port = 1001\n" if "file" in given_in else "")
        argv = ["--config", str(cfg)] + (["--port", "1003"] if "flag" in given_in else [])
        env = {"MELLAN_PORT": "1002"} if "env" in given_in else {}
        want = 1003 if "flag" in given_in else 1002 if "env" in given_in else (
            1001 if "file" in given_in else 8787)  # fmt: skip
        assert resolve(argv, env)["port"] == want


def test_boolean_flag_overrides_a_true_in_the_file(tmp_path: Path) -> None:
    cfg = tmp_path / "relay.toml"
    cfg.write_text("insecure_http = true\n")
    assert resolve(["--config", str(cfg)])["insecure_http"] is True
    assert resolve(["--config", str(cfg)], {"MELLAN_INSECURE_HTTP": "no"})["insecure_http"] is False
    assert resolve(["--config", str(cfg), "--no-insecure-http"])["insecure_http"] is False


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("prot = 1\n", ["unknown key 'prot'", "did you mean 'port'"]),
        ("[tls]\ncrt = 'x'\n", ["unknown key 'tls.crt'", "'tls.cert'"]),
        ("[tsl]\ncert = 'x'\n", ["unknown key 'tsl'"]),
        ("tls = 'x'\n", ["tls must be a table ([tls])"]),
        ("port = '8787'\n", ["port = '8787' must be an integer"]),
        ("port = true\n", ["port = True must be an integer"]),
        ("json = 1\n", ["json = 1 must be true or false"]),
        ("port = 99999\n", ["port = 99999", "not a port number"]),
        ("body_timeout = 0\n", ["body_timeout", "(0, 3600]"]),
        ("public_url = 'relay.example'\n", ["public_url", "http:// or https://"]),
        ("port = \n", ["not valid TOML"]),
    ],
)
def test_bad_files_are_refused_naming_the_key(tmp_path: Path, text: str, words: list[str]) -> None:
    cfg = tmp_path / "relay.toml"
    cfg.write_text(text)
    with pytest.raises(SettingsError) as err:
        resolve(["--config", str(cfg)])
    for w in words:
        assert w in str(err.value)


def test_bad_environment_is_refused_naming_the_variable() -> None:
    with pytest.raises(SettingsError, match=r"\$MELLAN_PORT = 'x' is not an integer"):
        resolve([], {"MELLAN_PORT": "x"})
    with pytest.raises(SettingsError, match="MELLAN_JSON"):
        resolve([], {"MELLAN_JSON": "maybe"})
    with pytest.raises(SettingsError, match=r"config file .* does not exist"):
        resolve([], {"MELLAN_CONFIG": "/nonexistent/relay.toml"})


def test_example_file_sets_every_key_and_loads(tmp_path: Path) -> None:
    cfg = tmp_path / "relay.toml"
    cfg.write_text(settings.example_toml())
    loaded = settings.load_file(cfg)
    unset = {s.key for s in SETTINGS if (s.example if s.example is not None else s.default) is None}
    assert set(loaded) | unset == {s.key for s in SETTINGS}
    assert not unset


def test_print_config_masks_secrets_and_names_sources(tmp_path: Path) -> None:
    cfg = tmp_path / "relay.toml"
    cfg.write_text('database = "postgresql://mellan:hunter2@db.internal/mellan"\nport = 1\n')
    out = mellan(tmp_path, "--config", str(cfg), "--port", "2", "--print-config", "--json",
                 env={"MELLAN_HOST": "127.0.0.3"})  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "hunter2" not in out.stdout
    got: dict[str, Any] = json.loads(out.stdout)["settings"]
    assert got["database"]["value"] == "postgresql://mellan:***@db.internal/mellan"
    assert got["database"]["source"] == f"file {cfg}"
    assert got["port"] == {
        "value": 2,
        "source": "flag --port",
        "flag": "--port",
        "env": "MELLAN_PORT",
    }
    assert got["host"]["source"] == "env MELLAN_HOST"
    text = mellan(tmp_path, "--config", str(cfg), "--print-config")
    assert "hunter2" not in text.stdout
    assert "port = 1  # file" in text.stdout


def test_the_real_relay_refuses_an_unknown_key_and_runs_from_a_file(tmp_path: Path) -> None:
    cfg = tmp_path / "relay.toml"
    cfg.write_text("max_bdy = 10\n")
    bad = mellan(tmp_path, "--config", str(cfg))
    assert bad.returncode == 2
    assert "unknown key 'max_bdy' (did you mean 'max_body'?)" in bad.stderr
    cfg.write_text('public_url = "https://relay.example.net"\nmax_body = 1000\n')
    relay = start_relay(f"sqlite://{tmp_path / 'relay.db'}", tmp_path, "--config", str(cfg))
    try:
        assert any("public URL https://relay.example.net" in line for line in relay.lines)
        with relay.owner() as c:  # max_body = 1000 from the file is in force
            r = c.post(
                "/api/agents", content=b"x" * 2000, headers={"content-type": "application/json"}
            )
            assert r.status_code == 413, r.text
    finally:
        relay.stop()


def test_non_loopback_plain_http_is_refused_unless_insecure(tmp_path: Path) -> None:
    out = mellan(tmp_path, "--host", "0.0.0.0", "--port", "0",
                 "--database", f"sqlite://{tmp_path / 'r.db'}")  # fmt: skip
    assert out.returncode == 2
    assert "refusing to serve plain HTTP on 0.0.0.0" in out.stderr
    assert "--insecure-http" in out.stderr
    relay = start_relay(f"sqlite://{tmp_path / 'r.db'}", tmp_path, "--host", "0.0.0.0",
                        "--insecure-http")  # fmt: skip
    try:
        relay.stop()
        assert any("--insecure-http: serving plain HTTP" in line for line in relay.lines)
    finally:
        relay.stop()


def test_a_secret_setting_is_masked_wherever_it_came_from(monkeypatch: pytest.MonkeyPatch) -> None:
    """A setting marked secret (a token) is shown as *** by --print-config, never as itself."""
    token = settings.Setting("metrics.token", str, None, "a token", secret=True)
    monkeypatch.setattr(settings, "SETTINGS", (*SETTINGS, token))
    monkeypatch.setattr(settings, "BY_KEY", {**settings.BY_KEY, token.key: token})
    r = settings.resolve(argparse.Namespace(), {"MELLAN_METRICS_TOKEN": "s3cret"})
    assert r["metrics.token"] == "s3cret"
    for as_json in (False, True):
        shown = settings.print_config(r, as_json=as_json)
        assert "s3cret" not in shown
        assert "***" in shown
        assert "env MELLAN_METRICS_TOKEN" in shown


keys = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=20)


printable = st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=5)


@given(keys, st.one_of(st.integers(), st.booleans(), printable))
def test_any_key_outside_the_table_is_refused_by_name(key: str, value: Any) -> None:
    import tempfile

    tables = {s.key.split(".")[0] for s in SETTINGS if "." in s.key}
    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "relay.toml"
        cfg.write_text(f"{key} = {json.dumps(value, ensure_ascii=False)}\n", encoding="utf-8")
        if key in settings.BY_KEY:  # a known key: taken, or refused naming it
            why = ""
            try:
                resolve(["--config", str(cfg)])
            except SettingsError as exc:
                why = str(exc)
            assert not why or key in why
        else:
            with pytest.raises(SettingsError) as err:
                resolve(["--config", str(cfg)])
            assert (f"unknown key {key!r}" if key not in tables else f"{key} must be a table") in (
                str(err.value)
            )
