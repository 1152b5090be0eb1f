"""Agent runs as items (mini-SWE-agent, τ-bench, τ²-bench, AMA-Bench) and the checkpoint questions
built on them: every step keeps its kind, its step number and its text verbatim under a stable id,
and every checkpoint's evidence is an item the importer made, before the checkpoint."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from suffice import ImportFormatError, Memory
from suffice._datasets.ama import AmaQuestion, load_ama, load_episode
from suffice._datasets.checkpoints import (
    Checkpoint,
    View,
    ama_checkpoints,
    ama_evidence_ids,
    file_views,
    is_step_range_question,
    swe_checkpoints,
    swe_discovered_values,
    swe_re_views,
    tau_checkpoints,
    tau_value_reuses,
)
from suffice._datasets.paths import shared_data_dir
from suffice._datasets.trajectories import (
    KINDS,
    Trajectory,
    ama_trajectory,
    detect_format,
    load_agent,
    load_swe,
    load_tau,
    load_tau2,
    swe_trajectory,
)
from suffice._embed.hashing import HashEmbedder
from suffice._store.base import validate_item

# -- small files in the published formats ---------------------------------------------------------

MOD = "\n".join(f"{n:6}\tline {n} of mod" for n in range(10, 21))


def obs(body: str, rc: int = 0) -> dict[str, str]:
    return {"role": "user", "content": f"<returncode>{rc}</returncode>\n<output>\n{body}\n</output>"}


def step(thought: str, command: str, reasoning: str | None = None) -> dict[str, Any]:
    text = f"THOUGHT: {thought}\n\n```bash\n{command}\n```"
    reply = {"content": text, "reasoning": reasoning}
    return {"role": "assistant", "content": text, "extra": {"response": {"choices": [{"message": reply}]}}}


def swe_raw() -> dict[str, Any]:
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant that runs one bash command per turn."},
        {"role": "user", "content": "<pr_description>f() in mod.py returns None</pr_description>"},
        step("Find f.", 'grep -rn "def f" pkg', reasoning="**Looking for f**"),  # 0
        obs("pkg/core/mod.py:12:def f(x):"),
        step("Read it.", "nl -ba pkg/core/mod.py | sed -n '10,20p'"),  # 1
        obs(MOD),
        {"role": "assistant", "content": "THOUGHT: two at once\n```bash\nls\n```\n```bash\npwd\n```"},  # 2
        {"role": "user", "content": "Please always provide EXACTLY ONE action in triple backticks, found 2."},
        step("Missing file.", "cat pkg/core/gone.py"),  # 3
        obs("cat: pkg/core/gone.py: No such file or directory", rc=1),
    ]
    for k in range(4, 9):  # 4..8: unrelated
        msgs += [step(f"Run {k}.", f"python -c 'print({k})'"), obs(str(k))]
    msgs += [step("Look again at f.", "sed -n '12,15p' pkg/core/mod.py"), obs("def f(x):\n    pass"),  # 9
             step("Edit line 12.", "sed -i '12s/pass/return x/' pkg/core/mod.py"), obs(""),  # 10
             step("Done.", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A && git diff --cached"),
             {"role": "user", "content": "diff --git a/pkg/core/mod.py b/pkg/core/mod.py"}]  # 11
    return {"instance_id": "demo__demo-1", "trajectory_format": "mini-swe-agent-1",
            "info": {"exit_status": "Submitted", "submission": "diff"}, "messages": msgs}


def write_gz(path: Path, raw: Any) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        json.dump(raw, fh)
    return path


USER = json.dumps({"name": "Mia", "payment_methods": {"credit_card_4421486": {"id": "credit_card_4421486"}},
                   "reservations": ["NO6JO3", "AIXC49"]})


def tau_raw() -> list[dict[str, Any]]:
    def call(cid: str, name: str, args: str) -> dict[str, Any]:
        fn = {"function": {"arguments": args, "name": name}, "id": cid, "type": "function"}
        return {"content": None, "role": "assistant", "tool_calls": [fn]}

    def result(cid: str, name: str, content: str) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": cid, "name": name, "content": content}

    traj = [
        {"role": "system", "content": "# Airline Agent Policy\nThe time is 2024-05-15 15:00:00 EST."},  # 0
        {"role": "user", "content": "Hi, my user id is mia_li_3668."},  # 1
        call("c1", "get_user_details", "{\"user_id\":\"mia_li_3668\"}"),  # 2
        result("c1", "get_user_details", USER),  # 3
        {"role": "assistant", "content": "You have two reservations. Which one?"},  # 4
        {"role": "user", "content": "The second one, please cancel it."},  # 5
        {"role": "assistant", "content": "Checking it now.",  # 6: text and a call
         "tool_calls": call("c2", "get_reservation_details", '{"reservation_id": "AIXC49"}')["tool_calls"]},
        result("c2", "get_reservation_details", '{"reservation_id": "AIXC49", "status": "ok"}'),  # 7
        call("c3", "cancel_reservation", '{"reservation_id":"AIXC49","refund_to":"credit_card_4421486"}'),
        result("c3", "cancel_reservation", ""),  # 9: empty, no item
    ]
    run = {"task_id": 7, "trial": 2, "reward": 1.0, "traj": traj,
           "info": {"task": {"instruction": "You are Mia; cancel AIXC49."}}}
    return [run, {**json.loads(json.dumps(run)), "trial": 0, "reward": 0.0}]


def tau2_raw() -> dict[str, Any]:
    def m(role: str, turn: int, content: str | None = None, calls: Any = None, **kw: Any) -> dict[str, Any]:
        return {"role": role, "content": content, "tool_calls": calls, "turn_idx": turn,
                "timestamp": f"2025-08-10T02:44:{turn:02d}", **kw}

    written = '{"phone_number":"555-123-2002"}'  # the model's text; 'arguments' holds it parsed
    raw_args = {"message": {"tool_calls": [{"id": "a1", "function": {"arguments": written}}]}}
    msgs = [
        m("assistant", 0, "Hi! How can I help you today?", "None"),  # 'None' where a list belongs
        m("user", 1, "My data is slow. My number is 555-123-2002."),
        m("assistant", 2, None, [{"id": "a1", "name": "get_customer_by_phone",
                                  "arguments": {"phone_number": "555-123-2002"}, "requestor": "assistant"}],
          raw_data=raw_args),
        {"id": "a1", "role": "tool", "content": "{\"customer_id\": \"C1001\", \"line_ids\": [\"L1001\"]}",
         "requestor": "assistant", "error": False, "turn_idx": 3, "timestamp": "2025-08-10T02:44:03"},
        m("user", 4, None, [{"id": "u1", "name": "check_status_bar", "arguments": {}, "requestor": "user"}]),
        {"id": "u1", "role": "tool", "content": "Status: airplane mode ON, device D55501",
         "requestor": "user", "error": False, "turn_idx": 5, "timestamp": "2025-08-10T02:44:05"},
        m("user", 6, "It says airplane mode."),
        m("assistant", 7, None, [{"id": "a2", "name": "get_details_by_id", "arguments": {"id": "L1001"},
                                  "requestor": "assistant"},
                                 {"id": "a3", "name": "get_details_by_id", "arguments": {"id": "D55501"},
                                  "requestor": "assistant"}]),
    ]
    return {"timestamp": "2025-08-10", "info": {}, "tasks": [],
            "simulations": [{"id": "sim-1", "task_id": "[mobile_data_issue]slow[PERSONA:None]", "trial": 0,
                             "termination_reason": "user_stop", "reward_info": {"reward": 1.0},
                             "messages": msgs}]}


def ama_raw() -> dict[str, Any]:
    return {"episode_id": "3", "task": "fix the bug", "domain": "Software Engineering", "state": "fail",
            "trajectory": [
                {"turn_idx": 0, "action": "think: {\"thought\":\"The bug is in cards.\"}",
                 "observation": "Your thought has been logged."},
                {"turn_idx": 1, "action": "execute_bash: {\"command\":\"ls\"}", "observation": "card.py"},
                {"turn_idx": 2, "action": 'execute_bash: {"command":"pytest"}', "observation": "1 failed"}],
            "qa_pairs": [{"question": "What did the agent run at step 1?", "answer": "ls", "type": "A"},
                         {"question": "Why did it fail?", "answer": "At step 2 a test failed.", "type": "B"},
                         {"question": "Summarise the run.", "answer": "It looked around.", "type": "D"}]}


@pytest.fixture
def swe_file(tmp_path: Path) -> Path:
    return write_gz(tmp_path / "demo__demo-1.traj.json.gz", swe_raw())


@pytest.fixture
def swe(swe_file: Path) -> Trajectory:
    return swe_trajectory(swe_file)


@pytest.fixture
def tau_file(tmp_path: Path) -> Path:
    f = tmp_path / "gpt-4o-airline.shared.json"
    f.write_text(json.dumps(tau_raw()))
    return f


@pytest.fixture
def tau2_file(tmp_path: Path) -> Path:
    f = tmp_path / "telecom.json"
    f.write_text(json.dumps(tau2_raw()))
    return f


def item(t: Trajectory, item_id: str) -> Any:
    return next(it for it in t.items if it.id == item_id)


# -- mini-SWE-agent ---------------------------------------------------------------------------------

def test_a_swe_step_becomes_thought_action_and_observation(swe: Trajectory) -> None:
    assert swe.scope == "swe-demo__demo-1" and swe.task.startswith("<pr_description>")
    assert [(it.kind, it.meta["step"]) for it in swe.items[:7]] == [
        ("system", -1), ("user_message", -1), ("thought", 0), ("action", 0), ("observation", 0),
        ("thought", 1), ("action", 1)]
    raw = swe_raw()["messages"]
    assert item(swe, "swe-demo__demo-1:0:thought").text == "THOUGHT: Find f."
    assert item(swe, "swe-demo__demo-1:0:action").text == 'grep -rn "def f" pkg'
    assert item(swe, "swe-demo__demo-1:1:observation").text == raw[5]["content"]  # verbatim
    assert item(swe, "swe-demo__demo-1:0:thought").meta["reasoning"] == "**Looking for f**"
    assert "reasoning" not in item(swe, "swe-demo__demo-1:1:thought").meta
    assert {it.speaker for it in swe.items if it.kind in ("thought", "action")} == {"agent"}
    assert all(it.meta["dataset"] == "swe" for it in swe.items)


def test_a_swe_message_the_harness_refused_is_one_thought_and_ran_nothing(swe: Trajectory) -> None:
    at2 = [it for it in swe.items if it.meta["step"] == 2]
    assert [it.kind for it in at2] == ["thought", "observation"]
    assert at2[0].text == swe_raw()["messages"][6]["content"]
    assert at2[0].meta["format_error"] == "2 bash blocks"


def test_an_empty_swe_output_is_still_an_observation_and_the_ids_are_unique(swe: Trajectory) -> None:
    assert item(swe, "swe-demo__demo-1:10:observation").text.startswith("<returncode>0</returncode>")
    ids = [it.id for it in swe.items]
    assert len(ids) == len(set(ids)) == 2 + 3 * 12 - 1  # step 2 has no action
    assert item(swe, "swe-demo__demo-1:11:observation").text.startswith("diff --git")


def test_broken_swe_files_are_named_with_the_position(tmp_path: Path) -> None:
    bad = tmp_path / "x.traj.json.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(ImportFormatError, match="x.traj.json.gz"):
        swe_trajectory(bad)
    raw = swe_raw()
    raw["messages"].insert(4, {"role": "user", "content": "again"})
    with pytest.raises(ImportFormatError, match=r"x.traj.json.gz message 4: an observation must follow"):
        swe_trajectory(write_gz(bad, raw))
    raw = swe_raw()
    raw["messages"][3]["content"] = ["a", "list"]
    with pytest.raises(ImportFormatError, match="message 3: content must be a string"):
        swe_trajectory(write_gz(bad, raw))
    raw = swe_raw()
    raw["messages"][1]["role"] = "assistant"
    with pytest.raises(ImportFormatError, match="message 1: expected the task"):
        swe_trajectory(write_gz(bad, raw))


def test_a_swe_run_stopped_by_a_limit_keeps_why_as_its_last_steps_exit(tmp_path: Path) -> None:
    raw = swe_raw()
    raw["messages"].append({"role": "user", "content": "LimitsExceeded"})
    run = swe_trajectory(write_gz(tmp_path / "x.traj.json.gz", raw))
    assert run.items[-1].text == "LimitsExceeded" and run.items[-1].meta["exit"] is True
    assert run.items[-1].meta["step"] == run.items[-2].meta["step"]


# -- τ-bench and τ²-bench ---------------------------------------------------------------------------

def test_tau_runs_of_files_that_differ_after_a_dot_get_scopes_apart(tmp_path: Path) -> None:
    names = ["tool-calling-gpt-4o-0.0_range_0--1_user-a_0101.json",
             "tool-calling-gpt-4o-0.0_range_0--1_user-b_0202.json"]
    for n in names:
        (tmp_path / n).write_text(json.dumps(tau_raw()))
    scopes = [t.scope for n in names for t in load_tau(tmp_path / n)]
    assert len(set(scopes)) == len(scopes) == 4


def test_tau_runs_keep_messages_calls_and_results(tau_file: Path) -> None:
    runs = load_tau(tau_file)
    assert [t.scope for t in runs] == ["tau-gpt-4o-airline.shared-7-0", "tau-gpt-4o-airline.shared-7-2"]
    t = runs[1]
    assert t.success is True and runs[0].success is False and t.task == "You are Mia; cancel AIXC49."
    assert [(it.kind, it.meta["step"], it.speaker) for it in t.items] == [
        ("system", 0, "system"), ("user_message", 1, "user"), ("tool_call", 2, "agent"),
        ("tool_result", 3, "get_user_details"), ("message", 4, "agent"), ("user_message", 5, "user"),
        ("message", 6, "agent"), ("tool_call", 6, "agent"), ("tool_result", 7, "get_reservation_details"),
        ("tool_call", 8, "agent")]  # the empty result of message 9 has no item
    call = item(t, "tau-gpt-4o-airline.shared-7-2:6:tool_call")
    assert call.text == "get_reservation_details({\"reservation_id\": \"AIXC49\"})"  # arguments as written
    assert call.meta["tool"] == "get_reservation_details" and call.meta["tool_call_id"] == "c2"
    assert item(t, "tau-gpt-4o-airline.shared-7-2:3:tool_result").text == USER


def test_tau2_reads_turns_requestors_and_the_model_s_own_argument_text(tau2_file: Path) -> None:
    (t,) = load_tau2(tau2_file)
    assert t.scope == "tau2-sim-1" and t.success and t.meta["task_id"].endswith("[PERSONA:None]")
    assert [(it.kind, it.meta["step"]) for it in t.items] == [
        ("message", 0), ("user_message", 1), ("tool_call", 2), ("tool_result", 3), ("tool_call", 4),
        ("tool_result", 5), ("user_message", 6), ("tool_call", 7), ("tool_call", 7)]
    assert item(t, "tau2-sim-1:2:tool_call").text == 'get_customer_by_phone({"phone_number":"555-123-2002"})'
    assert item(t, "tau2-sim-1:7:tool_call#1").text == 'get_details_by_id({"id": "D55501"})'
    user_call, user_result = item(t, "tau2-sim-1:4:tool_call"), item(t, "tau2-sim-1:5:tool_result")
    assert user_call.speaker == "user" and user_call.meta["requestor"] == "user"
    assert user_result.speaker == "check_status_bar" and user_result.meta["requestor"] == "user"
    assert item(t, "tau2-sim-1:3:tool_result").meta["requestor"] == "assistant"
    assert t.items[0].observed_at == "2025-08-10T02:44:00"


def test_broken_tau_files_name_the_run_and_message(tmp_path: Path) -> None:
    f = tmp_path / "t.json"
    raw = tau_raw()
    raw[1]["traj"][3]["role"] = "robot"
    f.write_text(json.dumps(raw))
    with pytest.raises(ImportFormatError, match="t.json run 1 message 3: role must be .* got 'robot'"):
        load_tau(f)
    raw2 = tau2_raw()
    raw2["simulations"][0]["messages"][2]["tool_calls"] = {"not": "a list"}
    f.write_text(json.dumps(raw2))
    with pytest.raises(ImportFormatError, match="t.json simulation 0 message 2: tool_calls must be a list"):
        load_tau2(f)
    f.write_text("[1, 2")
    with pytest.raises(ImportFormatError, match="t.json: not a"):
        load_tau(f)


# -- AMA-Bench and any format ------------------------------------------------------------------------

def test_an_ama_file_out_of_step_order_is_stored_in_step_order(tmp_path: Path) -> None:
    raw = ama_raw()
    in_order = load_episode(write_gz(tmp_path / "a.json.gz", raw)).items
    raw["trajectory"].reverse()
    assert load_episode(write_gz(tmp_path / "a.json.gz", raw)).items == in_order


def test_ama_think_actions_are_thoughts_and_questions_map_to_their_steps_items(tmp_path: Path) -> None:
    ep = load_episode(write_gz(tmp_path / "swebench-3.json.gz", ama_raw()))
    assert [(it.kind, it.id) for it in ep.items[:3]] == [
        ("thought", "ama-swebench-3:0:thought"), ("observation", "ama-swebench-3:0:observation"),
        ("action", "ama-swebench-3:1:action")]
    q_step, q_why, q_sum = ep.questions
    assert ama_evidence_ids(ep, q_step) == ("ama-swebench-3:1:action", "ama-swebench-3:1:observation")
    assert ama_evidence_ids(ep, q_why) == ("ama-swebench-3:2:action", "ama-swebench-3:2:observation")
    assert [is_step_range_question(q) for q in ep.questions] == [True, False, False]  # B cites in its answer
    assert not is_step_range_question(AmaQuestion("At step 1?", "", "C", (1,)))
    cps = ama_checkpoints(ep)
    assert [(c.kind, c.at_step, c.at_item, c.evidence_step, c.detail["type"]) for c in cps] == [
        ("ama", 3, 6, 1, "A"), ("ama", 3, 6, 2, "B")]
    t = ama_trajectory(ep)
    assert t.scope == ep.scope and t.items == ep.items and t.success is False


def test_auto_reads_each_file_in_its_own_format(tmp_path: Path, swe_file: Path, tau_file: Path,
                                                tau2_file: Path) -> None:
    (tmp_path / "ama").mkdir()
    write_gz(tmp_path / "ama" / "swebench-3.json.gz", ama_raw())  # subfolders are read too
    assert [detect_format(f) for f in (swe_file, tau_file, tau2_file)] == ["swe", "tau", "tau2"]
    scopes = [t.scope for t in load_agent(tmp_path)]
    assert scopes == ["ama-swebench-3", "swe-demo__demo-1", "tau-gpt-4o-airline.shared-7-0",
                      "tau-gpt-4o-airline.shared-7-2", "tau2-sim-1"]
    assert [t.scope for t in load_agent(swe_file, "swe")] == ["swe-demo__demo-1"]
    with pytest.raises(ImportFormatError, match="unknown trajectory format 'xml'"):
        load_agent(tmp_path, "xml")
    (tmp_path / "other.json").write_text("{\"hello\": 1}")
    with pytest.raises(ImportFormatError, match="other.json: not a trajectory format"):
        load_agent(tmp_path)


def test_the_cli_imports_each_run_into_its_scope_once(tmp_path: Path, swe_file: Path, tau_file: Path) -> None:
    from typer.testing import CliRunner

    from suffice._cli import app
    db = str(tmp_path / "agent.db")
    first = CliRunner().invoke(app, ["--db", db, "import", "agent", str(tmp_path)])
    assert first.exit_code == 0, first.output
    assert "imported 57 new items (0 already stored) in 3 scopes" in first.output.replace("\n", " ")
    again = CliRunner().invoke(app, ["--db", db, "import", "agent", str(swe_file), "--format", "swe"])
    assert again.exit_code == 0 and "imported 0 new items (37 already stored) in 1 scopes" in again.output
    bad = CliRunner().invoke(app, ["--db", db, "import", "agent", str(tau_file), "--format", "swe"])
    assert bad.exit_code == 2
    assert "gpt-4o-airline.shared.json: expected an object with a 'messages' list" in bad.output
    mem = Memory(db)
    stored = mem.items(scope="swe-demo__demo-1", limit=None)
    assert [it.id for it in stored] == [it.id for it in swe_trajectory(swe_file).items]
    assert stored[3].kind == "action" and stored[3].meta["step"] == 0


# -- checkpoints -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("command", "views"), [
    ("cat pkg/a.py", [View("pkg/a.py")]),
    ("nl -ba pkg/a.py | sed -n '724,760p'", [View("pkg/a.py", 724, 760)]),
    ("head -n 35 pkg/a.py | tail -n 15", [View("pkg/a.py", 21, 35)]),
    ("cd pkg && cat -n sub/a.py 2>&1", [View("pkg/sub/a.py")]),
    ("cat /testbed/pkg/a.py | head -50", [View("pkg/a.py", 1, 50)]),
    ("tail -n 20 pkg/a.py", [View("pkg/a.py", key="tail -n 20")]),
    ("sed -n '/def f/,/return/p' pkg/a.py", [View("pkg/a.py", key="sed -n '/def f/,/return/p'")]),
    ("sed -n 10,20p a.py && cat b.py > c.py", [View("a.py", 10, 20)]),  # a copy shows nothing
    ("cat <<'EOF' > a.py\nprint(1)\nEOF", []),
    ("grep -n f a.py | head", []),
    ("cat a.py | grep f", []),
    ("sed -i '5d' a.py", []),
])
def test_file_views_read_what_a_command_prints(command: str, views: list[View]) -> None:
    assert file_views(command) == views


def test_a_view_is_shown_by_the_whole_file_the_same_expression_or_half_its_lines() -> None:
    v = View("a.py", 10, 20)
    assert v.shown_by(View("a.py")) and v.shown_by(View("a.py", 15, 40)) and v.shown_by(View("a.py", 1, 15))
    assert not v.shown_by(View("a.py", 16, 40)) and not v.shown_by(View("b.py"))
    assert View("a.py", key="tail -n 5").shown_by(View("a.py", key="tail -n 5"))
    assert not View("a.py").shown_by(View("a.py", 1, 500))


def test_a_re_view_asks_for_the_lines_last_shown_with_that_output_as_evidence(swe: Trajectory) -> None:
    (cp,) = swe_re_views(swe)
    assert (cp.kind, cp.at_step, cp.evidence_step, cp.gap) == ("re_view", 9, 1, 8)
    assert cp.evidence_ids == ("swe-demo__demo-1:1:observation",)
    assert cp.question == "What did pkg/core/mod.py (lines 12–15) contain when it was last shown?"
    assert cp.answer == item(swe, "swe-demo__demo-1:1:observation").text
    assert swe.items[cp.at_item].meta["step"] == 9 and swe.items[cp.at_item - 1].meta["step"] == 8
    assert swe_re_views(swe, min_gap=9) == []  # the failed cat at step 3 showed nothing


def test_discovered_values_are_paths_and_line_numbers_an_output_revealed(swe: Trajectory) -> None:
    cps = swe_discovered_values(swe)
    got = [(c.kind, c.at_step, c.evidence_step, c.answer) for c in cps]
    assert got == [("discovered_path", 1, 0, "pkg/core/mod.py"), ("discovered_line", 9, 0, "12")]
    assert cps[0].question == "What is the full path of mod.py?"
    assert cps[1].question == "At which line of pkg/core/mod.py is `def f(x):`?"
    assert all(c.evidence_ids == ("swe-demo__demo-1:0:observation",) for c in cps)
    assert [c.kind for c in swe_discovered_values(swe, min_gap=5)] == ["discovered_line"]
    every = swe_discovered_values(swe, first_use=False)  # the sed -i of step 10 uses line 12 again
    assert [(c.kind, c.at_step) for c in every][-1] == ("discovered_line", 10)
    assert len(swe_checkpoints([swe])) == 3


def test_value_reuse_needs_a_tool_result_first_and_no_user_typing_it(tau_file: Path, tau2_file: Path) -> None:
    t = load_tau(tau_file)[1]
    cps = tau_value_reuses(t)
    assert [(c.at_step, c.evidence_step, c.answer, c.evidence_ids) for c in cps] == [
        (6, 3, "AIXC49", ("tau-gpt-4o-airline.shared-7-2:3:tool_result",)),
        (8, 3, "credit_card_4421486", ("tau-gpt-4o-airline.shared-7-2:3:tool_result",))]
    # mia_li_3668 was typed by the user; AIXC49's second use at message 8 copies the agent's own call
    assert cps[0].question == "Which reservation id should the get_reservation_details call use?"
    assert len(tau_value_reuses(t, first_use=False)) == 3 and tau_value_reuses(t, min_gap=4) == cps[1:]
    (t2,) = load_tau2(tau2_file)
    # L1001 came from the agent's tool; D55501 only from the user's phone, which the agent never saw
    assert [(c.at_step, c.answer, c.evidence_ids) for c in tau_value_reuses(t2)] == [
        (7, "L1001", ("tau2-sim-1:3:tool_result",))]
    assert len(tau_checkpoints([t, t2])) == 3


# -- the shared data ---------------------------------------------------------------------------------

AGENT = shared_data_dir() / "agent"
needs_data = pytest.mark.skipif(not (AGENT / "tau_bench_airline_gpt4o").is_dir(),
                                reason=f"shared agent data not found at {AGENT} (set SUFFICE_DATA)")


@pytest.fixture(scope="module")
def shared() -> dict[str, list[Trajectory]]:
    return {"swe": load_swe(), "tau": load_tau(), "tau2": load_tau2(),
            "ama": [ama_trajectory(e) for e in load_ama()]}


@needs_data
def test_the_shared_runs_are_all_read_with_the_conventions(shared: dict[str, list[Trajectory]]) -> None:
    assert {k: len(v) for k, v in shared.items()} == {"swe": 200, "tau": 160, "tau2": 16, "ama": 166}
    assert sum(t.success is True for t in shared["swe"]) == 146
    assert sum(t.success is True for t in shared["tau"]) == 71
    assert sum(t.success is True for t in shared["tau2"]) == 12
    for name, trajs in shared.items():
        ids = [it.id for t in trajs for it in t.items]
        assert len(ids) == len(set(ids)), name
        for t in trajs:
            steps = [it.meta["step"] for it in t.items]
            assert steps == sorted(steps) and all(type(s) is int for s in steps), t.scope
            assert all(it.kind in KINDS and it.meta["dataset"] == name for it in t.items), t.scope
            assert all(str(it.id).startswith(f"{t.scope}:{it.meta['step']}:{it.kind}") for it in t.items)
            for i, it in enumerate(t.items):
                validate_item(it, i)  # every item can be stored
    assert sum(it.kind == "thought" for t in shared["ama"] for it in t.items) == 91


@needs_data
def test_the_shared_texts_are_kept_whole(shared: dict[str, list[Trajectory]], tmp_path: Path) -> None:
    swe = shared["swe"]
    longest = max((it for t in swe for it in t.items if it.kind == "observation"),
                  key=lambda it: len(it.text))
    t = next(t for t in swe if str(longest.id).startswith(t.scope + ":"))
    raw = json.load(gzip.open(t.source))["messages"]
    assert longest.text in [m["content"] for m in raw] and len(longest.text) > 10_000
    mem = Memory(tmp_path / "m.db", embedder=HashEmbedder())
    mem.add(list(t.items), scope=t.scope)
    assert mem.get(str(longest.id), scope=t.scope).text == longest.text  # pieced for search, stored whole
    tau_raw_runs = json.loads(Path(shared["tau"][0].source).read_text())
    calls = {f"{c['function']['name']}({c['function']['arguments']})" for r in tau_raw_runs for m in r["traj"]
             for c in m.get("tool_calls") or []}
    assert calls == {it.text for t in shared["tau"] for it in t.items if it.kind == "tool_call"}


def check_evidence(cps: list[Checkpoint], trajs: list[Trajectory]) -> None:
    by = {t.scope: t for t in trajs}
    for c in cps:
        t = by[c.trajectory]
        history = {it.id: it for it in t.items[:c.at_item]}
        assert c.evidence_ids and all(e in history for e in c.evidence_ids), c
        assert all(history[e].meta["step"] < c.at_step for e in c.evidence_ids) and c.gap >= 1
        assert c.at_item == len(t.items) or t.items[c.at_item].meta["step"] >= c.at_step


@needs_data
def test_the_shared_runs_give_checkpoints_of_the_readme_s_orders(shared: dict[str, list[Trajectory]]) -> None:
    swe = shared["swe"]
    re_views = [c for t in swe for c in swe_re_views(t)]
    loose = [c for t in swe for c in swe_re_views(t, same_lines=False)]
    assert 500 <= len(re_views) <= 1000 and 1150 <= len(loose) <= 1350  # the README's rough scan: 1,261
    assert 300 <= sum(c.gap >= 5 for c in re_views) < len(re_views)
    found = [c for t in swe for c in swe_discovered_values(t)]
    paths = [c for c in found if c.kind == "discovered_path"]
    assert 200 <= len(paths) <= 320 and 100 <= len({c.trajectory for c in paths}) <= 150  # README: 250 in 126
    tau = tau_checkpoints(shared["tau"])
    every = tau_checkpoints(shared["tau"], first_use=False)
    assert 400 <= len(tau) < len(every) <= 1000 and 85 <= len({c.trajectory for c in every}) <= 100
    tau2 = tau_checkpoints(shared["tau2"])
    assert 20 <= len(tau2) <= 80
    check_evidence(re_views + loose + found, swe)
    check_evidence(tau + every, shared["tau"])
    check_evidence(tau2, shared["tau2"])


@needs_data
def test_ama_questions_map_to_the_cited_steps_items() -> None:
    eps = load_ama()
    cps = [c for e in eps for c in ama_checkpoints(e)]
    assert 1750 <= len(cps) <= 1850  # the README: 1,820 of 1,992 questions cite steps
    assert 450 <= sum(c.detail["step_range"] for c in cps) <= 671  # at most every type-A question
    check_evidence(cps, [ama_trajectory(e) for e in eps])


def test_an_import_that_fails_on_one_run_writes_none_of_them(tmp_path):
    """Every run is checked before the first is written: a run whose ids were stored before
    with other content (a corrected re-export) leaves the store as it was."""
    from suffice import ConflictError, HashEmbedder, Memory, NewItem
    from suffice._datasets.trajectories import Trajectory

    def run(name: str, text: str) -> Trajectory:
        return Trajectory(name, "tau2", "f.json", (NewItem(text, id=f"{name}:0", kind="user_message"),))

    mem = Memory(tmp_path / "m.db", embedder=HashEmbedder())
    mem.import_agent([run("b", "first version")])
    with pytest.raises(ConflictError) as caught:
        mem.import_agent([run("a", "a new run"), run("b", "edited version")])
    assert "nothing of this import was written" in "".join(caught.value.__notes__)
    assert [it.text for s in mem.scopes() for it in mem.items(scope=s)] == ["first version"]
    assert mem.import_agent([run("a", "a new run"), run("b", "first version")]) == {
        run("a", "").scope: 1, run("b", "").scope: 0}
    mem.close()


# -- what an audit of the importers found (2026-12-05) ---------------------------------------------


def test_two_runs_whose_names_differ_only_in_unicode_form_are_one_scope_and_refused(tmp_path: Path) -> None:
    """The store names scopes in NFC: the two were stored as one run, steps 0.. twice over."""
    import unicodedata

    for form in ("NFC", "NFD"):
        write_gz(tmp_path / f"{unicodedata.normalize(form, 'café-1')}.json.gz", ama_raw())
    with pytest.raises(ImportFormatError, match="two runs share the scope"):
        load_agent(tmp_path)


def test_only_mini_swe_agent_runs_of_the_version_read_here_are_taken_as_such(tmp_path: Path) -> None:
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps({"messages": [{"role": "system", "content": "Be kind."},
                                             {"role": "user", "content": "hi"}]}))
    with pytest.raises(ImportFormatError, match="not a trajectory format"):
        load_agent(chat)  # a chat log was stored as an agent's thoughts and observations
    newer = {**swe_raw(), "trajectory_format": "mini-swe-agent-1.1"}
    with pytest.raises(ImportFormatError, match="not supported"):
        swe_trajectory(write_gz(tmp_path / "x.traj.json.gz", newer))  # its commands would never run


def test_mini_swe_agents_own_batch_folder_is_read(tmp_path: Path) -> None:
    """It writes <out>/<instance>/<instance>.traj.json and <out>/preds.json."""
    (tmp_path / "demo__demo-1").mkdir()
    (tmp_path / "demo__demo-1" / "demo__demo-1.traj.json").write_text(json.dumps(swe_raw()))
    (tmp_path / "preds.json").write_text(json.dumps({"demo__demo-1": {"model_patch": "diff"}}))
    assert [t.scope for t in load_swe(tmp_path)] == ["swe-demo__demo-1"]
    assert [t.scope for t in load_agent(tmp_path)] == ["swe-demo__demo-1"]


def test_a_file_nested_past_what_json_reads_and_odd_step_numbers_are_format_errors(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000)
    with pytest.raises(ImportFormatError, match="RecursionError"):
        load_agent(deep)
    raw = ama_raw()
    raw["trajectory"][1]["turn_idx"] = "²"  # a digit to str.isdigit, not to int()
    with pytest.raises(ImportFormatError, match="turn_idx must be a whole number"):
        load_agent(write_gz(tmp_path / "odd.json.gz", raw))


def killed_after(mem: Memory, n: int, run: Any) -> None:
    """``run`` stopped (as by a kill) once the memory has written ``n`` items of its first add."""
    real = mem.add

    def dies(items, **kw):  # type: ignore[no-untyped-def]
        real(items[:n], **kw)
        raise KeyboardInterrupt

    mem.add = dies  # type: ignore[method-assign]
    try:
        with pytest.raises(KeyboardInterrupt):
            run()
    finally:
        mem.add = real  # type: ignore[method-assign]


def test_an_import_killed_halfway_is_named_by_check_and_finished_by_a_rerun(tmp_path: Path,
                                                                          swe_file: Path) -> None:
    mem = Memory(tmp_path / "m.db", embedder=HashEmbedder())
    killed_after(mem, 5, lambda: mem.import_agent(swe_file))
    problems = mem.check()
    assert any("swe-demo__demo-1" in p and "did not finish (5 of" in p for p in problems), problems
    mem.import_agent(swe_file)
    assert mem.check() == []
    mem.close()


def test_an_import_keeps_another_transfers_unfinished_mark_and_takes_names_in_any_unicode_form(
        tmp_path: Path, swe_file: Path) -> None:
    import unicodedata

    from suffice._datasets.locomo import load_locomo

    mem = Memory(tmp_path / "m.db", embedder=HashEmbedder())
    mem.store.note_transfer("swe-demo__demo-1", {"source": "backup.jsonl", "started": "then", "items": 999})
    mem.import_agent(swe_file)
    assert any("backup.jsonl" in p for p in mem.check())  # still to be completed
    conv = tmp_path / "locomo.json"
    conv.write_text(json.dumps([{"sample_id": unicodedata.normalize("NFD", "café-1"), "conversation": {
        "speaker_a": "A", "speaker_b": "B", "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [{"speaker": "A", "dia_id": "D1:1", "text": "I love hiking."}]}, "qa": []}]))
    assert sum(mem.import_locomo(load_locomo(conv)).values()) == 1
    mem.close()


def test_an_import_stopped_halfway_leaves_another_transfers_mark_as_it_was(tmp_path: Path,
                                                                          swe_file: Path) -> None:
    mem = Memory(tmp_path / "m.db", embedder=HashEmbedder())
    other = {"source": "other.db", "started": "then", "items": 10}
    mem.store.note_transfer("swe-demo__demo-1", other)
    killed_after(mem, 3, lambda: mem.import_agent(swe_file))
    mem.import_agent(swe_file)
    assert mem.store.unfinished_transfers()["swe-demo__demo-1"] == other
    mem.close()
