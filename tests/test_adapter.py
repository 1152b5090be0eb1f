"""Memory.fit: an agent's running message list fitted into a budget, framework-shaped: system
messages and the newest turns verbatim, the dropped middle replaced by rendered memory, and
every message stored once."""

from __future__ import annotations

import json

import httpx
import pytest

from suffice import AccessDeniedError, BudgetError, HashEmbedder, InvalidItemError, Memory
from suffice._adapter import CUT_MARKER, message_tokens
from suffice._server.wire import to_json, without_timings

SYSTEM = {"role": "system", "content": "You are a coding agent. Use the bash tool."}


def run(steps: int) -> list[dict]:
    msgs = [SYSTEM, {"role": "user", "content": "Fix the bug where read_csv drops the last row."}]
    for i in range(steps):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function",
             "function": {"name": "bash",
                          "arguments": f'{{"cmd": "sed -n {i * 10},{i * 10 + 9}p io.py"}}'}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": "\n".join(
            f"line {i * 10 + k}: value_{i}_{k} = compute({k})" for k in range(10))})
    msgs.append({"role": "user", "content": "Which line defined value_3_4?"})
    return msgs


@pytest.fixture
def mem():
    m = Memory(":memory:", embedder=HashEmbedder())
    yield m
    m.close()


@pytest.mark.parametrize("budget", [400, 800, 1500, 3000])
def test_the_fitted_list_is_within_budget_and_shaped_for_a_model(mem, budget):
    msgs = run(40)
    fitted = mem.fit(msgs, budget, scope="run-1")
    assert fitted.tokens == sum(message_tokens(m) for m in fitted.messages) <= budget
    assert fitted.messages[0] == SYSTEM
    recent = fitted.messages[-fitted.kept_recent:]
    assert recent == msgs[-fitted.kept_recent:]                     # the newest turns, verbatim
    assert recent[0]["role"] != "tool"                              # never a result without its call
    assert fitted.dropped + fitted.kept_recent == len(msgs) - 1
    memory = fitted.messages[1]
    assert memory["role"] == "system" and memory["content"].startswith("Memory of earlier steps")


def test_the_memory_holds_what_the_next_step_needs_from_the_dropped_middle(mem):
    fitted = mem.fit(run(40), 1500, scope="run-1")
    assert "value_3_4 = compute(4)" in fitted.messages[1]["content"]
    assert all("value_3_4 = compute" not in str(m) for m in fitted.messages[2:])  # from memory alone


def test_a_list_that_fits_comes_back_as_it_is_and_is_still_stored(mem):
    msgs = run(2)
    fitted = mem.fit(msgs, 10_000, scope="run-1")
    assert fitted.messages == msgs and fitted.context is None and fitted.dropped == 0
    assert fitted.stored == len(mem.items(scope="run-1")) > 0


def test_sending_the_grown_list_again_stores_only_the_new_messages(mem):
    msgs = run(10)
    first = mem.fit(msgs, 800, scope="run-1")
    assert mem.fit(msgs, 800, scope="run-1").stored == 0
    grown = [*msgs, {"role": "assistant", "content": "It is line 34."}]
    assert mem.fit(grown, 800, scope="run-1").stored == 1
    assert len(mem.items(scope="run-1")) == first.stored + 1


def test_bad_input_is_refused_and_nothing_is_stored(mem):
    with pytest.raises(BudgetError):
        mem.fit(run(2), 0, scope="run-1")
    with pytest.raises(BudgetError, match="system messages alone"):
        mem.fit([{"role": "system", "content": "word " * 500}, {"role": "user", "content": "hi"}], 50,
                scope="run-1")
    with pytest.raises(InvalidItemError):
        mem.fit([{"content": "no role"}], 100, scope="run-1")
    assert not mem.store.has_scope("run-1")


def test_the_newest_results_come_with_the_call_that_asked_for_them(mem):
    msgs = run(30)
    msgs[-3]["tool_calls"].append({"id": "c29b", "type": "function",
                                   "function": {"name": "bash", "arguments": "{}"}})
    msgs[-1] = {"role": "tool", "tool_call_id": "c29b", "content": "x = 1\n" * 90}  # a result is newest
    fitted = mem.fit(msgs, 1000, scope="run-1")   # the window (250) holds the result, not its call
    assert fitted.tokens <= 1000
    assert fitted.messages[-fitted.kept_recent:] == msgs[-3:]   # call, its first result, the newest
    assert fitted.messages[-fitted.kept_recent]["tool_calls"][0]["id"] == "c29"


def test_an_empty_turn_is_sent_on_but_not_stored_and_an_empty_tool_result_is_stored_as_no_output(mem):
    msgs = [*run(3), {"role": "assistant", "content": None, "tool_calls": [
        {"id": "q", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "q", "content": ""}, {"role": "assistant", "content": ""}]
    fitted = mem.fit(msgs, 10_000, scope="run-1")
    assert fitted.messages == msgs
    assert all(it.text for it in mem.items(scope="run-1"))
    assert [it.text for it in mem.items(scope="run-1") if it.kind == "tool_result"][-1] == "(no output)"
    assert mem.fit(msgs, 300, scope="run-1").tokens <= 300


def test_a_bad_message_is_named_by_its_place_in_the_callers_list(mem):
    msgs = [SYSTEM, {"role": "user", "content": "hi"}, {"role": "wizard", "content": "x"}]
    with pytest.raises(InvalidItemError, match="message 2: role must be"):
        mem.fit(msgs, 500, scope="run-1")
    with pytest.raises(InvalidItemError, match="memory_role"):
        mem.fit(run(2), 500, scope="run-1", memory_role="tool")
    assert not mem.store.has_scope("run-1")


def test_a_refusal_is_stored_as_text_and_the_loop_goes_on(mem):
    """An SDK reply dumped without its nulls holds only role and refusal; it stayed in the
    history and made every later fit fail."""
    refusal = {"role": "assistant", "refusal": "I can't help with that."}
    msgs = [SYSTEM, {"role": "user", "content": "q"}, refusal, {"role": "user", "content": "next"}]
    assert mem.fit(msgs, 1000, scope="run-1").messages == msgs
    assert "I can't help with that." in [it.text for it in mem.items(scope="run-1")]


def test_a_history_reloaded_from_json_with_its_nulls_is_not_stored_again(mem):
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]}
    hist = [SYSTEM, {"role": "user", "content": "list files"}, call,
            {"role": "tool", "tool_call_id": "c1", "content": "a.py b.py"}]
    first = mem.fit(hist, 4000, scope="run-1").stored
    as_saved = {**call, "refusal": None, "audio": None, "annotations": [], "function_call": None,
                "tool_calls": [{**call["tool_calls"][0], "index": None}]}  # how an SDK dump reads back
    again = mem.fit([*hist[:2], as_saved, hist[3], {"role": "assistant", "content": "Two files."}],
                    4000, scope="run-1")
    assert again.stored == 1 and len(mem.items(scope="run-1")) == first + 1


def test_message_ids_stored_by_earlier_versions_stay_the_same():
    """A run in flight across an upgrade must not store its messages a second time."""
    from suffice._adapter import _message_id

    call = {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]}
    assert _message_id("run", 2, call) == "run:2:9bfce6eac69096ec"
    assert _message_id("run", 1, {"role": "user", "content": "hi"}) == "run:1:855daefc1e260450"


def test_a_memory_message_sent_back_is_dropped_not_stored(mem):
    fitted = mem.fit(run(40), 1000, scope="run-1")
    n = len(mem.items(scope="run-1"))
    more = [m for m in run(60)[82:-1]]  # twenty more steps: the list needs memory again
    back = mem.fit([*fitted.messages, *more, {"role": "user", "content": "And now?"}], 1000, scope="run-1")
    assert sum(m["content"].startswith("Memory of earlier steps") for m in back.messages
               if isinstance(m.get("content"), str)) <= 1  # never one memory message per turn
    assert not any(it.text.startswith("Memory of earlier steps") for it in mem.items(scope="run-1"))
    assert len(mem.items(scope="run-1")) > n  # what is new is stored, the memory message is not


def test_a_newest_message_over_the_budget_is_sent_cut_not_dropped(mem):
    lines = "\n".join(f"log line {i} ok" for i in range(3000))
    log = f"Find the error line:\n{lines}\nERROR at parser.py:42"
    msgs = [*run(10)[:-1], {"role": "user", "content": log}]
    fitted = mem.fit(msgs, 2000, scope="run-1")
    newest = fitted.messages[-1]
    assert newest["role"] == "user" and fitted.kept_recent == 1 and fitted.tokens <= 2000
    assert newest["content"].startswith("Find the error line")
    assert "ERROR at parser.py:42" in newest["content"]
    assert "left out here to fit the budget" in newest["content"]
    assert log in [it.text for it in mem.items(scope="run-1")]  # stored whole
    result = [*run(10)[:-1], {"role": "assistant", "content": None, "tool_calls": [
        {"id": "big", "type": "function", "function": {"name": "cat", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "big", "content": log}]
    fitted = mem.fit(result, 2000, scope="run-2")
    assert [m["role"] for m in fitted.messages[-2:]] == ["assistant", "tool"]  # with its call
    assert fitted.tokens <= 2000 and "ERROR at parser.py:42" in fitted.messages[-1]["content"]


def test_the_left_out_middle_of_a_cut_message_can_come_back_through_memory(mem):
    """The newest message goes out cut, but the memory message beside it may draw on its
    middle, so the line the user asked about is in the same call."""
    lines = [f"log line {i} ok" for i in range(3000)]
    lines[1500] = "log line 1500 FATAL checksum mismatch in shard_77"
    msgs = [*run(10)[:-1], {"role": "user", "content": "Which shard had the checksum mismatch?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "big", "type": "function", "function": {"name": "cat", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "big", "content": "\n".join(lines)}]
    fitted = mem.fit(msgs, 2000, scope="run-1")
    assert "shard_77" not in fitted.messages[-1]["content"]  # not in the head or the tail
    memory = next(m["content"] for m in fitted.messages if str(m.get("content")).startswith("Memory of"))
    assert "FATAL checksum mismatch in shard_77" in memory and fitted.tokens <= 2000


@pytest.mark.parametrize(("bad", "message"), [
    ({"role": "user", "content": [{"type": ["text"], "text": "x"}]},
     "a content part's 'type' must be a string"),
    ({"role": "assistant", "content": None, "tool_calls": 5}, "tool_calls must be a list"),
    ({"role": "assistant", "content": {"text": "x"}}, "content must be a string"),
    ({"role": "bogus", "content": ""}, "role must be one of"),
    ({"role": "tool", "tool_call_id": 7, "content": "x"}, "tool_call_id must be a string"),
])
def test_malformed_messages_are_invalid_items_even_when_nothing_would_be_stored(mem, bad, message):
    with pytest.raises(InvalidItemError, match=f"message 1: {message}"):
        mem.fit([SYSTEM, bad, {"role": "user", "content": "hi"}], 500, scope="run-1")
    assert not mem.store.has_scope("run-1")


def test_tool_call_ids_and_names_count_toward_the_budget():
    bare = {"role": "tool", "content": "ok"}
    # any other field is sent on with the message, so it counts (it was free)
    thought = {"role": "assistant", "content": "Done.", "reasoning_content": "Let me think... " * 300}
    assert message_tokens(thought) > 900
    assert message_tokens({**bare, "tool_call_id": "call_" + "x" * 40}) > message_tokens(bare) + 5
    assert message_tokens({**bare, "name": "a_long_function_name"}) > message_tokens(bare)


def test_resending_the_list_does_not_cut_stored_messages_into_pieces_again(mem, monkeypatch):
    msgs = run(20)
    mem.fit(msgs, 800, scope="run-1")
    prepared = []
    real = mem._prepare
    monkeypatch.setattr(mem, "_prepare", lambda batch: prepared.extend(batch) or real(batch))
    mem.fit([*msgs, {"role": "assistant", "content": "line 34"}], 800, scope="run-1")
    assert [it.text for it in prepared] == ["line 34"]


def test_messages_are_stored_under_the_agent_and_the_render_reads_that_agent_only(mem):
    mem.add("The deploy key is kept in vault path ops/deploy.", user_id="ana", agent_id="other")
    fitted = mem.fit([*run(30), {"role": "user", "content": "Where is the deploy key kept?"}], 800,
                     user_id="ana", agent_id="coder")
    assert {it.agent for it in mem.items(user_id="ana", agent_id="coder")} == {"coder"}
    assert len(mem.items(user_id="ana", agent_id="coder")) == fitted.stored
    assert "ops/deploy" not in fitted.messages[1]["content"]


def test_images_count_and_text_parts_and_sdk_objects_are_read(mem):
    class Dumped(dict):  # stands for a pydantic message object of an OpenAI client
        def model_dump(self, exclude_none: bool = False) -> dict:
            return dict(self)

    shot = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    assert message_tokens({"role": "user", "content": [shot]}) > 500
    assert message_tokens({"role": "user", "content": [{"type": "text", "text": None}]}) < 10
    asked = Dumped(role="user", content=[{"type": "text", "text": "Which line defined value_7_2?"}])
    msgs = [*run(30)[:-1], asked]
    fitted = mem.fit(msgs, 1500, scope="run-1")             # rendered for the question in parts
    assert "value_7_2 = compute(2)" in fitted.messages[1]["content"]
    patch = {"id": "k", "type": "custom", "custom": {"name": "apply_patch", "input": "*** x"}}
    custom = {"role": "assistant", "content": None, "tool_calls": [patch]}
    mem.fit([*msgs, custom], 1500, scope="run-1")
    assert any(it.text == "apply_patch(*** x)" for it in mem.items(scope="run-1", kind="tool_call"))


def test_a_restricted_memory_fits_only_in_its_scopes(mem):
    with pytest.raises(AccessDeniedError):
        mem.restrict(["run-1"]).fit(run(2), 500, scope="run-2")


def test_the_rest_server_fits_the_same_way(mem):
    from server_utils import serving

    from suffice._server.rest import create_app
    msgs = run(30)
    with serving(create_app(mem)) as url:
        body = httpx.post(f"{url}/v1/fit", json={"scope": "run-1", "messages": msgs, "budget_tokens": 1200},
                          timeout=60).json()["fitted"]
    again = to_json(mem.fit(msgs, 1200, scope="run-1"))
    assert without_timings({**body, "stored": 0}) == without_timings(again)


def test_the_mcp_server_fits_the_same_way(mem):
    import anyio
    from mcp import Client

    from suffice._server.mcp import build_mcp_server
    msgs = run(30)

    async def main():
        async with Client(build_mcp_server(mem)) as client:
            result = await client.call_tool("fit", {"scope": "run-1", "messages": msgs,
                                                    "budget_tokens": 1200})
            assert not result.is_error, result.content
            return result.structured_content["fitted"]
    body = anyio.run(main)
    again = to_json(mem.fit(msgs, 1200, scope="run-1"))
    assert without_timings({**body, "stored": 0}) == without_timings(again)


def test_a_pending_call_whose_results_are_too_long_together_is_sent_with_every_result_cut(mem):
    """The current turn (the call and all its results) is what the next step reads: when the
    results do not fit whole, each is cut, none is dropped, and the call stays whole."""
    logs = ["\n".join(f"job {j} step {i} ok" for i in range(700)) + f"\nEND OF LOG {j}" for j in range(3)]
    msgs = [SYSTEM, {"role": "user", "content": "Fix the failing build."},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{j}", "type": "function",
                 "function": {"name": "logs", "arguments": f'{{"job": {j}}}'}}
                for j in range(3)]},
            *({"role": "tool", "tool_call_id": f"c{j}", "content": logs[j]} for j in range(3))]
    fitted = mem.fit(msgs, 4000, scope="run-1")
    assert fitted.tokens <= 4000
    tail = fitted.messages[-4:]
    assert tail[0] == msgs[2] and [m.get("tool_call_id") for m in tail[1:]] == ["c0", "c1", "c2"]
    for j, m in enumerate(tail[1:]):
        assert f"END OF LOG {j}" in m["content"] and "left out here to fit the budget" in m["content"]


def test_a_budget_that_cannot_hold_the_newest_turn_is_a_budget_error_after_storing(mem):
    msgs = [{"role": "user", "content": "Summarise this: " + "word " * 400}]
    with pytest.raises(BudgetError, match="newest message .* cannot be sent within 60 tokens"):
        mem.fit(msgs, 60, scope="run-1")
    assert len(mem.items(scope="run-1")) == 1  # stored all the same: nothing lost


def test_an_image_in_a_newest_message_that_is_cut_is_kept(mem):
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    msgs = [SYSTEM, {"role": "user", "content": [
        {"type": "text", "text": "What is wrong in this screenshot? " + "context " * 5000}, image]}]
    fitted = mem.fit(msgs, 3000, scope="run-1")  # an image counts 765 tokens
    newest = fitted.messages[-1]
    assert fitted.tokens <= 3000 and image in newest["content"]
    assert "left out here" in newest["content"][0]["text"]


@pytest.mark.parametrize("query", [5, "", "   "])
def test_a_bad_query_is_refused_before_anything_is_stored(mem, query):
    from suffice import InvalidQueryError

    with pytest.raises(InvalidQueryError, match="query must be non-empty text"):
        mem.fit(run(3), 200, scope="run-1", query=query)
    assert "run-1" not in mem.scopes()


@pytest.mark.parametrize("share", [0.25, 1.0])
def test_a_fitted_list_sent_back_grown_stores_only_the_new_messages(mem, share):
    """Some loops keep only what they sent: the fitted list, grown by the next turns. Its
    memory message says how many messages it stands for, so the ones after it keep their
    positions and nothing is stored twice, round after round. With the whole budget given to
    the recent window (share 1.0) no memory fits, and the header alone says it."""
    msgs = run(30)
    fitted = mem.fit(msgs, 800, scope="run-1", recent_share=share)
    assert fitted.dropped > 0 and f"({fitted.dropped} earlier messages;" in fitted.messages[1]["content"]
    stored = len(mem.items(scope="run-1", limit=None))
    sent = fitted.messages
    for n in range(3):
        new = [{"role": "assistant", "content": f"Step {n}: checking io.py again."},
               {"role": "user", "content": f"Round {n}: still failing."}]
        again = mem.fit([*sent, *new], 800, scope="run-1", recent_share=share)
        assert again.stored == 2 and again.tokens <= 800
        assert any(str(m["content"]).startswith("Memory of earlier steps") for m in again.messages)
        stored += 2
        assert len(mem.items(scope="run-1", limit=None)) == stored
        sent = again.messages
    # the same grown list as a whole history gives the same ids: nothing new either
    whole = [*msgs, *(m for n in range(3) for m in (
        {"role": "assistant", "content": f"Step {n}: checking io.py again."},
        {"role": "user", "content": f"Round {n}: still failing."}))]
    assert mem.fit(whole, 800, scope="run-1", recent_share=share).stored == 0


def test_a_message_sent_cut_and_sent_back_is_not_stored_again(mem):
    log = "Find the error line:\n" + "\n".join(f"log line {i} ok" for i in range(3000))
    msgs = [*run(10)[:-1], {"role": "user", "content": log}]
    fitted = mem.fit(msgs, 2000, scope="run-1")
    assert "left out here" in fitted.messages[-1]["content"]
    before = len(mem.items(scope="run-1", limit=None))
    again = mem.fit([*fitted.messages, {"role": "assistant", "content": "Line 42."}], 2000, scope="run-1")
    assert again.stored == 1 and len(mem.items(scope="run-1", limit=None)) == before + 1


def test_a_users_message_that_begins_like_memory_is_kept(mem):
    msgs = [SYSTEM, {"role": "user", "content": "Memory of earlier steps is hazy; what did we do?"}]
    fitted = mem.fit(msgs, 500, scope="run-1")
    assert fitted.messages == msgs and fitted.stored == 1


# -- what agent frameworks send (an audit's findings, 2026-12-05) ----------------------------------


def test_two_agents_of_one_user_may_open_with_the_same_message():
    """Ids came from session and position only: the second agent's first message clashed with
    the first agent's (ConflictError on every call)."""
    m = Memory(":memory:", embedder=HashEmbedder())
    opening = [SYSTEM, {"role": "user", "content": "Book me a flight to Oslo."}]
    for run_id in (None, "trip-7"):
        for agent in ("planner", "booker"):
            m.fit([*opening, {"role": "assistant", "content": f"{agent} on it"}], 500,
                  user_id=f"u-{run_id}", agent_id=agent, run_id=run_id)
        assert {it.agent for it in m.items(user_id=f"u-{run_id}")} == {"planner", "booker"}
    m.close()


def _words(n: int) -> str:
    return " ".join(["alpha"] * n)


def test_a_newest_turn_that_fits_only_without_the_header_is_cut_a_little_not_refused(mem):
    """It was refused with BudgetError (the cut allowed only half the room); sent whole, the
    list would lose its header, and sent back, its ids (everything stored again)."""
    system = {"role": "system", "content": _words(990)}
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "w", "type": "function", "function": {
        "name": "write_file", "arguments": json.dumps({"text": _words(4000)})}}]}
    result = {"role": "tool", "tool_call_id": "w", "content": _words(2960)}
    msgs = [system, {"role": "user", "content": "Write it."}, {"role": "assistant", "content": "On it."},
            call, result]
    assert sum(message_tokens(x) for x in (system, call, result)) <= 8000 < sum(map(message_tokens, msgs))
    fitted = mem.fit(msgs, 8000, scope="s")
    assert fitted.tokens <= 8000 and fitted.messages[-2] == call
    assert CUT_MARKER in fitted.messages[-1]["content"]
    assert fitted.messages[1]["content"].startswith("Memory of earlier steps (2 earlier messages")
    grown = [*fitted.messages, {"role": "user", "content": "Now test it."}]
    assert mem.fit(grown, 8000, scope="s").stored == 1  # sent back: nothing stored twice


def test_a_tool_result_with_nul_bytes_is_sent_as_it_came_and_stored_with_them_replaced(mem):
    """Every later step of the run failed on it (no store takes NUL)."""
    raw = "PK\x03\x04\x00\x00 binary head \udce9"
    msgs = [SYSTEM, {"role": "user", "content": "Look at data.bin"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "h", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "h", "content": raw}]
    for step in range(3):
        msgs.append({"role": "assistant", "content": f"step {step}"})
        fitted = mem.fit(msgs, 2000, scope="s")
        assert fitted.messages[3]["content"] == raw
    stored = [it for it in mem.items(scope="s") if it.kind == "tool_result"]
    assert len(stored) == 1 and stored[0].text == "PK\x03\x04\ufffd\ufffd binary head \ufffd"
    assert stored[0].meta["replaced_characters"] == 3


def test_the_runs_task_leads_the_memory_when_the_window_left_it_out(mem):
    """Asked to "continue", the render for that step dropped the task at some budgets."""
    msgs = [*run(60), {"role": "assistant", "content": "Done with that file."},
            {"role": "user", "content": "continue"}]
    for budget in (1000, 3000, 8000, 12000):
        fitted = mem.fit(msgs, budget, scope=f"s{budget}")
        memory = fitted.messages[1]["content"]
        assert "Fix the bug where read_csv drops the last row." in memory, budget
        assert fitted.tokens <= budget
    again = mem.fit([*fitted.messages, {"role": "user", "content": "continue"}], 3000, scope="s12000")
    assert "read_csv drops the last row" in again.messages[1]["content"]  # sent back: read from the store


def test_errors_name_the_message_by_its_place_in_the_list_as_sent_back(mem):
    fitted = mem.fit(run(40), 600, scope="s")
    sent_back = [*fitted.messages, {"role": "user", "content": 7}]
    with pytest.raises(InvalidItemError, match=f"message {len(sent_back) - 1}: content"):
        mem.fit(sent_back, 600, scope="s")


@pytest.mark.parametrize("msgs, message", [
    ([{"role": "user", "content": "go"}, {"role": "tool", "content": "ok"}],
     "message 2: a tool result needs"),
    ([{"role": "assistant", "content": None, "tool_calls": [{"id": "a", "type": "function",
      "function": {"name": "f", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "b", "content": "x"}],
     "message 2: it answers tool call 'b'"),
    ([{"role": "assistant", "content": None, "tool_calls": [{"id": "a", "type": "function",
      "function": {"name": "f", "arguments": "{}"}}]}, {"role": "user", "content": "and?"}],
     r"message 2: the tool call\(s\) 'a' of message 1 have no result"),
])
def test_tool_results_must_answer_the_calls_just_before_them(mem, msgs, message):
    """Chat APIs refuse such a list; fit said nothing and sent it on."""
    with pytest.raises(InvalidItemError, match=message):
        mem.fit([SYSTEM, *msgs], 500, scope="s")
    assert not mem.store.has_scope("s")


def test_calls_still_pending_at_the_end_are_fine(mem):
    pending = {"role": "assistant", "content": None, "tool_calls": [{"id": "p", "type": "function",
               "function": {"name": "f", "arguments": "{}"}}]}
    fitted = mem.fit([SYSTEM, {"role": "user", "content": "go"}, pending], 500, scope="s")
    assert fitted.messages[-1] == pending


def test_an_image_counts_as_much_as_the_largest_one_costs():
    shot = {"role": "user", "content": [{"type": "image_url",
                                         "image_url": {"url": "data:image/png;base64,AA"}}]}
    assert message_tokens(shot) >= 1445  # a tall screenshot at high detail, in OpenAI's accounting


def test_the_task_pinned_is_this_runs_own_and_shown_once(mem):
    """Runs without run_id share the session "agent": the first one's task was pinned in the
    second; and the render showed the pinned task a second time."""
    def loop(task: str) -> list[dict]:
        msgs = [SYSTEM, {"role": "user", "content": task}]
        for i in range(40):
            msgs += [{"role": "assistant", "content": f"step {i}: looked at file_{i}.py " + "x " * 30},
                     {"role": "user", "content": "continue"}]
        return msgs

    mem.fit(loop("Task A: fix the CSV reader in io.py."), 1500, scope="shared")
    fitted = mem.fit(loop("Task B: speed up the JSON writer."), 1500, scope="shared")
    memory = fitted.messages[1]["content"]
    assert "Task B" in memory and "Task A" not in memory.split("(end of the task)")[0]
    for budget in (1000, 1500, 3000):
        fitted = mem.fit(loop("Task C: add a --verbose flag."), budget, scope=f"c{budget}")
        memory = fitted.messages[1]["content"]
        assert memory.count("Task C: add a --verbose flag.") == 1, budget


def test_ollama_style_tool_calls_without_ids_are_paired_by_order(mem):
    msgs = [SYSTEM, {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "",
             "tool_calls": [{"function": {"name": "get_weather", "arguments": {}}}]},
            {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
            {"role": "assistant", "content": "It is sunny."}]
    assert mem.fit(msgs, 2000, scope="s").messages == msgs


def test_an_agent_and_a_session_named_alike_do_not_share_ids(mem):
    mem.fit([SYSTEM, {"role": "user", "content": "go"}], 500, user_id="u", session="planner/trip")
    mem.fit([SYSTEM, {"role": "user", "content": "go"}], 500, user_id="u", agent_id="planner", session="trip")
    assert len(mem.items(user_id="u")) == 2


def test_a_message_that_merely_quotes_the_cut_marker_is_stored(mem):
    """Only a cut copy sent back is skipped; a grep of the adapter's source printed the marker."""
    quoted = {"role": "user", "content": f"grep found: CUT_MARKER = \"{CUT_MARKER}\""}
    mem.fit([SYSTEM, quoted], 2000, scope="s")
    assert [it.text for it in mem.items(scope="s")] == [quoted["content"]]


def test_the_task_survives_steps_that_could_not_show_it_and_is_read_back_by_its_item(mem):
    """Sent back, the task came only from what the memory message carried: a step whose render
    showed it anyway, or that had room for the header alone, lost it for the rest of the run."""
    import random

    task = ("Refactor the zorblax parser so quuxfile headers are parsed lazily.\n(end of the task)\n"
            "And part two.")  # its own text holds the end line the memory puts after it
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    rng = random.Random(1)
    msgs = [SYSTEM, {"role": "user", "content": task}]
    shown = []
    for step in range(10):
        size = 340 if step == 6 else 600 if step == 4 else 40  # a header-only step, one the render fills
        msgs = [*msgs, {"role": "assistant", "content": f"Step {step}: I will run tool {step}."},
                {"role": "user", "content": f"output {step}: " + " ".join(rng.choices(words, k=size))}]
        fitted = mem.fit(msgs, 500, user_id="u", run_id="r1")
        assert fitted.tokens <= 500
        memory = fitted.messages[1]["content"] if len(fitted.messages) > 1 else ""
        shown.append(task in memory or task in [m.get("content") for m in fitted.messages])
        msgs = fitted.messages
    assert all(shown[-3:]) and sum(shown) >= 8, shown
    assert mem.stats(user_id="u").items == 1 + 2 * 10  # sent back each step: nothing stored twice


def test_an_id_less_call_left_unanswered_is_refused_too(mem):
    msgs = [SYSTEM, {"role": "user", "content": "two things"},
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "a", "arguments": {}}},
                                                               {"function": {"name": "b", "arguments": {}}}]},
            {"role": "tool", "content": "done a"}, {"role": "user", "content": "and?"}]
    with pytest.raises(InvalidItemError, match="message 4: 1 tool call"):
        mem.fit(msgs, 2000, scope="s")
