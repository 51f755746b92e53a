"""The relay's settings: one table, from which the ``mellan relay`` flags, the keys of its
TOML config file, the ``MELLAN_*`` environment variables and the operations docs are all
derived — so a setting cannot exist in one of them and be missing from another.

Precedence, lowest first: the built-in default, the config file (``--config FILE`` or
``$MELLAN_CONFIG``), the environment, the command line. A file is held to the table: an
unknown key is an error naming it (and the closest known key), a value of the wrong type
is refused naming the key, and every value passes the same check whichever source it
came from. A relative path in a file is relative to the file's directory (a service's
working directory is rarely the operator's).

To add a setting, add a :class:`Setting` row to :data:`SETTINGS` and read it from the
:class:`Resolved` mapping; flag, key, variable and docs follow.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from melchior import tomlfile
from melchior.policy.send_limits import DEFAULTS

ENV_PREFIX = "MELLAN_"
CONFIG_ENV = "MELLAN_CONFIG"

Check = Callable[[Any], str | None]


class SettingsError(ValueError):
    """A setting that cannot be used; the message names the key and where it came from."""


@dataclass(frozen=True)
class Setting:
    """One setting of the relay.

    ``key`` is the TOML key (``tls.cert`` is key ``cert`` of table ``[tls]``); the flag
    is ``--`` plus the key with ``.``/``_`` as ``-`` unless ``flag`` says otherwise; the
    environment variable is ``MELLAN_`` plus the key upper-cased with ``.`` as ``_``.
    """

    key: str
    kind: type
    default: Any
    help: str
    metavar: str | None = None
    flag: str | None = None
    secret: bool = False
    """Shown masked by ``--print-config`` (a token or password)."""
    mask: Callable[[Any], str] | None = None
    """How ``--print-config`` shows a value that is partly secret (a database URL)."""
    check: Check | None = None
    example: Any = None
    """The value shown in the documented example file (default: the default)."""

    @property
    def dest(self) -> str:
        return self.key.replace(".", "_")

    @property
    def option(self) -> str:
        return self.flag or "--" + self.key.replace(".", "-").replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.replace(".", "_").upper()


# -- checks: each returns why a value is unusable, or None ---------------------------------


def _port(v: int) -> str | None:
    return None if 0 <= v <= 65535 else "is not a port number (0-65535)"


def _positive(v: float) -> str | None:
    return None if v > 0 else "must be greater than 0"


def _body_timeout(v: float) -> str | None:
    return None if 0 < v <= 3600 else "must be in (0, 3600] seconds"


def _retain_days(v: float) -> str | None:
    return None if 0 < v <= 36500 else "must be in (0, 36500] days"


def _url(v: str) -> str | None:
    return None if v.startswith(("http://", "https://")) else "must start with http:// or https://"


def _database(v: str) -> str | None:
    from melchior.mellan.relay.store.dburl import problem  # the one parser of the URL

    return problem(v)


def _log_format(v: str) -> str | None:
    return None if v in ("text", "json") else "must be text or json"


def _at_least_one(v: int) -> str | None:
    return None if v >= 1 else "must be at least 1"


def _mask_database(v: Any) -> str:
    from melchior.mellan.relay.store.dburl import redact

    return redact(None if v is None else str(v))


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "database", str, None,
        "sqlite:///PATH or postgresql://… (default: SQLite at $XDG_DATA_HOME/mellan/relay.db)",
        metavar="URL", mask=_mask_database, check=_database,
        example="postgresql://mellan@db.internal/mellan",
    ),
    Setting("host", str, "127.0.0.1", "bind address", metavar="ADDRESS", example="0.0.0.0"),
    Setting("port", int, 8787, "bind port (0 = any free)", metavar="PORT", check=_port,
            example=8443),
    Setting(
        "grpc_port", int, None,
        "also serve A2A over gRPC on this port (0 = any free; off by default), on --host "
        "with the same TLS as HTTPS",
        metavar="PORT", check=_port, example=8444,
    ),
    Setting(
        "public_url", str, None, "the URL agents use to reach this relay", metavar="URL",
        check=_url, example="https://relay.example.net:8443",
    ),
    Setting(
        "owner_token_file", Path, None,
        "where a minted owner token is written (default $XDG_DATA_HOME/mellan/owner.token)",
        metavar="PATH", example="/var/lib/mellan/owner.token",
    ),
    Setting(
        "mint_owner_token", bool, False,
        "mint another owner credential at start (e.g. the first token file was lost)",
    ),
    Setting("json", bool, False, "status lines as JSON objects, one per line"),
    Setting(
        "max_body", int, 16 * 1024 * 1024, "largest request body accepted, in bytes",
        metavar="BYTES", check=_positive,
    ),
    Setting(
        "max_result", int, 8 * 1024 * 1024,
        "largest task result a receiver may report, in bytes of JSON (refused at complete)",
        metavar="BYTES", check=_positive,
    ),
    Setting(
        "body_timeout", float, 30.0,
        "seconds a client has to send a whole request body (then 408)",
        metavar="SECONDS", check=_body_timeout,
    ),
    Setting(
        "retain_days", float, None,
        "delete tasks this many days after they finished, with their events and turns "
        "(the audit log is kept; default: keep every task)",
        metavar="DAYS", check=_retain_days, example=90.0,
    ),
    Setting(
        "tls.cert", Path, None,
        "serve HTTPS with this certificate chain (PEM); SIGHUP reloads it",
        metavar="FILE", example="/etc/mellan/tls/relay.crt",
    ),
    Setting(
        "tls.key", Path, None, "the private key of --tls-cert (PEM); SIGHUP reloads it",
        metavar="FILE", example="/etc/mellan/tls/relay.key",
    ),
    Setting(
        "tls.client_ca", Path, None,
        "CA bundle (PEM) for client certificates: receivers must present one it signed "
        "on /api/receiver/* (mTLS); other paths may",
        metavar="FILE", flag="--client-ca", example="/etc/mellan/tls/receivers-ca.crt",
    ),
    Setting(
        "insecure_http", bool, False,
        "allow plain HTTP on a non-loopback address (credentials cross the network in clear)",
    ),
    Setting(
        "log_format", str, "text",
        "log lines as 'text' or 'json' (one object per line, with request ids and one "
        "line per request)",
        metavar="FORMAT", check=_log_format, example="json",
    ),
    Setting(
        "metrics.token_file", Path, None,
        "a file holding a token that may read /metrics besides owner credentials",
        metavar="FILE", example="/etc/mellan/metrics.token",
    ),
    Setting(
        "gc_threshold", int, 50_000,
        "allocations between young garbage collections (700 is Python's own; higher makes "
        "the full collections that stop the relay rarer)",
        metavar="N", check=_at_least_one,
    ),
    Setting(
        "metrics.cache_seconds", float, 10.0,
        "seconds the database gauges of /metrics are reused between scrapes",
        metavar="SECONDS", check=_positive,
    ),
    Setting(
        "limits.send_rate", float, DEFAULTS.send_rate,
        "default sends per second of one calling agent (workspace and agent limits override)",
        metavar="N", check=_positive,
    ),
    Setting(
        "limits.burst", int, DEFAULTS.burst, "default sends in a row before the rate applies",
        metavar="N", check=_at_least_one,
    ),
    Setting(
        "limits.max_unfinished_per_receiver", int, DEFAULTS.max_unfinished_per_receiver,
        "default cap on one caller's unfinished tasks at one receiver",
        metavar="N", check=_at_least_one,
    ),
    Setting(
        "limits.max_queued", int, DEFAULTS.max_queued,
        "default cap on the tasks queued for one receiver",
        metavar="N", check=_at_least_one,
    ),
)  # fmt: skip

BY_KEY: dict[str, Setting] = {s.key: s for s in SETTINGS}


# -- resolution ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Value:
    value: Any
    source: str
    """``default``, ``file PATH``, ``env MELLAN_X`` or ``flag --x``."""


class Resolved(Mapping[str, Any]):
    """The effective settings: ``resolved["tls.cert"]`` is a value, ``.source(key)`` where
    it came from."""

    def __init__(self, values: dict[str, Value], config: Path | None) -> None:
        self._values = values
        self.config = config

    def __getitem__(self, key: str) -> Any:
        return self._values[key].value

    def __iter__(self) -> Any:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def source(self, key: str) -> str:
        return self._values[key].source

    def shown(self, key: str) -> str | int | float | bool | None:
        """The value as ``--print-config`` shows it: secrets masked, paths as text."""
        s, v = BY_KEY[key], self[key]
        if s.mask is not None and (v is not None or s.key == "database"):
            return s.mask(v)
        if v is None:
            return None
        if s.secret:
            return "***"
        return str(v) if isinstance(v, Path) else v


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every setting as a flag (default None: "not given", so precedence can tell)."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        type=Path,
        help=f"read settings from this TOML file (or ${CONFIG_ENV}); env and flags override it",
    )
    for s in SETTINGS:
        where = f"[{s.key}, ${s.env}"
        default = "" if s.default in (None, False) else f"; default {s.default}"
        text = f"{s.help} {where}{default}]".replace("%", "%%")
        if s.kind is bool:
            parser.add_argument(
                s.option, dest=s.dest, action=argparse.BooleanOptionalAction, default=None,
                help=text,
            )  # fmt: skip
        else:
            parser.add_argument(
                s.option, dest=s.dest, type=s.kind, default=None, metavar=s.metavar, help=text
            )


def _suggest(key: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _flatten(data: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``{"tls": {"cert": x}}`` → ``{"tls.cert": x}``, refusing keys the table lacks."""
    tables = {k.split(".", 1)[0] for k in BY_KEY if "." in k}
    out: dict[str, Any] = {}
    for name, value in data.items():
        if name in tables:
            if not isinstance(value, dict):
                raise SettingsError(f"{where}: {name} must be a table ([{name}]), not {value!r}")
            for sub, inner in value.items():
                out[f"{name}.{sub}"] = inner
        else:
            out[name] = value
    for key in out:
        if key not in BY_KEY:
            raise SettingsError(f"{where}: unknown key {key!r}{_suggest(key, list(BY_KEY))}")
    return out


def _from_file(s: Setting, raw: Any, path: Path) -> Any:
    """A TOML value of the setting's type (TOML is typed: no strings for numbers)."""
    ok = {
        bool: isinstance(raw, bool),
        int: isinstance(raw, int) and not isinstance(raw, bool),
        float: isinstance(raw, int | float) and not isinstance(raw, bool),
        str: isinstance(raw, str),
        Path: isinstance(raw, str),
    }[s.kind]
    if not ok:
        want = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
                Path: "a path (string)"}[s.kind]  # fmt: skip
        raise SettingsError(f"{path}: {s.key} = {raw!r} must be {want}")
    if s.kind is Path:
        p = Path(raw).expanduser()
        return p if p.is_absolute() else (path.parent / p).resolve()
    return float(raw) if s.kind is float else raw


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _from_env(s: Setting, raw: str) -> Any:
    try:
        if s.kind is bool:
            low = raw.strip().lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError("not one of " + "/".join(_TRUE + _FALSE))
        if s.kind is Path:
            return Path(raw).expanduser()
        return s.kind(raw)
    except ValueError as exc:
        kind = {bool: "a boolean", int: "an integer", float: "a number"}.get(s.kind, "valid")
        raise SettingsError(f"${s.env} = {raw!r} is not {kind} ({exc})") from None


def load_file(path: Path) -> dict[str, Any]:
    """The settings a TOML file sets, typed and checked against the table."""
    try:
        data = tomlfile.read(path)  # bounded: every unreadable file is one line, exit 2
    except FileNotFoundError:
        raise SettingsError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise SettingsError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except tomlfile.TomlFileError as exc:
        raise SettingsError(str(exc)) from None
    return {k: _from_file(BY_KEY[k], v, path) for k, v in _flatten(data, str(path)).items()}


def resolve(ns: argparse.Namespace, environ: Mapping[str, str]) -> Resolved:
    """Defaults < file < environment < flags, every value checked; SettingsError if not."""
    config: Path | None = getattr(ns, "config", None)
    if config is None and environ.get(CONFIG_ENV):
        config = Path(environ[CONFIG_ENV]).expanduser()
    from_file = load_file(config) if config is not None else {}
    values: dict[str, Value] = {}
    for s in SETTINGS:
        flagged = getattr(ns, s.dest, None)
        if flagged is not None:
            v = Value(flagged, f"flag {s.option}")
        elif environ.get(s.env, "") != "":
            v = Value(_from_env(s, environ[s.env]), f"env {s.env}")
        elif s.key in from_file:
            v = Value(from_file[s.key], f"file {config}")
        else:
            v = Value(s.default, "default")
        if v.value is not None and s.check is not None:
            why = s.check(v.value)
            if why:
                raise SettingsError(f"{s.key} = {v.value!r} (from {v.source}) {why}")
        values[s.key] = v
    return Resolved(values, config)


# -- showing and documenting ---------------------------------------------------------------


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    text = str(v).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def as_toml(values: Mapping[str, Any], comments: Mapping[str, str] | None = None) -> str:
    """Settings as a TOML document in table order: top-level keys first, then tables.
    A None value is written as a comment (TOML has no null)."""
    top: list[str] = []
    tables: dict[str, list[str]] = {}
    for s in SETTINGS:
        if s.key not in values:
            continue
        name = s.key.rsplit(".", 1)[-1]
        v = values[s.key]
        note = f"  # {comments[s.key]}" if comments and s.key in comments else ""
        line = f"# {name} =  (unset){note}" if v is None else f"{name} = {_toml(v)}{note}"
        (tables.setdefault(s.key.split(".")[0], []) if "." in s.key else top).append(line)
    out = top[:]
    for table, lines in tables.items():
        out += ["", f"[{table}]", *lines]
    return "\n".join(out) + "\n"


def print_config(resolved: Resolved, *, as_json: bool) -> str:
    """The effective configuration, secrets masked, each value with its source."""
    if as_json:
        import json

        return json.dumps(
            {
                "config_file": str(resolved.config) if resolved.config else None,
                "settings": {
                    s.key: {
                        "value": resolved.shown(s.key),
                        "source": resolved.source(s.key),
                        "flag": s.option,
                        "env": s.env,
                    }
                    for s in SETTINGS
                },
            },
            indent=2,
        )
    head = f"# effective mellan relay configuration (file: {resolved.config or 'none'})\n"
    body = as_toml(
        {s.key: resolved.shown(s.key) for s in SETTINGS},
        {s.key: resolved.source(s.key) for s in SETTINGS},
    )
    return head + body


def example_toml() -> str:
    """A complete example config file: every key, with its help as a comment."""
    lines = ["# relay.toml — every setting of 'mellan relay' (see docs/operations.md)"]
    tables: dict[str, list[str]] = {}
    for s in SETTINGS:
        value = s.example if s.example is not None else s.default
        name = s.key.rsplit(".", 1)[-1]
        block = [f"# {s.help} (${s.env}, {s.option})"]
        block.append(f"# {name} = " if value is None else f"{name} = {_toml(value)}")
        if "." in s.key:
            tables.setdefault(s.key.split(".")[0], []).extend(block)
        else:
            lines += block
    for table, block in tables.items():
        lines += ["", f"[{table}]", *block]
    return "\n".join(lines) + "\n"


def markdown_table() -> str:
    """Key, flag, environment variable, default and meaning of every setting."""
    rows = ["| key | flag | environment | default | meaning |", "|---|---|---|---|---|"]
    for s in SETTINGS:
        default = "" if s.default is None else f"`{_toml(s.default)}`"
        rows.append(f"| `{s.key}` | `{s.option}` | `{s.env}` | {default} | {s.help} |")
    return "\n".join(rows) + "\n"
