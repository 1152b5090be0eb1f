"""Records and links are written once per closed unit, by a fixed rule unless a writer is set."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from conftest import history_items

from suffice import Memory, StoreConfig, StoreConfigError
from suffice._records import fit_line, rule_record
from suffice._tokens import count_tokens
from suffice._types import Item

SMALL_UNITS = StoreConfig(unit_tokens=200)


def _item(seq: int, text: str, speaker: str = "Dana", at: str = "2025-03-02") -> Item:
    return Item(f"i{seq}", "s", seq, "s1", speaker, "user", "message", at, text, {}, count_tokens(text))


def test_rule_record_says_when_who_and_what_within_its_token_limit() -> None:
    items = [
        _item(0, "Hi there!"),
        _item(1, "I just started a new job as a hydrologist at the river authority in Porto.",
              at="2025-03-02"),
        _item(2, "Congratulations! What will the hydrologist job involve?", speaker="Assistant",
              at="2025-03-04"),
    ]
    rec = rule_record(items, max_tokens=40)
    assert rec.startswith("[2025-03-02 - 2025-03-04] Dana, Assistant: ")
    assert "hydrologist" in rec  # the most frequent content word leads the gist
    assert count_tokens(rec) <= 40
    assert rule_record(items, max_tokens=40) == rec  # a fixed rule: same items, same line


def test_an_agent_run_is_shown_by_step_not_by_position_in_the_log() -> None:
    def step(seq: int, n: int, text: str, speaker: str = "agent") -> Item:
        return Item(f"i{seq}", "s", seq, "run", speaker, "assistant", "action", "", text, {"step": n},
                    count_tokens(text))

    items = [step(84, 44, "close drawer 13"), step(85, 45, "go to drawer 14"),
             step(86, 45, "You arrive at drawer 14.", "environment")]
    assert rule_record(items, max_tokens=40).startswith("[steps 44-45] agent, environment: ")
    assert rule_record(items[1:], max_tokens=40).startswith("[step 45] ")
    assert items[1].render() == "[step 45] agent: go to drawer 14"  # what every context shows
    assert _item(0, "Hi").render() == "[2025-03-02] Dana: Hi"     # items without steps: unchanged


def test_rule_record_is_cut_at_a_word_with_an_ellipsis() -> None:
    long = " ".join(f"word{i} alpha beta gamma." for i in range(60))
    rec = rule_record([_item(0, long)], max_tokens=20)
    assert count_tokens(rec) <= 20 and rec.endswith("…")
    assert fit_line("short line", 10) == "short line"
    assert fit_line("a b c d e f g h i j k l m n o p", 5).endswith("…")


def test_without_times_a_record_names_the_item_range() -> None:
    rec = rule_record([_item(3, "ran the tests", at=""), _item(4, "all green", at="")])
    assert rec.startswith("[#3-4] Dana: ")


def test_every_closed_unit_has_one_record_and_the_open_unit_none(tmp_path: Path, embedder) -> None:  # type: ignore[no-untyped-def]
    with Memory(tmp_path / "m.db", store_config=SMALL_UNITS, embedder=embedder) as mem:
        mem.add(history_items(), scope="dana")
        units = mem.retriever.index("dana").views.units
        records = mem.store.records("dana")
        assert [r[0] for r in records] == [u.index for u in units if u.closed]
        assert not units[-1].closed and units[-1].index not in {r[0] for r in records}
        for (unit, first, last, text, writer), u in zip(records, units, strict=False):
            assert (unit, first, last, writer) == (u.index, u.first_seq, u.last_seq, "rule")
            assert count_tokens(text) <= SMALL_UNITS.record_tokens


def test_records_and_links_never_change_and_match_a_one_batch_build(tmp_path: Path, embedder) -> None:  # type: ignore[no-untyped-def]
    items = history_items()
    with Memory(tmp_path / "a.db", store_config=SMALL_UNITS, embedder=embedder) as grown:
        grown.add(items[:9], scope="dana")
        early = grown.store.records("dana")
        early_links = grown.store.links("dana")
        grown.add(items[9:20], scope="dana")
        grown.add(items[20:], scope="dana")
        later = grown.store.records("dana")
        later_links = grown.store.links("dana")
    assert later[:len(early)] == early
    assert set(early_links) <= set(later_links)
    with Memory(tmp_path / "b.db", store_config=SMALL_UNITS, embedder=embedder) as whole:
        whole.add(items, scope="dana")
        assert whole.store.records("dana") == later
        assert sorted(whole.store.links("dana")) == sorted(later_links)


def test_content_links_point_to_at_most_m_earlier_units(tmp_path: Path, embedder) -> None:  # type: ignore[no-untyped-def]
    cfg = SMALL_UNITS.replace(links_per_unit=2)
    with Memory(tmp_path / "m.db", store_config=cfg, embedder=embedder) as mem:
        mem.add(history_items(), scope="dana")
        links = mem.store.links("dana")
        assert links, "a history that returns to its topics links its units"
        per_src: dict[int, int] = {}
        for src, dst, kind, weight in links:
            assert kind == "content" and dst < src - 1  # earlier, and not the temporal neighbour
            assert 0 < weight <= 1.0001
            per_src[src] = per_src.get(src, 0) + 1
        assert max(per_src.values()) <= 2


def test_writing_again_writes_nothing(memory: Memory) -> None:
    before = memory.store.records("dana")
    assert memory.records.write_new("dana") == 0
    assert memory.store.records("dana") == before


def test_a_configured_writer_writes_the_gist(tmp_path: Path, embedder) -> None:  # type: ignore[no-untyped-def]
    def writer(items: Sequence[Item]) -> str:
        return f"{len(items)} turns about work and travel\nignored second line"

    writer.name = "fake-llm"  # type: ignore[attr-defined]
    with Memory(tmp_path / "m.db", store_config=SMALL_UNITS, embedder=embedder, record_writer=writer) as mem:
        mem.add(history_items(), scope="dana")
        records = mem.store.records("dana")
        assert records and all(r[4] == "fake-llm" for r in records)
        first = records[0][3]
        assert first.startswith("[2025-03-02] ") and first.endswith("turns about work and travel")
        assert mem.records.summary("dana")["writers"] == {"fake-llm": len(records)}


@pytest.mark.parametrize("result", [RuntimeError("model down"), "", "   "])
def test_a_failing_writer_falls_back_to_the_rule(tmp_path: Path, embedder, result: object) -> None:  # type: ignore[no-untyped-def]
    def writer(items: Sequence[Item]) -> str:
        if isinstance(result, Exception):
            raise result
        return str(result)

    with Memory(tmp_path / "w.db", store_config=SMALL_UNITS, embedder=embedder, record_writer=writer) as mem:
        mem.add(history_items(), scope="dana")
        assert all(r[4] == "rule" for r in mem.store.records("dana"))


def test_records_are_written_without_an_embedder_but_without_content_links(tmp_path: Path) -> None:
    with Memory(tmp_path / "m.db", store_config=SMALL_UNITS, embedder=None) as mem:
        mem.add(history_items(), scope="dana")
        assert mem.store.records("dana")
        assert mem.store.links("dana") == []


def test_a_store_refuses_other_unit_sizes_and_rebuilds_its_records_on_request(  # type: ignore[no-untyped-def]
        tmp_path: Path, embedder) -> None:
    from suffice import NewItem
    path = tmp_path / "m.db"
    small = Memory(path, store_config=StoreConfig(unit_tokens=30), embedder=embedder)
    small.add([NewItem(text=f"turn number {i} about the river gauge", session="s") for i in range(12)],
              scope="x")
    unit0 = small.store.records("x")[0]
    assert unit0[0] == 0 and unit0[2] < 11  # a small first unit
    small.close()
    with pytest.raises(StoreConfigError,
                       match=r"unit_tokens 30 \(asked for 2000\).*rebuild --set unit_tokens=2000"):
        Memory(path, store_config=StoreConfig(unit_tokens=2000), embedder=embedder)
    assert Memory(path, embedder=embedder).store_config.unit_tokens == 30  # no config given: the saved one
    big = Memory(path, store_config=StoreConfig(unit_tokens=2000), embedder=embedder, rebuild=True)
    big.add(NewItem(text="a turn of a new session", session="t"), scope="x")
    first = big.retriever.index("x").views.units[0]
    assert (first.first_seq, first.last_seq) == (0, 11)
    assert big.store.records("x")[0][:3] == (0, 0, 11)  # the record was rewritten for the big unit
    assert big.store.load_config()["unit_tokens"] == 2000


def test_a_rebuild_of_records_rewrites_lines_an_older_version_stored(tmp_path: Path, embedder) -> None:  # type: ignore[no-untyped-def]
    """Records are written once; after an upgrade changes their format, an explicit rebuild
    gives every closed unit the current line, and nothing else about the store changes."""
    from typer.testing import CliRunner

    from suffice._cli import app
    path = tmp_path / "m.db"
    with Memory(path, store_config=SMALL_UNITS, embedder=embedder) as mem:
        mem.add(history_items(), scope="dana")
        current = mem.store.records("dana")
        unit, first, last, _text, writer = current[0]
        mem.store.drop_records("dana")  # stand-in for a line an older version wrote
        assert mem.store.put_record("dana", unit, first, last, "[#0-9] an old header", writer, [])
        items = mem.store.stats("dana").items
    with Memory(path, embedder=embedder) as mem:
        assert mem.store.records("dana")[0][3] == "[#0-9] an old header"  # kept: written once
        assert mem.check() == ["scope 'dana': 1 of 1 records are lines an older version "
                               "wrote (write them again: suffice rebuild --records)"]
        counts = mem.rebuild(records=True)
        assert mem.check() == []
        assert counts["records"] == len(current) and counts["vectors"] == 0
        assert mem.store.records("dana") == current
        assert mem.store.stats("dana").items == items
    with Memory(path, embedder=embedder) as mem:
        mem.store.drop_records("dana")
        assert mem.store.put_record("dana", unit, first, last, "[#0-9] an old header", writer, [])
    out = CliRunner().invoke(app, ["--db", str(path), "rebuild", "--records"])
    assert out.exit_code == 0, out.output
    assert f"{len(current)} records written again" in out.output
    with Memory(path, embedder=embedder) as mem:
        assert mem.store.records("dana") == current


def test_a_rebuild_to_a_new_unit_size_with_records_writes_each_record_once(  # type: ignore[no-untyped-def]
        tmp_path: Path, embedder, monkeypatch) -> None:
    """A new unit size already rewrites every record; ``--records`` must not write them again
    (with a model writing records, that would be a second model call per unit)."""
    from typer.testing import CliRunner

    from suffice._cli import app
    from suffice._store.sqlite import SQLiteStore
    path = tmp_path / "m.db"
    with Memory(path, store_config=SMALL_UNITS, embedder=embedder) as mem:
        mem.add(history_items(), scope="dana")
    writes: list[int] = []
    put = SQLiteStore.put_record

    def counted(self, scope, unit, *args, **kwargs):  # type: ignore[no-untyped-def]
        writes.append(unit)
        return put(self, scope, unit, *args, **kwargs)

    monkeypatch.setattr(SQLiteStore, "put_record", counted)
    monkeypatch.setattr("suffice._cli.configured_embedder", lambda: embedder)
    out = CliRunner().invoke(app, ["--db", str(path), "rebuild", "--records", "--set", "unit_tokens=400"])
    assert out.exit_code == 0, out.output
    assert writes and len(writes) == len(set(writes))  # every unit's record, once
    assert f"{len(writes)} records written again" in out.output
    with Memory(path, embedder=embedder) as mem:
        assert len(mem.store.records("dana")) == len(writes)
