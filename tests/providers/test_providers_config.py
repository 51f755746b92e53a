"""``[providers.NAME]`` tables: what is accepted, what is refused, and what is never echoed."""

from __future__ import annotations

from pathlib import Path

import pytest

from melchior.providers.config import (
    DEFAULT_BASE_URLS,
    ConfigError,
    ProviderConfig,
    parse_providers,
    read_providers,
)
from melchior.providers.errors import CredentialMissing

pytestmark = pytest.mark.streaming

P = Path("/cfg/melchior/config.toml")


def test_a_full_file_in_order_with_defaults() -> None:
    text = """
[melchior]
talk = "run"

[providers.work]
kind = "openai"
base_url = "https://gateway.example/v1"
api_key_env = "WORK_KEY"

[providers.local]
kind = "ollama"

[providers.claude]
kind = "anthropic"
api_key_env = "ANTHROPIC_API_KEY"
discover = false
models = ["claude-a", "claude-b"]
"""
    got = parse_providers(text, P)
    assert list(got) == ["work", "local", "claude"]
    assert got["work"] == ProviderConfig("work", "openai", "https://gateway.example/v1", "WORK_KEY")
    assert got["local"].base_url == DEFAULT_BASE_URLS["ollama"]
    assert got["local"].discover
    assert got["claude"].models == ("claude-a", "claude-b")
    assert not got["claude"].discover


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (
            'kind = "gemini"',
            "kind must be one of 'openai', 'openai-responses', 'anthropic', 'ollama'",
        ),
        ("", "kind must be one of"),
        ('kind = "openai"\ndiscovr = true', "unknown key 'discovr'"),
        ('kind = "openai"\ndiscover = "yes"', "discover must be true or false"),
        ('kind = "openai"\nbase_url = "ftp://x"', "must be an http:// or https:// URL"),
        ('kind = "openai"\nbase_url = "http://[::1"', "must be an http:// or https:// URL"),
        ('kind = "openai"\nbase_url = "https:///v1"', "must be an http:// or https:// URL"),
        ('kind = "openai"\nmodels = "m"', "models must be a list"),
        ('kind = "openai"\nmodels = [""]', "models must be a list"),
    ],
)
def test_mistakes_are_refused_with_the_reason(table: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_providers(f"[providers.p]\n{table}\n", P)


def test_a_key_pasted_into_api_key_env_is_refused_and_never_echoed() -> None:
    key = "sk-proj-AbCdEf0123456789"
    with pytest.raises(ConfigError) as err:
        parse_providers(f'[providers.p]\nkind = "openai"\napi_key_env = "{key}"\n', P)
    assert "never the key itself" in str(err.value)
    assert key not in str(err.value)


def test_credentials_in_a_bad_base_url_are_not_echoed() -> None:
    text = '[providers.p]\nkind = "openai"\nbase_url = "http://u:pw-SECRET@h/v1 ?key=SECRET"\n'
    with pytest.raises(ConfigError) as err:
        parse_providers(text, P)
    assert "SECRET" not in str(err.value)


def test_names_that_cannot_be_file_names_are_refused() -> None:
    for name in ['".."', '"a/b"', '".hidden"', '"x y"']:
        with pytest.raises(ConfigError, match="provider name"):
            parse_providers(f'[providers.{name}]\nkind = "openai"\n', P)


def test_not_toml_and_not_a_table() -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        parse_providers("[providers.p\n", P)
    with pytest.raises(ConfigError, match="'providers' must be a table"):
        parse_providers('providers = "x"\n', P)


def test_the_file_is_read_from_xdg_config_home(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path), "HOME": "/nonexistent"}
    assert read_providers(env) == {}
    (tmp_path / "melchior").mkdir()
    (tmp_path / "melchior" / "config.toml").write_text('[providers.x]\nkind = "ollama"\n')
    assert list(read_providers(env)) == ["x"]


def test_the_key_comes_from_the_named_variable_only() -> None:
    config = ProviderConfig("p", "openai", "https://h/v1", api_key_env="P_KEY")
    assert config.api_key({"P_KEY": "k-123"}) == "k-123"
    with pytest.raises(CredentialMissing):
        config.api_key({"P_KEY": ""})
    assert ProviderConfig("o", "ollama", "http://h").api_key({}) is None


def test_repr_redacts_the_base_url() -> None:
    config = ProviderConfig("p", "openai", "https://u:SECRET@h/v1?key=SECRET")
    assert "SECRET" not in repr(config)
