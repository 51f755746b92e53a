"""The receiver's configuration file (TOML): where the relay is, who we are, what we run.

Read once at start and checked whole: an unknown key, a wrong type or a program that
does not exist fails ``mellan receiver run`` at once with the key's name, rather than
the first task at three in the morning. The allow-list (``[allow]``) is the part that
matters most: it is the machine's own say over what a route from the relay may run
(:mod:`melchior.policy.allowlist`).

::

    relay = "https://relay.example"          # default: the credential file's relay
    credential = "~/.config/mellan/agents/private/ops.json"   # or agent = "private/ops",
    token_env = "MELLAN_TOKEN"               # or the token in this variable
    concurrency = 4                          # tasks at once
    lease_seconds = 30                       # renewed every lease_seconds / 3
    wait = 25                                # claim long-poll, seconds
    poll = 5                                 # with wait = 0: seconds between claims
    progress_debounce = 0.2                  # seconds a turn's progress is held, coalesced
    state_dir = "~/.local/share/mellan/receiver/private-ops"   # spool and status file

    [allow]
    adapters = ["command", "claude-code"]
    cwd = ["~/src"]                          # a route's cwd must be inside one of these
    programs = ["/usr/local/bin/inspect"]    # what a command route's argv[0] may be
    urls = ["http://127.0.0.1:8645/"]        # a2a card_url / provider base_url prefixes
    bypass = false                           # routes may not turn sandboxes off
    route_env = false                        # routes may not add environment variables

    [allow.options.claude-code]              # exact values a route may choose for options
    allowed_tools = ["Read", "Grep"]         # that carry tools, flags or configuration

    [adapters.claude-code]                   # local defaults under every route's options
    max_budget_usd = 2.0

    [profiles.review]                        # a route's "profile" names one of these
    permission_mode = "plan"

    [wake]
    listen = "127.0.0.1:8790"
    secret_env = "MELLAN_WAKE_SECRET"        # or secret = "…"

    [tls]                                    # optional: a private CA, mTLS
    ca = "/etc/mellan/ca.pem"
    cert = "/etc/mellan/receiver.pem"
    key = "/etc/mellan/receiver.key"
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from melchior.files import xdg
from melchior.mellan import transport
from melchior.mellan.transport import ClientTls
from melchior.policy import route_options as ro
from melchior.policy.allowlist import AllowList
from melchior.policy.urls import prefix_problem
from melchior.runtimes import ADAPTERS, RuntimeConfigError, route_rules, runtime_for
from melchior.runtimes.process import ProgramNotFound, resolve_program


class ConfigError(ValueError):
    """The configuration is wrong; the message names the key and what it takes."""


TOP_KEYS = (
    "relay", "credential", "agent", "token_env", "concurrency", "lease_seconds", "wait",
    "poll", "state_dir", "name", "worker", "allow", "adapters", "profiles", "wake", "tls",
    "progress_debounce",
)  # fmt: skip
ALLOW_KEYS = ("adapters", "cwd", "programs", "urls", "bypass", "route_env", "options")
WAKE_KEYS = ("listen", "secret", "secret_env")
TLS_KEYS = ("ca", "cert", "key")


@dataclass(frozen=True)
class Wake:
    host: str
    port: int
    secret: str


@dataclass(frozen=True)
class ReceiverConfig:
    relay: str
    token: str
    name: str
    concurrency: int
    lease_seconds: float
    wait: float
    state_dir: Path
    allow: AllowList
    adapters: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    profiles: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    wake: Wake | None = None
    poll: float = 5.0
    progress_debounce: float = 0.2
    """Seconds a turn's progress is held before it is sent (coalesced; a turn that ends
    first sends its completion alone): :mod:`melchior.mellan.receiver.progress`."""
    worker: str | None = None
    verify: str | bool = True
    cert: tuple[str, str] | None = None
    stored_tls: Mapping[str, str] = field(default_factory=dict)
    source: Path | None = None
    key_file: Path | None = None
    """The agent's key pair for sealed tasks: beside its credential file ('mellan join'
    put it there); ``None`` when the token comes from the environment (no file, so no
    key: sealed tasks are refused, naming why)."""
    pins_dir: Path | None = None
    """Where the callers' keys are pinned (the CLI's configuration directory, so the
    receiver and 'mellan key trust' agree)."""
    notices: tuple[str, ...] = ()
    """What the receiver says at start-up about its wall: a prefix in ``allow.urls`` that
    covers nothing, ``allow.bypass`` on, guard rails this machine's own options turn off."""

    def client_tls(self, environ: Mapping[str, str] | None = None) -> ClientTls:
        """Trust and identity for the relay connection: ``[tls]`` here, else the
        ``$MELLAN_CA_FILE``/``$MELLAN_CLIENT_CERT`` defaults every mellan client uses."""
        ca = self.verify if isinstance(self.verify, str) else None
        base = transport.client_tls(ca, stored=self.stored_tls, environ=environ)
        if self.cert is None:
            return base
        return ClientTls(base.ca_file, Path(self.cert[0]), Path(self.cert[1]))

    @property
    def spool_dir(self) -> Path:
        return self.state_dir / "spool"

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"


def default_path(env: Mapping[str, str] | None = None) -> Path:
    return xdg("config", env) / "mellan" / "receiver.toml"


def _expand(text: str, env: Mapping[str, str]) -> Path:
    if text.startswith("~/") or text == "~":
        home = env.get("HOME") or str(Path.home())
        text = home + text[1:]
    return Path(text)


def _known(table: Mapping[str, Any], keys: tuple[str, ...], where: str) -> None:
    unknown = sorted(str(k) for k in table if k not in keys)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
            f"it takes {', '.join(keys)}"
        )


def _text(table: Mapping[str, Any], key: str, where: str) -> str | None:
    value = table.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value or "\0" in value:
        raise ConfigError(f"{where}{key} must be non-empty text, got {value!r}")
    return value


def _texts(table: Mapping[str, Any], key: str, where: str) -> list[str]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}{key} must be a list of text, got {value!r}")
    return list(value)


def _number(
    table: Mapping[str, Any], key: str, default: float, low: float, high: float, where: str = ""
) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ConfigError(f"{where}{key} must be a number from {low:g} to {high:g}, got {value!r}")
    return float(value)


def _flag(table: Mapping[str, Any], key: str, where: str) -> bool:
    value = table.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}{key} must be true or false, got {value!r}")
    return value


def _listings(table: Any) -> dict[str, dict[str, frozenset[str]]]:
    """``[allow.options.ADAPTER]``: per option, the exact values a route may choose."""
    if table is None:
        return {}
    if not isinstance(table, Mapping):
        raise ConfigError("[allow.options] must hold one table per adapter ([allow.options.NAME])")
    out: dict[str, dict[str, frozenset[str]]] = {}
    for adapter, keys in table.items():
        where = f"allow.options.{adapter}"
        if adapter not in ADAPTERS:
            raise ConfigError(f"{where}: no adapter is named {adapter!r}")
        if not isinstance(keys, Mapping):
            raise ConfigError(f"[{where}] must be a table of OPTION = [values]")
        rules = route_rules(adapter)
        listed: dict[str, frozenset[str]] = {}
        for key, values in keys.items():
            option = rules.get(key)
            if option is None:
                raise ConfigError(f"{where}: {adapter} has no option {key!r}")
            if option.kind not in ro.LISTABLE:
                raise ConfigError(f"{where}.{key}: {_not_listable(option)}")
            if not isinstance(values, list):
                raise ConfigError(f"{where}.{key} must be a list of the values a route may use")
            for value in values:
                if option.kind == ro.ORDERED and ro.canonical(value) in option.bypass:
                    raise ConfigError(
                        f"{where}.{key}: {value!r} turns the guard rails off; that is "
                        "allow.bypass, not a listed value"
                    )
                if option.kind == ro.ORDERED and ro.canonical(value) not in (option.ranks or {}):
                    raise ConfigError(f"{where}.{key}: {value!r} is not one of its settings")
                if option.items and not isinstance(value, str):
                    raise ConfigError(
                        f"{where}.{key} lists items one by one (text; KEY=VALUE for a map), "
                        f"got {value!r}"
                    )
            listed[str(key)] = ro.listed_keys(option, values)
        out[str(adapter)] = listed
    return out


def _local_program(adapter: str, options: dict[str, Any], env: Mapping[str, str]) -> None:
    """This machine's own program is named the way a route's must be (see the wall): an
    absolute path (``~/`` expanded here) or a bare name, never a path relative to wherever
    the turn runs."""
    for key, option in route_rules(adapter).items():
        value = options.get(key)
        if option.kind != ro.PROGRAM or value is None:
            continue
        argv = option.program is None and isinstance(value, list) and bool(value)
        name = value[0] if argv else value
        if not isinstance(name, str) or "/" not in name:
            continue
        if name.startswith("~"):
            name = str(_expand(name, env))
            options[key] = [name, *value[1:]] if argv else name
        if not name.startswith("/"):
            raise ConfigError(
                f"[adapters.{adapter}] {key}: {name!r} is relative; give an absolute path, or "
                "a bare name looked up on this machine's PATH"
            )


def _not_listable(option: ro.RouteOption) -> str:
    return {
        ro.FREE: "a route may set it freely (within the adapter's checks); nothing to list",
        ro.LIMIT: "a route may only lower it; set this machine's bound in [adapters.NAME]",
        ro.ADDS: "a route may only add to it; set this machine's list in [adapters.NAME]",
        ro.SUBSET: "a route may only choose among this machine's list; set it in [adapters.NAME]",
        ro.PROGRAM: "programs are listed in allow.programs",
        ro.DIRS: "directories are listed in allow.cwd",
        ro.URL: "URLs are listed in allow.urls",
        ro.ENV: "environment from routes is switched with allow.route_env",
    }.get(option.kind, "it cannot be listed")


def _notices(allow: AllowList, adapters: Mapping[str, Mapping[str, Any]],
             profiles: Mapping[str, Mapping[str, Any]]) -> tuple[str, ...]:  # fmt: skip
    """What the receiver says about its wall when it starts (see ``ReceiverConfig``)."""
    lines = []
    for prefix in allow.urls:
        why = prefix_problem(prefix)
        if why:
            lines.append(f"warning: allow.urls entry {prefix!r} covers no URL: {why}")
    if allow.bypass:
        lines.append(
            "allow.bypass = true: routes may turn the coding agents' guard rails off "
            "(bypassPermissions, danger-full-access, bypass_sandbox)"
        )
    layers = [(f"[adapters.{a}]", a, o) for a, o in adapters.items()]
    layers += [(f"[profiles.{p}]", a, o) for p, o in profiles.items() for a in allow.adapters]
    for where, adapter, options in layers:
        if adapter not in allow.adapters:
            continue
        rules = route_rules(adapter)
        for key, value in options.items():
            option = rules.get(key)
            if (
                option is not None
                and option.kind == ro.ORDERED
                and (ro.canonical(value) in option.bypass)
            ):
                lines.append(
                    f"{where} {key} = {value!r}: the {adapter} agent runs with its guard rails "
                    "off (this machine's own choice)"
                )
    return tuple(dict.fromkeys(lines))


def _allow(table: Any, env: Mapping[str, str]) -> AllowList:
    if not isinstance(table, Mapping):
        raise ConfigError("[allow] is required: which adapters and directories this receiver runs")
    _known(table, ALLOW_KEYS, "[allow]")
    adapters = _texts(table, "adapters", "allow.")
    for name in adapters:
        if name not in ADAPTERS:
            raise ConfigError(
                f"allow.adapters: no adapter is named {name!r}; the adapters are "
                f"{', '.join(ADAPTERS)}"
            )
    dirs = []
    for d in _texts(table, "cwd", "allow."):
        path = _expand(d, env)
        if not path.is_absolute():
            raise ConfigError(f"allow.cwd: {d!r} must be an absolute path (or start with ~/)")
        dirs.append(os.path.realpath(path))
    programs = []
    for p in _texts(table, "programs", "allow."):
        try:  # "./x" must stay relative (and refused), not become the bare name "x"
            name = str(_expand(p, env)) if p.startswith("~") else p
            programs.append(resolve_program(name, env.get("PATH")))
        except ProgramNotFound as exc:
            raise ConfigError(f"allow.programs: {p!r}: {exc}") from None
    return AllowList(
        adapters=frozenset(adapters),
        dirs=tuple(dirs),
        programs=frozenset(programs),
        urls=tuple(_texts(table, "urls", "allow.")),
        bypass=_flag(table, "bypass", "allow."),
        route_env=_flag(table, "route_env", "allow."),
        options=_listings(table.get("options")),
    )


def _tables(value: Any, where: str) -> dict[str, dict[str, Any]]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(v, Mapping) for v in value.values()):
        raise ConfigError(f"[{where}] must hold one table per name ([{where}.NAME])")
    return {str(k): dict(v) for k, v in value.items()}


def _wake(table: Any, env: Mapping[str, str]) -> Wake | None:
    if table is None:
        return None
    if not isinstance(table, Mapping):
        raise ConfigError("[wake] must be a table")
    _known(table, WAKE_KEYS, "[wake]")
    listen = _text(table, "listen", "wake.")
    if listen is None:
        raise ConfigError("wake.listen is required: HOST:PORT to listen on, e.g. 127.0.0.1:8790")
    host, sep, port_text = listen.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigError(f"wake.listen must be HOST:PORT, got {listen!r}")
    secret = _text(table, "secret", "wake.")
    secret_env = _text(table, "secret_env", "wake.")
    if secret_env is not None:
        secret = env.get(secret_env) or None
        if secret is None:
            raise ConfigError(f"wake.secret_env: the variable {secret_env} is not set")
    if not secret:
        raise ConfigError("[wake] needs secret or secret_env: wake-ups are signed")
    return Wake(host.strip("[]"), int(port_text), secret)


def _credential_path(data: Mapping[str, Any], env: Mapping[str, str]) -> Path | None:
    """The credential file the configuration names (``credential`` or ``agent``), if any."""
    from melchior.mellan.credentials import agent_file

    path_text = _text(data, "credential", "")
    agent = _text(data, "agent", "")
    return _expand(path_text, env) if path_text else agent_file(agent, env) if agent else None


def _credential(
    data: Mapping[str, Any], env: Mapping[str, str]
) -> tuple[str, str | None, str, dict[str, str]]:
    """(token, relay from the credential file if any, a name for this receiver, the TLS
    files ``mellan join --ca-file`` stored with it)."""
    from melchior.mellan.credentials import agent_file

    path_text = _text(data, "credential", "")
    agent = _text(data, "agent", "")
    token_env = _text(data, "token_env", "")
    given = [k for k, v in (("credential", path_text), ("agent", agent)) if v]
    if len(given) > 1:
        raise ConfigError("give one of credential (a file) or agent (a stored join), not both")
    path = _expand(path_text, env) if path_text else agent_file(agent) if agent else None
    if path is not None:
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(
                f"credential: {path} does not exist (run 'mellan join CODE --relay URL' on "
                "this machine first)"
            ) from None
        except (OSError, ValueError) as exc:
            raise ConfigError(f"credential: cannot read {path}: {exc}") from exc
        if not isinstance(stored, dict) or not isinstance(stored.get("token"), str):
            raise ConfigError(f"credential: {path} is not a mellan agent credential")
        relay = stored.get("relay")
        name = str(stored.get("agent") or agent or path.stem)
        tls = {k: v for k, v in stored.items()
               if k in ("ca_file", "client_cert", "client_key") and isinstance(v, str)}  # fmt: skip
        return stored["token"], relay if isinstance(relay, str) else None, name, tls
    var = token_env or "MELLAN_TOKEN"
    token = env.get(var)
    if not token:
        raise ConfigError(
            f"no credential: set credential = PATH or agent = ID in the config, or the "
            f"token in ${var}"
        )
    return token, None, "receiver", {}


def _key_file(data: Mapping[str, Any], env: Mapping[str, str]) -> Path | None:
    path = _credential_path(data, env)
    return path.with_suffix(".key") if path is not None else None


def parse(data: Mapping[str, Any], env: Mapping[str, str], source: Path | None) -> ReceiverConfig:
    """A checked configuration from the TOML document ``data``."""
    _known(data, TOP_KEYS, "the receiver configuration")
    token, stored_relay, who, stored_tls = _credential(data, env)
    relay = _text(data, "relay", "") or env.get("MELLAN_RELAY") or stored_relay
    if not relay:
        raise ConfigError("relay is required: the relay's URL (or a credential file naming it)")
    if not re.match(r"^https?://[^/\s]+", relay):
        raise ConfigError(f"relay must be an http(s) URL, got {relay!r}")
    try:  # the one rule every mellan client keeps: no credential in clear on the network
        transport.check_url(relay, credential=True)
    except transport.TransportError as exc:
        raise ConfigError(f"relay: {exc}") from None
    name = _text(data, "name", "") or who
    if not re.fullmatch(r"[A-Za-z0-9._/-]{1,100}", name):
        raise ConfigError(f"name must be letters, digits, '.', '_', '-' or '/', got {name!r}")
    state_text = _text(data, "state_dir", "")
    state_dir = (
        _expand(state_text, env)
        if state_text
        else xdg("data", env) / "mellan" / "receiver" / name.replace("/", "-")
    )
    adapters = _tables(data.get("adapters"), "adapters")
    for adapter, options in adapters.items():
        _local_program(adapter, options, env)
        try:
            runtime_for(adapter, options)
        except RuntimeConfigError as exc:
            # a partial table (no argv: routes give it) is fine; a typo or wrong type is not
            if "is required" not in str(exc):
                raise ConfigError(f"[adapters.{adapter}]: {exc}") from exc
    tls = data.get("tls") or {}
    if not isinstance(tls, Mapping):
        raise ConfigError("[tls] must be a table")
    _known(tls, TLS_KEYS, "[tls]")
    ca = _text(tls, "ca", "tls.")
    cert, key = _text(tls, "cert", "tls."), _text(tls, "key", "tls.")
    if (cert is None) != (key is None):
        raise ConfigError("tls.cert and tls.key go together (the client certificate for mTLS)")
    allow = _allow(data.get("allow"), env)
    profiles = _tables(data.get("profiles"), "profiles")
    return ReceiverConfig(
        relay=relay.rstrip("/"),
        token=token,
        name=name,
        concurrency=int(_number(data, "concurrency", 1, 1, 256)),
        lease_seconds=_number(data, "lease_seconds", 30, 3, 3600),
        wait=_number(data, "wait", 25, 0, 60),
        state_dir=state_dir,
        allow=allow,
        adapters=adapters,
        profiles=profiles,
        wake=_wake(data.get("wake"), env),
        poll=_number(data, "poll", 5, 0.1, 86400),
        progress_debounce=_number(data, "progress_debounce", 0.2, 0, 60),
        worker=_text(data, "worker", ""),
        verify=str(_expand(ca, env)) if ca else True,
        cert=(str(_expand(cert, env)), str(_expand(key, env))) if cert and key else None,
        stored_tls=stored_tls,
        source=source,
        key_file=_key_file(data, env),
        pins_dir=xdg("config", env) / "mellan",
        notices=_notices(allow, adapters, profiles),
    )


def load(path: Path | None = None, env: Mapping[str, str] | None = None) -> ReceiverConfig:
    """Read and check the configuration at ``path`` (default: :func:`default_path`)."""
    from melchior import tomlfile

    env = os.environ if env is None else env
    path = path or default_path(env)
    try:
        data = tomlfile.read(path)  # bounded: every unreadable file is one line, exit 78
    except FileNotFoundError:
        raise ConfigError(
            f"no receiver configuration at {path} (see docs/receiver.md for an example; "
            "pass --config FILE)"
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    except tomlfile.TomlFileError as exc:
        raise ConfigError(str(exc)) from None
    return parse(data, env, path.resolve())
