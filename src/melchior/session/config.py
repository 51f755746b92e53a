"""Reading ``melchior.talk`` from the user's config; the walls themselves stay pure.

The file is ``$XDG_CONFIG_HOME/melchior/config.toml`` (default ``~/.config``)::

    [melchior]
    talk = "run"            # every project

    [melchior.project.demo]
    talk = "project"        # project "demo" only; wins over the line above

The per-project override lives in the user's config directory, not in the working
tree, on purpose: the agents behind the walls edit the working tree, and a wall an
agent can move by writing a file is not a wall. A value outside instance|run|project
is an error, not a default, so nothing ever widens past the project by accident. The
file's path and :class:`ConfigError` are :mod:`melchior.configfile`'s (re-exported here).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from melchior.configfile import ConfigError as ConfigError
from melchior.configfile import config_path
from melchior.policy.walls import TALK_VALUES, Talk

DEFAULT_TALK: Talk = "instance"


def _talk_in(table: Any, where: str, path: Path) -> Talk | None:
    if not isinstance(table, dict) or "talk" not in table:
        return None
    value = table["talk"]
    for known in TALK_VALUES:
        if value == known:
            return known
    raise ConfigError(
        f"{path}: {where}.talk = {value!r}; it must be one of "
        f"{', '.join(repr(v) for v in TALK_VALUES)} (nothing widens past the project)"
    )


def parse_talk(text: str, project: str, path: Path) -> Talk:
    """``melchior.talk`` for ``project`` from a config file's text."""
    # Imported here: most runs have no config file, and the tool is exec'd per request.
    from melchior import tomlfile

    try:
        data = tomlfile.loads(text, str(path))
    except tomlfile.TomlFileError as exc:
        raise ConfigError(str(exc)) from None
    section = data.get("melchior", {})
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: 'melchior' must be a table")
    projects = section.get("project", {})
    if not isinstance(projects, dict):
        raise ConfigError(f"{path}: 'melchior.project' must be a table of projects")
    override = _talk_in(projects.get(project), f"melchior.project.{project}", path)
    if override is not None:
        return override
    return _talk_in(section, "melchior", path) or DEFAULT_TALK


def read_talk(project: str, env: Mapping[str, str] | None = None) -> Talk:
    environ = os.environ if env is None else env
    path = config_path(environ)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return DEFAULT_TALK
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    return parse_talk(text, project, path)
