"""Coverage-guided fuzz targets (atheris) for what takes outside input.

    python benchmarks/fuzz_targets.py items -runs=10000
    python benchmarks/fuzz_targets.py messages|query|locomo -runs=10000

A target passes when no input raises anything but a SufficeError (and the store stays sound);
a crashing input is written by libFuzzer as ``crash-*`` and belongs in ``tests/test_fuzz.py``.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import atheris

from suffice import Memory, NewItem, SufficeError
from suffice._datasets.locomo import load_locomo
from suffice._embed.hashing import HashEmbedder

TMP = Path(tempfile.mkdtemp())
MEM = Memory(TMP / "fuzz.db", embedder=HashEmbedder())
MEM.add([NewItem(f"seed item {i} about rivers and cats", session=f"s{i % 3}") for i in range(20)],
        scope="fuzz")
RUNS = [0]


def _json_or_text(data: atheris.FuzzedDataProvider) -> object:
    raw = data.ConsumeUnicodeNoSurrogates(data.remaining_bytes())
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def items(buf: bytes) -> None:
    value = _json_or_text(atheris.FuzzedDataProvider(buf))
    try:
        MEM.add(value, scope="fuzz")  # type: ignore[arg-type]
    except SufficeError:
        pass
    _every(200)


def messages(buf: bytes) -> None:
    data = atheris.FuzzedDataProvider(buf)
    role = data.PickValueInList(["user", "assistant", "tool", "system", "bot"])
    value = _json_or_text(data)
    msg = value if isinstance(value, dict) else {"content": value}
    try:
        MEM.add([{"role": role, **msg}], user_id="u")
    except SufficeError:
        pass
    _every(200)


def query(buf: bytes) -> None:
    data = atheris.FuzzedDataProvider(buf)
    budget = data.ConsumeIntInRange(-10, 5000)
    text = data.ConsumeUnicode(data.remaining_bytes())
    try:
        MEM.search(text, scope="fuzz", k=5)
    except SufficeError:
        pass
    try:
        ctx = MEM.render(text, budget, scope="fuzz")
        if ctx.tokens > ctx.cap:
            raise AssertionError(f"render over its cap: {ctx.tokens} > {ctx.cap}")
    except SufficeError:
        pass


def locomo(buf: bytes) -> None:
    path = TMP / "in.json"
    path.write_bytes(buf)
    try:
        load_locomo(path)
    except SufficeError:
        pass


def _every(n: int) -> None:
    """Now and then, the store must still be sound."""
    RUNS[0] += 1
    if RUNS[0] % n == 0:
        problems = MEM.store.check()
        if problems:
            raise AssertionError(f"the store is broken: {problems}")


TARGETS = {"items": items, "messages": messages, "query": query, "locomo": locomo}

if __name__ == "__main__":
    target = TARGETS[sys.argv.pop(1)]
    atheris.instrument_all()  # coverage feedback from every Python function loaded, suffice's included
    atheris.Setup(sys.argv, target)
    atheris.Fuzz()
