"""The CLI is a thin layer: it stores, searches and imports, and bad input is a one-line error."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from suffice import Memory
from suffice._cli import app

runner = CliRunner()


@pytest.fixture
def db(tmp_path):
    return str(tmp_path / "cli.db")


def run(*args):
    return runner.invoke(app, list(args))


def test_add_search_stats(db):
    r = run("--db", db, "add", "Dana adopted a grey cat named Figo.", "-s", "dana", "--speaker", "Dana")
    assert r.exit_code == 0, r.output
    r = run("--db", db, "search", "cat name", "-s", "dana", "--json")
    assert r.exit_code == 0
    data = json.loads(r.output)["evidence"]  # the REST server's JSON, field for field
    assert "Figo" in data["text"] and data["hits"][0]["item"]["id"]
    r = run("stats", "--db", db)
    assert r.exit_code == 0 and "items: 1" in r.output.replace("  ", "")


def test_add_from_jsonl_file(db, tmp_path):
    f = tmp_path / "items.jsonl"
    f.write_text('{"text": "one", "session": "a"}\n\n{"text": "two", "session": "b", "id": "x"}\n')
    assert run("--db", db, "add", "-f", str(f)).exit_code == 0
    assert run("--db", db, "add", "-f", str(f)).exit_code == 0  # the same file again adds nothing
    assert "items: 2" in run("--db", db, "stats").output.replace("  ", "")


def test_a_chat_export_without_ids_can_be_added_again_and_grown(db, tmp_path):
    """Lines without an id get one from their content (and which repeat of that line they
    are): an export added twice, or a longer export of the same chat, stores nothing twice,
    and a turn said twice is kept twice."""
    f = tmp_path / "export.jsonl"
    turns = [{"role": "user", "content": "ok"}, {"role": "assistant", "content": "Noted."},
             {"role": "user", "content": "ok"}]
    f.write_text("".join(json.dumps(t) + "\n" for t in turns))
    for _ in range(2):
        assert run("--db", db, "add", "-f", str(f), "-s", "alice").exit_code == 0
    f.write_text("".join(json.dumps(t) + "\n" for t in [*turns, {"role": "user", "content": "bye"}]))
    assert run("--db", db, "add", "-f", str(f), "-s", "alice").exit_code == 0
    assert "items: 4" in run("--db", db, "stats").output.replace("  ", "")


def test_the_same_line_in_two_files_is_two_turns_and_both_are_stored(db, tmp_path):
    """An implicit id comes from a line and the lines before it: "yes" after "Book the flight"
    is not "yes" after "Cancel my flight", and neither is lost; added under two runs, the same
    file is two runs' turns."""
    day1, day2 = tmp_path / "day1.jsonl", tmp_path / "day2.jsonl"
    day1.write_text('{"role":"user","content":"Book the flight to Rome."}\n{"role":"user","content":"yes"}\n')
    day2.write_text('{"role":"user","content":"Cancel my Rome flight."}\n{"role":"user","content":"yes"}\n')
    for f in (day1, day2):
        r = run("--db", db, "add", "-f", str(f), "--user", "ana")
        assert r.exit_code == 0 and "stored 2 new item(s) (0 already stored)" in r.output, r.output
    again = run("--db", db, "add", "-f", str(day1), "--user", "ana")
    assert "stored 0 new item(s) (2 already stored)" in again.output
    assert "items: 4" in run("--db", db, "stats").output.replace("  ", "")
    for chat in ("chat-1", "chat-2"):
        r = run("--db", db, "add", "-f", str(day1), "--user", "bo", "--run", chat)
        assert r.exit_code == 0, r.output
    assert run("--db", db, "items", "--user", "bo", "--json").output.count('"yes"') == 2


def test_stats_names_its_scope_as_every_other_command(db):
    run("--db", db, "add", "Ana likes tea.", "--user", "ana")
    run("--db", db, "add", "Bo likes tea.", "--user", "bo")
    whole = run("--db", db, "stats").output.replace("  ", "")
    r = run("--db", db, "stats", "--user", "ana")
    assert r.exit_code == 0, r.output
    assert "items: 1" in r.output.replace("  ", "") and "items: 2" in whole
    assert "scopes: 1" in r.output.replace("  ", "") and "scopes: 2" in whole


def test_an_item_error_names_the_files_line_and_a_refused_add_leaves_no_new_store(tmp_path):
    f = tmp_path / "items.jsonl"
    f.write_text('{"text": "fine"}\n\n{"role": "user", "content": "also fine"}\n{"text": "   "}\n')
    db = tmp_path / "new.db"
    r = run("--db", str(db), "add", "-f", str(f))
    assert r.exit_code == 2 and f"{f}:4: text is empty" in r.output, r.output
    assert not db.exists()
    assert run("--db", str(db), "add", "").exit_code == 2 and not db.exists()
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n  \n")
    r = run("--db", str(db), "add", "-f", str(blank))
    assert r.exit_code == 2 and "no items (every line is blank)" in r.output and not db.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("add", "   "), "text is empty"),
        (("add",), "nothing to add"),
        (("search", "x", "-s", "nobody"), "unknown scope 'nobody'"),
        (("search", "x", "--method", "psychic"), "unknown method"),
    ],
)
def test_bad_input_is_a_one_line_error_with_nonzero_exit(db, args, message):
    run("--db", db, "add", "something", "-s", "default")
    r = run("--db", db, *args)
    assert r.exit_code == 2
    assert message in r.output
    assert r.output.strip().count("\n") == 0


def test_malformed_jsonl_names_the_line_and_writes_nothing(db, tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"text": "fine"}\n{"text": \n')
    r = run("--db", db, "add", "-f", str(f))
    assert r.exit_code == 2 and "bad.jsonl:2" in r.output
    f.write_text('{"text": "fine"}\n{"text": ""}\n')
    r = run("--db", db, "add", "-f", str(f))
    assert r.exit_code == 2 and "bad.jsonl:2: text is empty" in r.output  # the file's line, not an index
    assert not Path(db).exists()  # nothing written, not even an empty store


def test_import_locomo_rejects_a_malformed_file_naming_the_record(db, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"sample_id": "c1", "conversation": {
        "session_1_date_time": "today", "session_1": [{"speaker": "A", "dia_id": "D1:1"}]}}]))
    r = run("--db", db, "import", "locomo", str(bad))
    assert r.exit_code == 2
    assert "c1" in r.output and "session_1 turn 0" in r.output and "missing text" in r.output
    r = run("--db", db, "stats")  # the file was refused before any store was opened
    assert r.exit_code == 2 and "no store at" in r.output


def test_a_refused_import_leaves_no_new_store(tmp_path):
    conv = {"session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [{"speaker": "A", "dia_id": "D1:1", "text": "a NUL \u0000 inside"}]}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"sample_id": "c1", "conversation": conv}]))
    db = tmp_path / "new.db"
    r = run("--db", str(db), "import", "locomo", str(bad))
    assert r.exit_code == 2 and "NUL" in r.output and not db.exists(), r.output


def test_import_locomo_with_one_sample_id_twice_stores_nothing(db, tmp_path):
    conv = {"session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [{"speaker": "A", "dia_id": "D1:1", "text": "hi"}]}
    other = {**conv, "session_1": [{"speaker": "B", "dia_id": "D1:1", "text": "another chat"}]}
    dup = tmp_path / "dup.json"
    dup.write_text(json.dumps([{"sample_id": "c1", "conversation": conv},
                               {"sample_id": "c1", "conversation": other}]))
    run("--db", db, "add", "something", "-s", "default")
    r = run("--db", db, "import", "locomo", str(dup))
    assert r.exit_code == 2 and "holds scope 'c1' twice" in r.output, r.output
    assert "c1" not in Memory(db, embedder=None).scopes()  # the first was not stored either


@pytest.mark.parametrize(("turn", "qa", "says"), [
    ({"speaker": "A", "dia_id": "D1:1", "text": None}, [], "text must be a string"),
    ({"speaker": "A", "dia_id": "D1:1", "text": "hi"}, [{"question": "q", "category": "multi-hop"}],
     "category must be a whole number"),
    ({"speaker": None, "dia_id": "D1:1", "text": "hi"}, [], "speaker must be a string"),  # was "None"
    ({"speaker": "A", "dia_id": {"x": 1}, "text": "hi"}, [], "dia_id must be a string"),
    ({"speaker": "A", "dia_id": "D1:1", "text": "hi"}, 5, "'qa' must be a list"),  # was a TypeError
])
def test_import_locomo_refuses_wrong_types_by_place_and_stores_nothing(db, tmp_path, turn, qa, says):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"sample_id": "c1", "qa": qa, "conversation": {
        "session_1_date_time": "today", "session_1": [turn]}}]))
    r = run("--db", db, "import", "locomo", str(bad))
    assert r.exit_code == 2 and says in r.output and "Traceback" not in r.output
    r = run("--db", db, "import", "locomo", str(tmp_path))  # a folder, not a file
    assert r.exit_code == 2 and "cannot read LoCoMo file" in r.output


def test_import_locomo_small_file(db, tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps([{"sample_id": "c1", "conversation": {
        "speaker_a": "A", "speaker_b": "B", "session_1_date_time": "1 May 2023",
        "session_1": [{"speaker": "A", "dia_id": "D1:1", "text": "I love hiking."},
                      {"speaker": "B", "dia_id": "D1:2", "text": "", "blip_caption": "a mountain"}]},
        "qa": [{"question": "What does A love?", "answer": "hiking", "evidence": ["D1:1"],
                "category": 4}]}]))
    r = run("--db", db, "import", "locomo", str(good))
    assert r.exit_code == 0, r.output
    r = run("--db", db, "search", "mountain photo", "-s", "c1", "--json")
    assert "a mountain" in json.loads(r.output)["evidence"]["text"]


def test_import_locomo_takes_a_file_or_loaded_conversations(tmp_path):
    """Both routes store the same items, and importing twice adds nothing."""
    from suffice import Memory
    from suffice._datasets.locomo import load_locomo

    f = tmp_path / "c.json"
    f.write_text(json.dumps([{"sample_id": "c1", "conversation": {
        "speaker_a": "A", "speaker_b": "B", "session_1_date_time": "1 May 2023",
        "session_1": [{"speaker": "A", "dia_id": "D1:1", "text": "I love hiking."},
                      {"speaker": "B", "dia_id": "D1:2", "text": "Me too."}]}, "qa": []}]))
    by_file = Memory(tmp_path / "a.db", embedder=None)
    by_convs = Memory(tmp_path / "b.db", embedder=None)
    assert by_file.import_locomo(f) == {"c1": 2}
    assert by_convs.import_locomo(load_locomo(f)) == {"c1": 2}
    assert [it.text for it in by_file.items(scope="c1")] == [it.text for it in by_convs.items(scope="c1")]
    assert by_file.import_locomo(f) == {"c1": 0}  # nothing new
    assert by_file.stats().items == 2


def test_ask_rejects_an_unknown_mode_or_router_before_loading_a_model(db):
    r = run("--db", db, "ask", "who?", "--mode", "quick")
    assert r.exit_code == 2 and "unknown mode 'quick'" in r.output
    r = run("--db", db, "ask", "who?", "--mode", "auto", "--router", "oracle")
    assert r.exit_code == 2 and "unknown router 'oracle'" in r.output


HOSTILE = ("[/bold] [red]x[/red] [link=http://e.vil]click[/link] \x1b[31mred\x1b[0m "
           "[shares a photo: a dog on the beach]")


def test_stored_text_is_printed_as_written_never_as_markup_or_terminal_codes(db):
    assert run("--db", db, "add", HOSTILE, "--scope", "[/x]").exit_code == 0
    for cmd in (["search", "photo dog click"], ["items"], ["render", "photo dog", "--budget", "300"]):
        r = run("--db", db, *cmd, "--scope", "[/x]")
        assert r.exit_code == 0, r.output
        assert "[/bold] [red]x[/red] [link=http://e.vil]click[/link]" in r.output
        assert "[shares a photo: a dog on the beach]" in r.output
        assert "\x1b" not in r.output and "\\x1b[31mred" in r.output  # shown, not obeyed
    r = run("--db", db, "search", "photo", "--scope", "[/x]", "--json")  # JSON stays exact
    assert json.loads(r.output)["evidence"]["hits"][0]["item"]["text"] == HOSTILE


def test_a_failed_model_is_never_printed_as_the_answer(db):
    from llm_server import FakeOpenAI, Reply

    run("--db", db, "add", "Dana adopted a grey cat named Figo.", "-s", "dana")
    with FakeOpenAI([Reply(status=500, body="[/yellow] boom \x1b]8;;http://e.vil\x1b\\")]) as srv:
        r = run("--db", db, "ask", "cat name?", "-s", "dana", "--provider", "http", "--base-url",
                srv.base_url, "--model", "m")
    assert r.exit_code == 1, r.output
    assert "(no answer: the model failed)" in r.output
    assert "[/yellow] boom" in r.output and "\x1b" not in r.output
    with FakeOpenAI([Reply(status=500, body="boom")] * 5) as srv:  # a script reads the exit code too
        r = run("--db", db, "ask", "cat name?", "-s", "dana", "--provider", "http", "--base-url",
                srv.base_url, "--model", "m", "--json")
    assert r.exit_code == 1 and json.loads(r.stdout)["failed"] is True


@pytest.mark.parametrize("cmd", [["serve", "--dev"], ["mcp", "--transport", "http"]])
def test_a_port_out_of_range_is_refused_before_anything_starts(db, cmd):
    r = run("--db", db, *cmd, "--port", "99999")
    assert r.exit_code == 2 and "65535" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("args", [
    ["search", "x", "-k", "99999999999999999999999"],
    ["render", "x", "--budget", "99999999999999999999999"],
    ["items", "--limit", "99999999999999999999"],
    ["ask", "x", "--tau", "5", "--provider", "http", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"],
    ["search", "\udcff\udcfe"],
])
def test_out_of_range_and_undecodable_arguments_are_one_line_errors(db, args):
    run("--db", db, "add", "x", "-s", "s")
    r = run("--db", db, *args, "-s", "s")
    assert r.exit_code == 2 and r.output.startswith("error: ") and "Traceback" not in r.output


def test_read_commands_never_create_a_store(tmp_path):
    missing = tmp_path / "typo" / "store.db"
    for cmd in (["search", "x"], ["items"], ["stats"], ["render", "x"], ["forget", "--all"]):
        r = run("--db", str(missing), *cmd)
        assert r.exit_code == 2 and "no store at" in r.output, (cmd, r.output)
    assert not missing.parent.exists()


def test_a_file_import_is_all_or_nothing(db, tmp_path):
    f = tmp_path / "items.jsonl"
    f.write_text("".join(json.dumps({"text": f"item {i}"}) + "\n" for i in range(50))
                 + json.dumps({"text": ""}) + "\n")
    r = run("--db", db, "add", "-f", str(f), "-s", "s")
    assert r.exit_code == 2 and "items.jsonl:51: text is empty" in r.output
    f.write_bytes(b'{"text": "fine"}\n{"text": "\xff\xfe"}\n')
    r = run("--db", db, "add", "-f", str(f), "-s", "s")
    assert r.exit_code == 2 and "not UTF-8" in r.output
    r = run("--db", db, "add", "-f", str(tmp_path), "-s", "s")
    assert r.exit_code == 2 and "not a file" in r.output


def test_check_passes_on_a_sound_store_and_fails_on_a_broken_one(db):
    run("--db", db, "add", "one", "two", "three", "-s", "s")
    r = run("--db", db, "check")
    assert r.exit_code == 0 and r.output.startswith("ok: 3 items")
    import sqlite3
    con = sqlite3.connect(db)
    con.execute("DELETE FROM embeddings WHERE seq = 0")
    con.execute("DELETE FROM pieces WHERE seq = 1")
    con.commit()
    con.close()
    r = run("--db", db, "check")
    assert r.exit_code == 1 and "items without a piece" in r.output


def test_retrieval_settings_before_the_command_apply_to_it_and_bad_ones_are_one_line_errors(db):
    assert run("--db", db, "add", "Dana adopted a grey cat named Figo.", "-s", "dana").exit_code == 0
    r = run("--retrieval", "dense_weight=3", "--db", db, "search", "cat name", "-s", "dana")
    assert r.exit_code == 0 and "Figo" in r.output
    r = run("--retrieval", "dense_weight=-1", "--db", db, "search", "cat name", "-s", "dana")
    assert r.exit_code == 2 and "dense_weight" in r.output and "Traceback" not in r.output
    r = run("--retrieval", "no_such_knob=1", "--db", db, "search", "cat name", "-s", "dana")
    assert r.exit_code == 2 and "no_such_knob" in r.output


@pytest.mark.parametrize(("flags", "says"), [
    (["--lam", "0.3"], "--lam, --tier-cap, --strategy and --tier-models go with --tiered"),
    (["--strategy", "reasoning"], "--lam, --tier-cap, --strategy and --tier-models go with --tiered"),
    (["--tiered", "--mode", "fast"], "--tiered runs on the deep path: use --mode deep"),
    (["--tiered", "--tier-models", "a,b,c"], "--tier-models goes with --strategy capacity"),
    (["--tiered", "--strategy", "capacity", "--tier-models", "a,b"], "three models, low,mid,high"),
])
def test_ask_refuses_tier_flags_that_do_not_go_together(db, flags, says):
    run("--db", db, "add", "Dana adopted a grey cat named Figo.", "-s", "dana")
    r = run("--db", db, "ask", "cat name?", "-s", "dana", *flags)
    assert r.exit_code == 2 and says in r.output


def test_ask_tiered_prints_each_modules_tier_and_cost(db):
    from llm_server import FakeOpenAI, Reply, chat_body

    run("--db", db, "add", "Dana adopted a grey cat named Figo.", "-s", "dana")
    with FakeOpenAI([Reply(body=chat_body("<answer>Figo</answer>"))] * 4) as srv:
        r = run("--db", db, "ask", "What is the cat called?", "-s", "dana", "--tiered",  # deep by default
                "--tier-cap", "low", "--provider", "http", "--base-url", srv.base_url, "--model", "m")
    assert r.exit_code == 0, r.output
    assert "Figo" in r.output
    for module in ("filter", "entity", "temporal", "topic", "summary"):
        assert f"module {module}: low by rules" in r.output


def test_ask_tiered_takes_the_reasoning_and_capacity_strategies(db):
    run("--db", db, "add", "Dana adopted a grey cat named Figo.", "-s", "dana")
    # reasoning: every tier, Low included, is a call of the one model (rules only as the floor)
    r = run("--db", db, "ask", "cat name?", "-s", "dana", "--tiered", "--strategy", "reasoning",
            "--tier-cap", "low", "--provider", "scripted", "--model", "Figo")
    assert r.exit_code == 0, r.output
    for module in ("entity", "temporal", "topic", "summary"):
        assert f"module {module}: low by scripted" in r.output
    # capacity: each tier asks its own model of the three named; capped at Low, only the small one
    from llm_server import FakeOpenAI, Reply, chat_body

    with FakeOpenAI([Reply(body=chat_body("<answer>Figo</answer>"))]) as srv:
        r = run("--db", db, "ask", "cat name?", "-s", "dana", "--tiered", "--strategy", "capacity",
                "--tier-models", "small,medium,large", "--tier-cap", "low", "--provider", "http",
                "--base-url", srv.base_url, "--model", "reader", "--json")
    assert r.exit_code == 0, r.output
    assert {req["model"] for req in srv.requests} == {"small", "reader"}
    assert {m["model"] for m in json.loads(r.output)["answer"]["receipt"]["modules"]} <= {"small", "rules"}


def test_forget_reports_counts_and_says_only_what_is_left_to_do(db):
    run("--db", db, "add", "Ana's locker code is 4471.", "-s", "ana", "--id", "code")
    r = run("--db", db, "forget", "-s", "ana", "--id", "code")
    assert r.exit_code == 0, r.output
    assert r.output.startswith("forgot 1 item(s)") and "VACUUM" not in r.output
    r = run("--db", db, "forget", "-s", "ana", "--id", "code")
    assert r.output.strip() == "forgot 0 item(s): 0 pieces, 0 vectors, 0 records, 0 links"


def test_forget_all_refuses_any_session_even_the_unnamed_one(db):
    """`--all --session ""` would forget only the items of the unnamed session: refused."""
    run("--db", db, "add", "Ana's locker code is 4471.", "-s", "ana")
    r = run("--db", db, "forget", "-s", "ana", "--all", "--session", "")
    assert r.exit_code != 0 and "do not combine it with --id or --session" in r.output
    assert run("--db", db, "items", "-s", "ana").output.count("4471") == 1


def test_an_errors_notes_are_printed_with_it(db, monkeypatch):
    """A failed transfer says in notes what it left behind; the CLI must not drop them."""
    from suffice import Memory, StoreError

    def broken(self, *args, **kwargs):
        exc = StoreError("the store could not finish")
        exc.add_note("scope 'dana' still holds 3 item(s) it added; forget them by hand")
        raise exc

    run("--db", db, "add", "Dana adopted a grey cat named Figo.", "-s", "dana")
    monkeypatch.setattr(Memory, "search", broken)
    r = run("--db", db, "search", "cat", "-s", "dana")
    assert r.exit_code == 2 and "the store could not finish" in r.output
    assert "still holds 3 item(s) it added" in r.output



@pytest.mark.parametrize("setting", ["encoder=foo", "encoder_dim=12"])
def test_rebuild_refuses_the_encoder_as_a_setting_and_points_to_encoder(db, setting):
    """It printed 'rebuilt ... with encoder=foo' and changed nothing."""
    run("--db", db, "add", "something", "-s", "default")
    r = run("--db", db, "rebuild", "--set", setting)
    assert r.exit_code == 2 and "--encoder DIR" in r.output



@pytest.mark.parametrize(("extra", "said"), [(("-s", "nobody"), "unknown scope 'nobody'"),
                                             (("--mode", "auto", "--router", "."), "not a trained")])
def test_ask_checks_what_it_can_before_a_model_loads(db, monkeypatch, extra, said):
    """A local model takes seconds to load: a mistyped scope or router folder is said first."""
    import suffice._cli as cli_module

    def no_model(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("a model was loaded before the checks")

    monkeypatch.setattr(cli_module, "make_reader", no_model)
    run("--db", db, "add", "something", "-s", "default")
    r = run("--db", db, "ask", "What?", *extra)
    assert r.exit_code == 2 and said in r.output, r.output


@pytest.mark.parametrize("args", [("bench", "qa", "--json", "{dir}"), ("bench", "qa", "--out", "{dir}"),
                                  ("train", "router", "--out", "{file}"),
                                  ("bench", "render", "--plot", "{dir}")])
def test_an_output_path_of_the_wrong_kind_is_refused_before_any_work(tmp_path, args):
    """A folder where a file goes (or the reverse) failed with a raw traceback after the run."""
    (tmp_path / "afile").write_text("x")
    r = run(*[a.format(dir=tmp_path, file=tmp_path / "afile") for a in args])
    said = " ".join(r.output.translate(str.maketrans("", "", "│╭╮╰╯─")).split())
    assert r.exit_code == 2 and ("is a directory" in said or "is a file" in said), r.output



@pytest.mark.parametrize("args,said", [
    (("bench", "qa", "--out", "{tiers}"), "does not hold `bench qa` records"),
    (("bench", "agent", "qa", "--out", "{qa}"), "does not hold `bench agent qa` records"),
    (("bench", "agent", "evidence", "--records", "{store}"), "does not hold `bench agent recall` records"),
    (("bench", "qa", "--out", "{qa}", "--json", "{qa}"), "is the records file"),
    (("bench", "progressive", "--out", "{new}", "--json", "{store}", "--store", "{store}"), "is an input"),
    (("bench", "progressive", "--out", "{new}", "--plot", "{tmp}/curve.txt"), "give a file ending in .png"),
    (("bench", "tiers", "--out", "{new}", "--json", "{tmp}/same", "--plot", "{tmp}/same"), "the same file"),
    (("bench", "qa", "--variants", " ,"), "--variants names none"),
    (("bench", "qa", "--out", "{cutqa}", "--variants", " ,"), "--variants names none"),  # resumable: passes
    (("bench", "qa", "--out", "{cuttiers}"), "does not hold `bench qa` records"),
])
def test_a_benchmark_refuses_files_that_would_mix_or_overwrite_records_before_any_work(
        tmp_path, monkeypatch, args, said):
    """Appending to another benchmark's records, or writing the summary over the records (or
    the store) it was computed from, used to happen after hours of answers."""
    import suffice._cli as cli_module

    def no_model(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("the run started before the checks")

    monkeypatch.setattr(cli_module, "make_reader", no_model)
    monkeypatch.setattr(cli_module, "locomo_run", no_model)
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"variant": "fast", "key": "conv-26#0", "em": 0.0}) + "\n")
    tiers = tmp_path / "tiers.jsonl"
    tiers.write_text(json.dumps({"variant": "all-Low", "key": "conv-26#0", "pipeline_usd": 0.0}) + "\n")
    store = tmp_path / "m.db"
    Memory(store, embedder=None).close()
    cutqa = tmp_path / "cutqa.jsonl"  # a kill cut the very first record: the run redoes it
    cutqa.write_text('{"variant": "fa\n' + qa.read_text())
    cuttiers = tmp_path / "cuttiers.jsonl"
    cuttiers.write_text('{"variant": "al\n' + tiers.read_text())
    paths = {"tiers": tiers, "qa": qa, "store": store, "new": tmp_path / "new.jsonl", "tmp": tmp_path,
             "cutqa": cutqa, "cuttiers": cuttiers}
    r = run(*[a.format(**paths) for a in args])
    out = " ".join(r.output.translate(str.maketrans("", "", "│╭╮╰╯─")).split())
    assert r.exit_code != 0 and said in out, r.output
    assert json.loads(qa.read_text()) == {"variant": "fast", "key": "conv-26#0", "em": 0.0}


@pytest.mark.parametrize("args", [("bench", "qa", "--limit", "0"), ("bench", "render", "--limit", "-1"),
                                  ("bench", "agent", "qa", "--episodes", "0")])
def test_a_count_below_one_is_refused_not_run_as_one_or_as_none(args):
    """--limit 0 ran one question; render crashed on it; --episodes 0 made an empty run."""
    r = run(*args)
    assert r.exit_code == 2 and "greater than or equal to 1" in r.output, r.output



@pytest.mark.parametrize("lambdas", ["", "nan", "-1", "0,x"])
def test_cost_weights_that_are_none_or_not_numbers_of_0_or_more_are_refused(tmp_path, lambdas):
    """'' trained nothing and said rc 0; nan was a raw ValueError; -1 paid the policy to spend."""
    r = run("train", "tiers", "--out", str(tmp_path / "t"), f"--lambdas={lambdas}")
    assert r.exit_code == 2 and "numbers of 0 or more" in r.output, r.output



@pytest.mark.parametrize("budgets", ["abc", "0", "4000,-1"])
def test_recall_budgets_that_are_not_whole_numbers_above_0_are_refused(tmp_path, budgets):
    r = run("bench", "agent", "evidence", "--budgets", budgets, "--store", str(tmp_path / "s.db"),
            "--records", str(tmp_path / "r.jsonl"))
    assert r.exit_code == 2 and "whole numbers above 0" in r.output and not (tmp_path / "s.db").exists()


def test_an_import_stopped_halfway_says_that_the_same_command_finishes_it(db, tmp_path, monkeypatch):
    from suffice._api import Memory as Mem

    def stopped(self, convs, progress=None):  # type: ignore[no-untyped-def]
        self.add("the first turn", scope="conv-1")
        raise KeyboardInterrupt

    monkeypatch.setattr(Mem, "import_locomo", stopped)
    monkeypatch.setattr("suffice._datasets.locomo.load_locomo", lambda file=None: [])
    r = run("--db", db, "import", "locomo")
    said = " ".join(r.output.translate(str.maketrans("", "", "│╭╮╰╯─")).split())
    assert r.exit_code != 0 and "the same command again adds only the rest" in said, r.output
    with Memory(db) as mem:
        assert mem.scopes() == ["conv-1"]  # what was stored stays


def test_the_router_trainer_takes_one_way_of_setting_tau(tmp_path):
    """--stop-rate used to override --precision without a word."""
    r = run("train", "router", "--out", str(tmp_path / "r"), "--precision", "0.8", "--stop-rate", "0.5")
    assert r.exit_code != 0 and "give one" in r.output and not (tmp_path / "r").exists()


def test_a_failed_import_into_a_new_file_keeps_what_another_program_wrote_there(tmp_path):
    """The file the import created used to be removed whole, another writer's items with it."""
    from suffice._cli import store_to_fill

    path = tmp_path / "new.db"
    with pytest.raises(KeyboardInterrupt), store_to_fill(str(path)):
        other = Memory(path, embedder=None)
        other.add("the only copy of this note", scope="alice")
        other.close()
        raise KeyboardInterrupt  # the import stopped halfway
    with Memory(path, embedder=None) as mem:
        assert [it.text for it in mem.items(scope="alice")] == ["the only copy of this note"]
    empty = tmp_path / "empty.db"
    with pytest.raises(KeyboardInterrupt), store_to_fill(str(empty)):
        raise KeyboardInterrupt
    assert not empty.exists()  # nothing but the import's own (undone) work: no file left


def test_json_output_is_the_servers_json_field_for_field(db):
    """docs/server.md promises every surface the same JSON; the CLI printed shapes of its own."""
    from suffice import Memory
    from suffice._server.wire import to_json, without_timings

    run("--db", db, "add", "Dana adopted a grey cat named Figo.", "-s", "dana", "--id", "d1")
    mem = Memory(db)
    try:
        expected = {
            ("search", "cat", "-s", "dana", "--json"): {"evidence": to_json(mem.search("cat", scope="dana"))},
            ("items", "-s", "dana", "--json"): {"items": to_json(mem.items(scope="dana", limit=50))},
            ("get", "d1", "-s", "dana"): {"item": to_json(mem.get("d1", scope="dana"))},
            ("render", "cat", "-s", "dana", "--json"): {
                "context": to_json(mem.render("cat", 2000, scope="dana"))},
        }
    finally:
        mem.close()
    for args, want in expected.items():
        r = run("--db", db, *args)
        assert r.exit_code == 0, (args, r.output)
        assert without_timings(json.loads(r.output)) == without_timings(want), args


def test_an_empty_db_option_is_refused_not_read_as_the_default_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = run("--db", "", "add", "hello")
    assert r.exit_code == 2 and "--db is empty" in r.output
    assert not (tmp_path / "suffice.db").exists()
