"""write_atomic and atomic_file: a reader sees the old file or the new one, and a failed write
leaves no trace."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from suffice._files import atomic_file, write_atomic


def test_text_and_bytes_land_whole_and_replace_the_old_file(tmp_path: Path) -> None:
    p = tmp_path / "sub" / "card.json"
    write_atomic(p, "é first\n")
    assert p.read_text(encoding="utf-8") == "é first\n"
    write_atomic(p, b"\x00\x01second")
    assert p.read_bytes() == b"\x00\x01second"
    assert [f.name for f in p.parent.iterdir()] == ["card.json"]


def test_a_failed_rename_keeps_the_old_file_and_removes_the_temporary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "records.jsonl"
    p.write_text("old\n")

    def broken(src: object, dst: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError, match="disk gone"):
        write_atomic(p, "new\n")
    assert p.read_text() == "old\n"
    assert [f.name for f in tmp_path.iterdir()] == ["records.jsonl"]


def test_a_secret_is_never_readable_by_others(tmp_path: Path) -> None:
    p = tmp_path / "keys.json"
    write_atomic(p, "{}", mode=0o600)
    assert stat.S_IMODE(p.stat().st_mode) == 0o600


def test_a_plain_file_follows_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "a.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o644


def test_a_streamed_write_is_published_only_when_its_block_ends_without_error(tmp_path: Path) -> None:
    p = tmp_path / "export.jsonl"
    p.write_text("backup\n")
    with pytest.raises(ValueError, match="check failed"), atomic_file(p) as fh:
        fh.write(b"half of a new export")
        fh.flush()
        assert Path(fh.name).read_bytes() == b"half of a new export"  # readable back by name
        assert p.read_text() == "backup\n"  # nobody sees it yet
        raise ValueError("check failed")
    assert p.read_text() == "backup\n"
    assert [f.name for f in tmp_path.iterdir()] == ["export.jsonl"]
    with atomic_file(p, tag="g7") as fh:
        assert ".g7." in Path(fh.name).name and Path(fh.name).name.endswith(".tmp")
        fh.write(b"new\n")
    assert p.read_text() == "new\n"


def test_a_staged_model_folder_replaces_the_old_one_whole_or_not_at_all(tmp_path: Path) -> None:
    from suffice._files import staged_folder

    final = tmp_path / "router"
    final.mkdir()
    (final / "model.onnx").write_bytes(b"old weights")
    (final / "card.json").write_text("old card")
    with pytest.raises(RuntimeError), staged_folder(final) as staging:
        (staging / "model.onnx").write_bytes(b"new weights")
        raise RuntimeError("the export failed before the card")
    # The old model is whole, and nothing of the failed export is left beside it.
    assert (final / "model.onnx").read_bytes() == b"old weights" and (final / "card.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["router"]
    with staged_folder(final) as staging:
        (staging / "model.onnx").write_bytes(b"new weights")
        (staging / "card.json").write_text("new card")
        assert (final / "model.onnx").read_bytes() == b"old weights"  # not before the block ends
    assert {p.name: p.read_bytes() for p in final.iterdir()} == {"model.onnx": b"new weights",
                                                                 "card.json": b"new card"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["router"]


def test_a_staged_folder_never_takes_the_place_of_a_file(tmp_path: Path) -> None:
    from suffice import ModelFileError
    from suffice._files import staged_folder

    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    with pytest.raises(ModelFileError, match="not a folder; what was written is in"):
        with staged_folder(notes) as st:
            (st / "model.onnx").write_bytes(b"weights")
    assert notes.read_text() == "mine"
