"""Property-based fuzzing of what takes outside input: items and chat messages, queries and
filters, budgets, scope names, dataset files. Every input ends in a result or a SufficeError,
and the store stays sound.

A few dozen cases each in the test run; ``SUFFICE_FUZZ_CASES=10000`` (what
``benchmarks/reliability.py fuzz`` sets) runs ten thousand.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from suffice import Memory, NewItem, SufficeError
from suffice._embed.hashing import HashEmbedder

CASES = int(os.environ.get("SUFFICE_FUZZ_CASES", "40"))
FUZZ = settings(max_examples=CASES, deadline=None, suppress_health_check=list(HealthCheck))

json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                        st.text(max_size=40))
json_value = st.recursive(json_scalar, lambda kids: st.lists(kids, max_size=4)
                          | st.dictionaries(st.text(max_size=12), kids, max_size=5), max_leaves=12)
KEYS = ["text", "role", "content", "name", "tool_calls", "tool_call_id", "id", "meta", "session",
        "speaker", "kind", "observed_at", "agent", "function", "arguments", "type", "refusal"]
ROLES = ["user", "assistant", "system", "tool", "developer", "function", "robot", ""]
shaped = st.dictionaries(st.sampled_from(KEYS), st.one_of(json_value, st.sampled_from(ROLES)), max_size=6)
entry = st.one_of(st.text(max_size=200), shaped, json_value)


@pytest.fixture(scope="module")
def mem():
    with tempfile.TemporaryDirectory() as tmp:
        m = Memory(Path(tmp) / "fuzz.db", embedder=HashEmbedder())
        m.add([NewItem(f"seed item {i} about rivers and cats", session=f"s{i % 3}") for i in range(30)],
              scope="fuzz")
        yield m
        assert m.store.check() == []
        m.close()


@FUZZ
@given(st.one_of(entry, st.lists(entry, max_size=5)))
def test_any_item_or_message_is_stored_or_refused_whole(mem, value):
    before = mem.stats("fuzz").items
    try:
        stored = mem.add(value, scope="fuzz")
    except SufficeError:
        assert mem.stats("fuzz").items == before  # refused: nothing written
        return
    assert mem.stats("fuzz").items == before + len([s for s in stored if s.seq >= before])


@FUZZ
@given(st.text(max_size=300), st.integers(-5, 3000), st.sampled_from(["fused", "bm25", "dense", "recency"]))
def test_any_query_and_budget_give_a_result_or_a_clear_error(mem, query, budget, method):
    try:
        ev = mem.search(query, scope="fuzz", k=5, method=method)
        assert len(ev.hits) <= 5
    except SufficeError:
        pass
    try:
        ctx = mem.render(query, budget, scope="fuzz")
        assert ctx.tokens <= ctx.cap
    except SufficeError:
        assert budget < 0 or not isinstance(query, str)


@FUZZ
@given(st.dictionaries(st.sampled_from(["session", "speaker", "kind", "role", "since", "until", "meta"]),
                       json_value, max_size=4))
def test_any_filter_is_applied_or_refused(mem, filters):
    try:
        mem.items(scope="fuzz", **filters)
        mem.search("rivers", scope="fuzz", **filters)
    except SufficeError:
        pass


@FUZZ
@given(st.text(max_size=300))
def test_any_scope_name_has_one_form_or_is_refused(mem, name):
    try:
        items = mem.items(scope=name)
    except SufficeError:
        return
    assert isinstance(items, list)


def _locomo(turns: list[object], date: object) -> list[object]:
    return [{"sample_id": "c1", "conversation": {"speaker_a": "A", "speaker_b": "B",
                                                 "session_1_date_time": date, "session_1": turns},
             "qa": [{"question": "q?", "answer": "a", "evidence": ["D1:1"], "category": 1}]}]


@FUZZ
@given(st.lists(st.one_of(shaped, json_value, st.fixed_dictionaries(
    {"speaker": st.text(max_size=5), "dia_id": st.text(max_size=6),
     "text": st.text(max_size=50)})), max_size=6),
       json_value)
def test_any_locomo_file_is_imported_whole_or_refused_naming_the_record(tmp_path_factory, turns, date):
    from suffice import ImportFormatError
    from suffice._datasets.locomo import load_locomo
    path = tmp_path_factory.mktemp("loc") / "f.json"
    path.write_text(json.dumps(_locomo(turns, date), default=str), encoding="utf-8")
    try:
        convs = load_locomo(path)
    except ImportFormatError:
        return
    assert len(convs) == 1
