"""The BEAM loader reads the published per-conversation format into items and questions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from suffice import ImportFormatError
from suffice._datasets.beam import load_beam, load_conversation
from suffice._datasets.paths import shared_data_dir


def write_conversation(folder: Path) -> Path:
    folder.mkdir(parents=True)
    chat = [
        {"batch_number": 1, "time_anchor": None, "turns": [
            [{"role": "user", "id": "0", "time_anchor": "March-15-2024", "index": "1,1",
              "content": "Plan my launch for March 15. ->-> 1,1"},
             {"role": "assistant", "id": "1", "content": "Here is a schedule."}],
            [{"role": "user", "id": "2", "content": "Move QA to Friday. ->-> 1,2"},
             {"role": "assistant", "id": "3", "content": "Done, QA is on Friday."}],
        ]},
        {"batch_number": 2, "time_anchor": None, "turns": [
            [{"role": "user", "id": "4", "time_anchor": "April-02-2024", "content": "Launch slipped."},
             {"role": "assistant", "id": "5", "content": "Let's re-plan."}],
        ]},
    ]
    questions = {
        "abstention": [{"question": "What did my dog eat?", "ideal_response": "Not mentioned.",
                        "plan_reference": "x", "rubric": []}],
        "temporal_reasoning": [{"question": "How long did the launch slip?", "answer": "18 days",
                                "source_chat_ids": {"first_event": [0], "second_event": [4]},
                                "difficulty": "hard", "rubric": []}],
        "summarization": [{"question": "Summarise the plan.", "ideal_summary": "A launch plan.",
                           "source_chat_ids": [0, 1, [2, 3]], "rubric": []}],
        "instruction_following": [{"question": "Use bullets.", "expected_compliance": "Bullets.",
                                   "source_chat_ids": [2, 99], "rubric": []}],
    }
    (folder / "chat.json").write_text(json.dumps(chat))
    (folder / "probing_questions.json").write_text(json.dumps(questions))
    return folder


def test_each_message_is_one_item_with_role_session_anchor_and_chat_id(tmp_path: Path) -> None:
    conv = load_conversation(write_conversation(tmp_path / "7"))
    assert conv.scope == "beam-100K-7"
    assert [it.speaker for it in conv.items] == ["user", "assistant"] * 3
    assert [it.session for it in conv.items] == ["1", "1", "1", "1", "2", "2"]
    assert [it.meta["chat_id"] for it in conv.items] == ["0", "1", "2", "3", "4", "5"]
    # The anchor is carried forward from the last message that gave one.
    assert [it.observed_at for it in conv.items] == ["March-15-2024"] * 4 + ["April-02-2024"] * 2
    assert conv.items[0].text.endswith("->-> 1,1")  # verbatim, marker included
    assert len({it.id for it in conv.items}) == 6


def test_questions_keep_ability_gold_answer_and_flattened_evidence(tmp_path: Path) -> None:
    conv = load_conversation(write_conversation(tmp_path / "7"))
    by_ability = {q.ability: q for q in conv.questions}
    assert by_ability["abstention"].evidence == () and by_ability["abstention"].answer == "Not mentioned."
    assert by_ability["temporal_reasoning"].evidence == ("0", "4")
    assert by_ability["temporal_reasoning"].answer == "18 days"
    assert by_ability["temporal_reasoning"].difficulty == "hard"
    assert by_ability["summarization"].evidence == ("0", "1", "2", "3")
    assert by_ability["summarization"].answer == "A launch plan."
    # Ids that name no message are dropped rather than failing the whole file.
    assert by_ability["instruction_following"].evidence == ("2",)
    assert by_ability["instruction_following"].answer == "Bullets."


def test_a_tier_folder_loads_its_conversations_in_numeric_order(tmp_path: Path) -> None:
    for n in ("10", "2", "1"):
        write_conversation(tmp_path / "100K" / n)
    assert [c.conv_id for c in load_beam(tmp_path / "100K")] == ["1", "2", "10"]
    assert [c.conv_id for c in load_beam(tmp_path / "100K" / "2")] == ["2"]


def test_malformed_input_names_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ImportFormatError, match="not found"):
        load_beam(tmp_path / "nowhere")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "chat.json").write_text('[{"turns": [[{"id": "0", "content": "hi"}]]}]')
    (bad / "probing_questions.json").write_text("{}")
    with pytest.raises(ImportFormatError, match="batch 0 turn 0 message 0"):
        load_conversation(bad)


def test_the_shared_copy_has_twenty_conversations() -> None:
    path = shared_data_dir() / "beam" / "100K"
    if not path.exists():
        pytest.skip(f"shared BEAM data not found at {path}")
    convs = load_beam(path)
    assert len(convs) == 20
    assert sum(len(c.items) for c in convs) == 5732
    assert sum(len(c.questions) for c in convs) == 400
    with_evidence = [q for c in convs for q in c.questions if q.evidence]
    assert all(q.ability != "abstention" for q in with_evidence)
    assert len(with_evidence) == 355
