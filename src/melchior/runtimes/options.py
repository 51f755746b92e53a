"""Reading adapter options: typed, bounded, and loud about anything it does not know.

Options come from configuration files and approved routes that a person typed. A typo
(``permision_mode``) silently ignored would run an agent with defaults nobody chose, so
an unknown name is an error that lists the names the adapter does know, and every value
is checked for type and range with the option's name in the message.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from melchior.runtimes.base import RuntimeConfigError


class OptionReader:
    """Typed access to one adapter's options, refusing unknown names up front."""

    def __init__(self, adapter: str, raw: Mapping[str, Any], known: Iterable[str]) -> None:
        if not isinstance(raw, Mapping):
            raise RuntimeConfigError(
                f"{adapter}: options must be a mapping, got {type(raw).__name__}"
            )
        known_set = set(known)
        unknown = sorted(str(k) for k in raw if k not in known_set)
        if unknown:
            raise RuntimeConfigError(
                f"{adapter}: unknown option{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(unknown)}; this adapter takes {', '.join(sorted(known_set))}"
            )
        self.adapter = adapter
        self.raw = raw

    def _bad(self, key: str, wants: str) -> RuntimeConfigError:
        return RuntimeConfigError(
            f"{self.adapter}: option {key} must be {wants}, got {self.raw.get(key)!r}"
        )

    def text(self, key: str, default: str, *, choices: Iterable[str] | None = None) -> str:
        value = self.opt_text(key, choices=choices)
        return default if value is None else value

    def opt_text(self, key: str, *, choices: Iterable[str] | None = None) -> str | None:
        value = self.raw.get(key)
        if value is None:
            return None
        allowed = tuple(choices) if choices is not None else None
        if not isinstance(value, str) or not value or "\0" in value:
            raise self._bad(
                key, "non-empty text" + (f", one of {', '.join(allowed)}" if allowed else "")
            )
        if allowed is not None and value not in allowed:
            raise self._bad(key, f"one of {', '.join(allowed)}")
        return value

    def required_text(self, key: str) -> str:
        value = self.opt_text(key)
        if value is None:
            raise RuntimeConfigError(f"{self.adapter}: option {key} is required")
        return value

    def opt_number(self, key: str, *, low: float, high: float) -> float | None:
        value = self.raw.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._bad(key, f"a number from {low:g} to {high:g}")
        if not math.isfinite(value) or not low <= value <= high:
            raise self._bad(key, f"a number from {low:g} to {high:g}")
        return float(value)

    def number(self, key: str, default: float, *, low: float, high: float) -> float:
        value = self.opt_number(key, low=low, high=high)
        return default if value is None else value

    def opt_integer(self, key: str, *, low: int, high: int) -> int | None:
        value = self.raw.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self._bad(key, f"a whole number from {low} to {high}")
        return value

    def integer(self, key: str, default: int, *, low: int, high: int) -> int:
        value = self.opt_integer(key, low=low, high=high)
        return default if value is None else value

    def flag(self, key: str, default: bool) -> bool:
        value = self.raw.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._bad(key, "true or false")
        return value

    def texts(self, key: str) -> tuple[str, ...]:
        value = self.raw.get(key)
        if value is None:
            return ()
        if isinstance(value, str) or not isinstance(value, list | tuple):
            raise self._bad(key, "a list of text")
        for item in value:
            if not isinstance(item, str) or "\0" in item:
                raise self._bad(key, "a list of text")
        return tuple(value)

    def integers(
        self, key: str, default: tuple[int, ...], *, low: int, high: int
    ) -> tuple[int, ...]:
        value = self.raw.get(key)
        if value is None:
            return default
        if not isinstance(value, list | tuple) or not all(
            isinstance(v, int) and not isinstance(v, bool) and low <= v <= high for v in value
        ):
            raise self._bad(key, f"a list of whole numbers from {low} to {high}")
        return tuple(value)

    def text_map(self, key: str) -> dict[str, str]:
        value = self.raw.get(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and k and isinstance(v, str) and "\0" not in k + v
            for k, v in value.items()
        ):
            raise self._bad(key, "a mapping of text to text")
        return dict(value)

    def env_map(self, key: str) -> dict[str, str]:
        env = self.text_map(key)
        for name in env:
            if "=" in name:
                raise self._bad(key, "a mapping of variable names (no '=') to text")
        return env


def layered(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """The options of one turn: the adapter's configuration with the route's on top."""
    return {**base, **over}
