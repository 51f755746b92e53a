"""The providers a user configured: ``[providers.NAME]`` tables in melchior's config file.

The file (:mod:`melchior.configfile`) is the one :mod:`melchior.session.config` reads
``melchior.talk`` from, ``$XDG_CONFIG_HOME/melchior/config.toml`` (default ``~/.config``)::

    [providers.openai]
    kind = "openai"                       # openai | openai-responses | anthropic | ollama
    api_key_env = "OPENAI_API_KEY"        # the variable's NAME; the key stays in the env

    [providers.local]
    kind = "ollama"
    base_url = "http://127.0.0.1:11434"

    [providers.claude]
    kind = "anthropic"
    api_key_env = "ANTHROPIC_API_KEY"
    discover = false                      # never asked; these are its models
    models = ["claude-sonnet-4-5"]

Keys: ``kind`` (required), ``base_url`` (default per kind, see
:data:`DEFAULT_BASE_URLS`), ``api_key_env``, ``discover`` (default true: the provider
is asked for its models), ``models`` (listed as they are when ``discover = false``).
An unknown key is an error, so a typo (``discovr``) is found rather than ignored.

A key is never written in this file: ``api_key_env`` names the environment variable
that holds it. A value that does not look like a variable name is refused without
being echoed, since it is most likely a key pasted into the wrong place.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from melchior.configfile import ConfigError, config_path
from melchior.providers.errors import CredentialMissing
from melchior.providers.redact import redact_url

Kind = Literal["openai", "openai-responses", "anthropic", "ollama"]
KINDS: tuple[Kind, ...] = ("openai", "openai-responses", "anthropic", "ollama")
DEFAULT_BASE_URLS: dict[Kind, str] = {
    "openai": "https://api.openai.com/v1",
    "openai-responses": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com",
    "ollama": "http://127.0.0.1:11434",
}
KEYS = frozenset({"kind", "base_url", "api_key_env", "discover", "models"})
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A provider's name: it becomes a cache file name, so no separators and no dot-files."""
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
MAX_STATIC_MODELS = 1000
MAX_MODEL_ID = 512

__all__ = ["KINDS", "ConfigError", "Kind", "ProviderConfig", "parse_providers", "read_providers"]


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    """One ``[providers.NAME]`` table, checked."""

    name: str
    kind: Kind
    base_url: str
    api_key_env: str | None = None
    discover: bool = True
    models: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return (
            f"ProviderConfig(name={self.name!r}, kind={self.kind!r}, "
            f"base_url={redact_url(self.base_url)!r}, api_key_env={self.api_key_env!r}, "
            f"discover={self.discover!r}, models={self.models!r})"
        )

    def api_key(self, env: Mapping[str, str] | None = None) -> str | None:
        """The key from the environment, None when none is configured.

        Raises :class:`CredentialMissing` when ``api_key_env`` names a variable that
        is unset or empty: sending no key would only earn a 401 that says less.
        """
        if self.api_key_env is None:
            return None
        value = (os.environ if env is None else env).get(self.api_key_env, "")
        if not value:
            raise CredentialMissing(
                f"provider {self.name!r}: ${self.api_key_env} is not set "
                f"(api_key_env names the variable that holds the key)",
                provider=self.name,
            )
        return value


def _check_url(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}.base_url must be a non-empty string")
    import httpx

    try:
        parsed = httpx.URL(value)
    except httpx.InvalidURL:
        parsed = None
    if (
        parsed is None
        or parsed.scheme not in ("http", "https")
        or not parsed.host
        or any(c.isspace() for c in value)
    ):
        raise ConfigError(
            f"{where}.base_url must be an http:// or https:// URL, got {redact_url(value)!r}"
        )
    return value


def _one(name: str, table: Any, path: Path) -> ProviderConfig:
    where = f"{path}: providers.{name}"
    if not NAME.fullmatch(name):
        raise ConfigError(
            f"{path}: provider name {name[:80]!r} must be letters, digits, '_', '.', '-' "
            "(at most 64, not starting with '.', '_' or '-')"
        )
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    unknown = sorted(set(table) - KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; known: {', '.join(sorted(KEYS))}")
    kind = table.get("kind")
    if kind not in KINDS:
        raise ConfigError(
            f"{where}.kind must be one of {', '.join(repr(k) for k in KINDS)}, got {kind!r}"
        )
    checked: Kind = next(k for k in KINDS if k == kind)
    base_url = _check_url(table.get("base_url", DEFAULT_BASE_URLS[checked]), where)
    env_name = table.get("api_key_env")
    if env_name is not None and (not isinstance(env_name, str) or not ENV_NAME.fullmatch(env_name)):
        raise ConfigError(
            f"{where}.api_key_env must name an environment variable (letters, digits, "
            "'_'); it holds the variable's name, never the key itself"
        )
    discover = table.get("discover", True)
    if not isinstance(discover, bool):
        raise ConfigError(f"{where}.discover must be true or false")
    models = table.get("models", [])
    if (
        not isinstance(models, list)
        or len(models) > MAX_STATIC_MODELS
        or not all(isinstance(m, str) and 0 < len(m) <= MAX_MODEL_ID for m in models)
    ):
        raise ConfigError(
            f"{where}.models must be a list of at most {MAX_STATIC_MODELS} model ids "
            f"(non-empty strings of at most {MAX_MODEL_ID} characters)"
        )
    return ProviderConfig(name, checked, base_url, env_name, discover, tuple(models))


def parse_providers(text: str, path: Path) -> dict[str, ProviderConfig]:
    """Every ``[providers.NAME]`` of a config file's text, in file order."""
    from melchior import tomlfile

    try:
        data = tomlfile.loads(text, str(path))
    except tomlfile.TomlFileError as exc:
        raise ConfigError(str(exc)) from None
    providers = data.get("providers", {})
    if not isinstance(providers, dict):
        raise ConfigError(f"{path}: 'providers' must be a table of [providers.NAME] tables")
    return {name: _one(name, table, path) for name, table in providers.items()}


def read_providers(env: Mapping[str, str] | None = None) -> dict[str, ProviderConfig]:
    """The configured providers; none when there is no config file."""
    path = config_path(os.environ if env is None else env)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    return parse_providers(text, path)
