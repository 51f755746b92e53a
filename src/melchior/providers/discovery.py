"""Model discovery: each configured provider's model listing, cached for 24 hours.

The rules (seed 000, "Model discovery"):

- a provider with ``discover = true`` is asked for its listing when its cached one is
  missing or older than :data:`CACHE_TTL`; ``refresh=True`` (``melchior models
  --refresh``) asks regardless of the cache;
- a successful listing replaces that provider's cache, *even an empty one* — a
  provider that withdrew its last model lists nothing, it does not keep old names;
- a failed request keeps the last cached listing (of any age), and the provider's id
  goes in ``failed``;
- a provider with ``discover = false`` is never asked: its configured ``models`` are
  its listing;
- nothing here runs inference.

One JSON file per provider under ``$XDG_CACHE_HOME/melchior/models/`` (default
``~/.cache``), written to a temporary file and moved into place with ``os.replace``,
so a reader never sees half a file and two writers never interleave. The file records
when it was fetched and a fingerprint of ``kind`` and ``base_url``: a listing fetched
from another endpoint is not served for this one. A file that cannot be read, parsed
or trusted is treated as absent.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from melchior.files import atomic_write, xdg
from melchior.providers.client import MAX_LISTED_MODELS, ProviderClient, provider_for
from melchior.providers.config import ProviderConfig
from melchior.providers.errors import ProviderError
from melchior.providers.transport import Limits, RetryPolicy
from melchior.providers.types import ModelCard

log = logging.getLogger("melchior.providers")

CACHE_TTL = 24 * 3600.0
"""Seconds a listing stays fresh."""
CACHE_VERSION = 1
MAX_CACHE_BYTES = 16 * 1024 * 1024

Origin = Literal["fetched", "cache", "stale-cache", "static", "none"]
"""Where a provider's cards came from: asked now, a fresh cache, an old cache kept after
a failure, the config's ``models``, or nowhere (failed with nothing cached)."""


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    return xdg("cache", env) / "melchior" / "models"


def fingerprint(config: ProviderConfig) -> str:
    """Which endpoint a listing came from, without writing its URL (it may hold a key)."""
    return hashlib.sha256(f"{config.kind}\n{config.base_url}".encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Listing:
    fetched_at: float
    models: list[ModelCard]


class ModelCache:
    """One file per provider; reads are forgiving, writes are atomic."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, name: str) -> Path:
        return self.root / f"{name}.json"

    def load(self, config: ProviderConfig) -> Listing | None:
        try:
            with self.path(config.name).open("rb") as f:
                raw = f.read(MAX_CACHE_BYTES + 1)
        except OSError:
            return None
        if len(raw) > MAX_CACHE_BYTES:
            return None
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            return None
        if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
            return None
        fetched, models = data.get("fetched_at"), data.get("models")
        if data.get("source") != fingerprint(config) or not isinstance(fetched, int | float):
            return None
        if not isinstance(models, list) or len(models) > MAX_LISTED_MODELS:
            return None
        for card in models:
            if not (
                isinstance(card, dict)
                and card.get("provider") == config.name
                and isinstance(card.get("id"), str)
            ):
                return None
        return Listing(float(fetched), models)

    def store(self, config: ProviderConfig, models: list[ModelCard], fetched_at: float) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        record = {
            "version": CACHE_VERSION,
            "provider": config.name,
            "kind": config.kind,
            "source": fingerprint(config),
            "fetched_at": fetched_at,
            "models": models,
        }
        text = json.dumps(record, ensure_ascii=False, indent=1) + "\n"
        atomic_write(self.path(config.name), text.encode("utf-8"))


@dataclass
class Discovery:
    """What ``melchior models`` reports: the cards, and how each provider fared."""

    cards: list[ModelCard]
    refreshed: bool
    failed: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)
    origins: dict[str, Origin] = field(default_factory=dict)
    fetched_at: dict[str, float] = field(default_factory=dict)

    @property
    def all_failed(self) -> bool:
        """Every provider asked failed and none had anything current to show."""
        return bool(self.failed) and all(
            origin in ("stale-cache", "none") for origin in self.origins.values()
        )


Factory = Callable[..., ProviderClient]


async def discover(
    configs: Mapping[str, ProviderConfig],
    *,
    refresh: bool = False,
    cache: ModelCache | None = None,
    env: Mapping[str, str] | None = None,
    now: float | None = None,
    limits: Limits | None = None,
    retry: RetryPolicy | None = None,
    factory: Factory = provider_for,
) -> Discovery:
    """List every configured provider's models, from cache where fresh and allowed.

    Providers are asked concurrently. A failure is a provider's, not the call's: it
    lands in ``failed`` with its (redacted) reason, and the others are unaffected.
    """
    store = cache or ModelCache(cache_dir(env))
    moment = time.time() if now is None else now
    result = Discovery([], refreshed=refresh)
    per: dict[str, list[ModelCard]] = {}
    to_ask: list[tuple[ProviderConfig, Listing | None]] = []
    for name, config in configs.items():
        if not config.discover:
            per[name] = [{"provider": name, "id": m, "kind": config.kind} for m in config.models]
            result.origins[name] = "static"
            continue
        listing = store.load(config)
        if not refresh and listing is not None and 0 <= moment - listing.fetched_at < CACHE_TTL:
            per[name] = listing.models
            result.origins[name] = "cache"
            result.fetched_at[name] = listing.fetched_at
        else:
            to_ask.append((config, listing))

    async def ask(config: ProviderConfig, listing: Listing | None) -> None:
        name = config.name
        try:
            async with factory(config, env=env, limits=limits, retry=retry) as client:
                models = await client.list_models()
        except ProviderError as exc:
            result.failed.append(name)
            result.reasons[name] = str(exc)
            per[name] = listing.models if listing is not None else []
            result.origins[name] = "stale-cache" if listing is not None else "none"
            if listing is not None:
                result.fetched_at[name] = listing.fetched_at
            return
        per[name] = models
        result.origins[name] = "fetched"
        result.fetched_at[name] = moment
        try:
            store.store(config, models, moment)
        except OSError as exc:
            log.warning("model cache for %s not written: %s", name, exc)

    if to_ask:
        async with asyncio.TaskGroup() as group:
            for config, listing in to_ask:
                group.create_task(ask(config, listing))
    order = list(configs)
    result.failed.sort(key=order.index)
    for name in order:
        result.cards += sorted(per.get(name, []), key=lambda card: str(card["id"]))
    return result
