"""Where melchior's own config file is, and how it says it cannot be used.

One file, ``$XDG_CONFIG_HOME/melchior/config.toml`` (default ``~/.config``), holds
several readers' tables: ``melchior.talk`` (:mod:`melchior.session.config`), the
providers (:mod:`melchior.providers.config`), the MCP bridge's settings
(:mod:`melchior.integrations.settings`). Its path and its one error live here, below all
of them, so a reader in one layer never imports another layer's reader to find the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


class ConfigError(ValueError):
    """The config file cannot be read or says something that is not allowed."""


def config_path(env: Mapping[str, str]) -> Path:
    from melchior.files import xdg

    return xdg("config", env) / "melchior" / "config.toml"
