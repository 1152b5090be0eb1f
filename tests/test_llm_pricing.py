"""The price table: defaults, lookup rules and overrides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from suffice._errors import ConfigError
from suffice._llm import Price, price_for
from suffice._llm.pricing import DEFAULT_PRICES


def test_local_models_are_free_and_unknown_models_cost_nothing() -> None:
    assert price_for("qwen2.5-0.5b") == Price(0, 0)
    assert price_for("smollm2-135m") == Price(0, 0)
    assert price_for("some-model-nobody-knows") == Price(0, 0)


def test_lookup_rules() -> None:
    assert price_for("gpt-4o-mini") == DEFAULT_PRICES["gpt-4o-mini"]
    assert price_for("GPT-4o-mini") == DEFAULT_PRICES["gpt-4o-mini"]
    assert price_for("openai/gpt-4o") == DEFAULT_PRICES["gpt-4o"]
    # a dated snapshot takes the longest matching family name
    assert price_for("gpt-4o-mini-2024-07-18") == DEFAULT_PRICES["gpt-4o-mini"]
    assert price_for("gpt-4o-2024-08-06") == DEFAULT_PRICES["gpt-4o"]


def test_cost_arithmetic() -> None:
    # 1,000 input tokens at $2.50/M plus 500 output tokens at $10/M
    assert price_for("gpt-4o").cost(1000, 500) == pytest.approx(0.0025 + 0.005)


def test_overrides_from_mapping() -> None:
    assert price_for("mine", {"mine": {"input": 1, "output": 2}}) == Price(1.0, 2.0)
    assert price_for("mine", {"mine": [0.5, 1.5]}) == Price(0.5, 1.5)
    assert price_for("gpt-4o", {"gpt-4o": Price(9, 9)}) == Price(9, 9)
    with pytest.raises(ConfigError, match="price for 'mine'"):
        price_for("mine", {"mine": "cheap"})


def test_overrides_from_env_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "prices.json"
    f.write_text(json.dumps({"gpt-4o": {"input": 1, "output": 1}, "house-model": [3, 4]}))
    monkeypatch.setenv("SUFFICE_PRICES", str(f))
    assert price_for("gpt-4o") == Price(1, 1)
    assert price_for("house-model") == Price(3, 4)
    # an explicit mapping beats the file
    assert price_for("house-model", {"house-model": [5, 6]}) == Price(5, 6)


def test_broken_env_file_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "prices.json"
    f.write_text("{not json")
    monkeypatch.setenv("SUFFICE_PRICES", str(f))
    with pytest.raises(ConfigError, match="not valid JSON"):
        price_for("x")
    monkeypatch.setenv("SUFFICE_PRICES", str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match="cannot read price file"):
        price_for("x")


@pytest.mark.parametrize("entry", [{"inpt": 1.0}, {"input": -1.0}, [1.0, float("inf")],
                                   {"input": 1, "outptu": 2}])
def test_a_price_entry_that_would_cost_wrongly_is_a_config_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entry: object) -> None:
    """A misspelt key priced the model at zero; a negative or infinite price made every receipt wrong."""
    f = tmp_path / "prices.json"
    f.write_text(json.dumps({"my-model": entry}).replace("Infinity", "1e999"))
    monkeypatch.setenv("SUFFICE_PRICES", str(f))
    with pytest.raises(ConfigError, match="finite and not negative"):
        price_for("my-model")
