"""Prices used to turn token counts into dollars.

The table below holds *editable defaults*: list prices (USD per one million tokens) of a few
hosted models as we last knew them, plus zero for everything that runs locally. Providers change
prices often, so callers who care about exact cost pass overrides, either as a mapping or as a
JSON file named by the ``SUFFICE_PRICES`` environment variable. A model missing from every table
costs 0, so an unknown name never breaks a run; the receipt still carries its token counts.

Override format (mapping or JSON object), any of::

    {"my-model": {"input": 0.5, "output": 1.5}}
    {"my-model": [0.5, 1.5]}
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from .base import Price

PRICES_ENV = "SUFFICE_PRICES"

DEFAULT_PRICES: dict[str, Price] = {
    # Local and test backends: no money changes hands; their cost is time.
    "qwen2.5-0.5b": Price(0.0, 0.0),
    "smollm2-135m": Price(0.0, 0.0),
    "scripted": Price(0.0, 0.0),
    "local": Price(0.0, 0.0),
    # Hosted models (list prices, USD per 1M input / output tokens; editable defaults).
    "gpt-4o": Price(2.50, 10.00),
    "gpt-4o-mini": Price(0.15, 0.60),
    "gpt-4.1": Price(2.00, 8.00),
    "gpt-4.1-mini": Price(0.40, 1.60),
    "gpt-4.1-nano": Price(0.10, 0.40),
    "gpt-3.5-turbo": Price(0.50, 1.50),
    "claude-3-5-haiku": Price(0.80, 4.00),
    "claude-3-5-sonnet": Price(3.00, 15.00),
    "claude-sonnet-4": Price(3.00, 15.00),
}


def _as_price(name: str, value: Any) -> Price:
    if isinstance(value, Price):
        return value
    try:
        pair: tuple[float, float] | None = None
        # A misspelt key ({"inpt": 1}) would price the model at zero without a word.
        if isinstance(value, Mapping) and set(value) <= {"input", "output"}:
            pair = (float(value.get("input", 0.0)), float(value.get("output", 0.0)))
        elif isinstance(value, list | tuple) and len(value) == 2:
            pair = (float(value[0]), float(value[1]))
        if pair is not None and all(math.isfinite(x) and x >= 0 for x in pair):
            return Price(*pair)
    except (TypeError, ValueError):
        pass
    raise ConfigError(
        f"price for {name!r} must be {{'input': x, 'output': y}} or [x, y], finite and not negative, in USD "
        f"per 1M tokens,"
        f" got {value!r}"
    )


def _normalise(table: Mapping[str, Any]) -> dict[str, Price]:
    return {str(k).lower(): _as_price(str(k), v) for k, v in table.items()}


def load_price_file(path: str | os.PathLike[str]) -> dict[str, Price]:
    """Read a JSON price table; a broken file is a configuration error, not a silent zero."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read price file {p} (from ${PRICES_ENV}): {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"price file {p} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"price file {p} must hold a JSON object mapping model names to prices")
    return _normalise(data)


def price_table(overrides: Mapping[str, Any] | None = None) -> dict[str, Price]:
    """Defaults, then the ``$SUFFICE_PRICES`` file, then ``overrides``; later entries win."""
    table = dict(DEFAULT_PRICES)
    env_path = os.environ.get(PRICES_ENV)
    if env_path:
        table.update(load_price_file(env_path))
    if overrides:
        table.update(_normalise(overrides))
    return table


def price_for(model: str, overrides: Mapping[str, Any] | None = None) -> Price:
    """Price of ``model``: exact name, then without a ``provider/`` prefix, then longest prefix.

    The prefix rule lets dated snapshots (``gpt-4o-mini-2024-07-18``) inherit their family's
    price. Unknown models cost 0.
    """
    table = price_table(overrides)
    name = model.strip().lower()
    candidates = [name]
    if "/" in name:
        candidates.append(name.rsplit("/", 1)[1])
    for cand in candidates:
        if cand in table:
            return table[cand]
    for cand in candidates:
        best = max((k for k in table if cand.startswith(k)), key=len, default=None)
        if best is not None:
            return table[best]
    return Price(0.0, 0.0)


__all__ = ["DEFAULT_PRICES", "PRICES_ENV", "load_price_file", "price_for", "price_table"]
