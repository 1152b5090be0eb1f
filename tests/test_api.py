"""The Memory API as a user meets it: chat messages, identities, listing, configs per call,
one retrieval per question, async twins, and threads that end when the memory is closed."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime

import pytest
from conftest import history_items

from suffice import (
    AsyncMemory,
    BudgetError,
    ConfigError,
    EngineConfig,
    InvalidItemError,
    InvalidQueryError,
    Memory,
    NewItem,
    NotFoundError,
    ProviderError,
    RenderConfig,
    RetrievalConfig,
    ScriptedLLM,
    StoreConfig,
    UnknownScopeError,
)

CHAT = [
    {"role": "system", "content": "You are a travel assistant."},
    {"role": "user", "content": "I'm planning a trip to Kyoto in October.", "name": "ana"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "weather", "arguments": "{\"city\": \"Kyoto\", \"month\": 10}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "October in Kyoto: 18C, dry."},
    {"role": "assistant", "content": [{"type": "text", "text": "October is mild and dry."},
                                      {"type": "image_url", "image_url": {"url": "https://x/map.png"}}]},
]


def test_chat_messages_become_items_of_their_own_kind(memory: Memory):
    stored = memory.add(CHAT, user_id="ana", run_id="trip-1", observed_at="2025-05-01")
    assert [(it.kind, it.role, it.speaker) for it in stored] == [
        ("message", "system", "system"), ("message", "user", "ana"), ("tool_call", "assistant", "assistant"),
        ("tool_result", "tool", "tool"), ("message", "assistant", "assistant")]
    call, result, last = stored[2], stored[3], stored[4]
    assert call.text == 'weather({"city": "Kyoto", "month": 10})'  # the arguments verbatim
    assert call.meta == {"tool": "weather", "tool_call_id": "call_1"}
    assert result.meta["tool_call_id"] == "call_1" and result.text == "October in Kyoto: 18C, dry."
    assert last.text == "October is mild and dry.\n[image_url]"
    assert last.meta["parts"] == [{"type": "image_url", "image_url": {"url": "https://x/map.png"}}]
    assert all(it.scope == "user:ana" and it.session == "trip-1" for it in stored)
    assert stored[0].observed_ts == datetime(2025, 5, 1, tzinfo=UTC).timestamp()  # parsed once, as UTC


@pytest.mark.parametrize(("bad", "message"), [
    ({"role": "robot", "content": "hi"}, "role must be one of"),
    ({"role": "user", "content": 5}, "content must be"),
    ({"role": "assistant", "content": None}, "neither content nor tool calls"),
    ({"role": "assistant", "content": None, "tool_calls": [{"function": {}}]}, "no function name"),
])
def test_a_malformed_message_names_what_is_wrong_and_writes_nothing(memory: Memory, bad, message):
    before = memory.stats("dana").items
    with pytest.raises(InvalidItemError, match=message):
        memory.add([{"role": "user", "content": "fine"}, bad], scope="dana")
    assert memory.stats("dana").items == before


def test_a_broken_router_folder_in_the_environment_fails_auto_only_and_names_the_variable(
        memory: Memory, tmp_path, monkeypatch):
    from suffice import ModelFileError
    monkeypatch.setenv("SUFFICE_ROUTER", str(tmp_path / "router"))
    fresh = Memory(memory.store, embedder=memory.embedder)  # resolves its default router anew
    assert fresh.ask("Where does Dana live?", scope="dana", llm=ScriptedLLM("Porto")).text == "Porto"
    with pytest.raises(ModelFileError, match=r"\$SUFFICE_ROUTER=.*router.*train one there"):
        fresh.ask("Where does Dana live?", scope="dana", llm=ScriptedLLM("Porto"), mode="auto")


def test_a_tool_result_with_no_output_is_remembered_as_such(memory: Memory):
    blank = [{"type": "text", "text": " \n"}]
    stored = memory.add([{"role": "tool", "tool_call_id": "c1", "content": ""},
                         {"role": "tool", "tool_call_id": "c2", "content": blank}], scope="dana")
    assert [it.text for it in stored] == ["(no output)", "(no output)"]
    assert stored[0].meta == {"tool_call_id": "c1", "empty": True}
    assert stored[1].meta == {"tool_call_id": "c2", "empty": True, "content": " \n"}  # nothing lost


def test_an_item_whose_own_session_is_not_the_run_id_is_refused_and_nothing_is_stored(memory: Memory):
    """Stored under its own session, the item would be out of reach of the run: a forget by
    run_id would report success and delete nothing."""
    with pytest.raises(InvalidItemError, match="item 1: session 's1' is not run_id 'r'"):
        memory.add(["fine", {"text": "x", "session": "s1"}], user_id="ana", run_id="r")
    with pytest.raises(InvalidItemError, match="is not run_id"):
        memory.add([NewItem(text="y", session="s2")], user_id="ana", run_id="r")
    assert "user:ana" not in memory.scopes()  # the batch is refused whole
    stored = memory.add([{"text": "z", "session": "r"}, NewItem(text="w")], user_id="ana", run_id="r")
    assert [it.session for it in stored] == ["r", "r"]
    assert memory.forget(user_id="ana", run_id="r").items == 2


def test_ids_map_onto_hard_scopes_and_narrow_within_them(memory: Memory):
    memory.add("Ana likes green tea.", user_id="ana", run_id="r1")
    memory.add("Ana switched to coffee.", user_id="ana", run_id="r2", agent_id="barista")
    memory.add("Bo likes green tea too.", user_id="bo")
    # All runs of a user are one query; a run or an agent narrows it.
    assert [i.text for i in memory.items(user_id="ana")] == ["Ana likes green tea.",
                                                             "Ana switched to coffee."]
    assert [i.text for i in memory.items(user_id="ana", run_id="r2")] == ["Ana switched to coffee."]
    assert [i.text for i in memory.items(user_id="ana", agent_id="barista")] == ["Ana switched to coffee."]
    hits = memory.search("green tea", user_id="ana", k=5)
    assert {h.item.scope for h in hits} == {"user:ana"}
    with pytest.raises(UnknownScopeError):  # alone, agent_id names a scope of its own: empty here
        memory.search("coffee", agent_id="barista")
    with pytest.raises(InvalidQueryError, match="not both"):
        memory.search("tea", scope="dana", user_id="ana")


def test_get_and_items_filter_and_page(memory: Memory):
    every = memory.items(scope="dana")
    assert [i.seq for i in every] == list(range(len(every)))
    assert memory.get(every[3].id, scope="dana") == every[3]
    with pytest.raises(NotFoundError):
        memory.get(every[3].id, scope="someone-else")
    page = memory.items(scope="dana", offset=5, limit=4)
    assert page == every[5:9]
    assert memory.items(scope="dana", newest_first=True, limit=2) == every[::-1][:2]
    dana = memory.items(scope="dana", speaker="Dana", since="2025-06-01", until="2025-10-01")
    assert dana and all(i.speaker == "Dana" and "2025-06-01" <= i.observed_at < "2025-10-01" for i in dana)
    assert memory.items(scope="nobody") == []
    with pytest.raises(InvalidQueryError, match="limit"):
        memory.items(scope="dana", limit=-1)
    with pytest.raises(InvalidQueryError, match="since"):
        memory.items(scope="dana", since="sometime soon")


class Counting:
    """Counts BM25 queries and query embeddings reaching the store and the model."""

    def __init__(self, memory: Memory):
        self.bm25 = self.embeds = 0
        store, embedder = memory.store, memory.embedder
        # MiniLM runs batches and queries (each on its own session) through _embed.
        runs = "_embed" if hasattr(embedder, "_embed") else "embed"
        bm25, embed = store.bm25, getattr(embedder, runs)

        def count_bm25(*a, **kw):
            self.bm25 += 1
            return bm25(*a, **kw)

        def count_embed(texts, *a):
            self.embeds += len(texts)
            return embed(texts, *a)
        store.bm25 = count_bm25  # type: ignore[method-assign]
        setattr(embedder, runs, count_embed)


@pytest.mark.parametrize("context", ["render", "prefix"])
def test_a_fast_ask_runs_one_bm25_query_and_one_query_embedding(tmp_path, embedder, context):
    from suffice import MiniLMEmbedder
    fresh = MiniLMEmbedder(query_cache=0)  # no cached query vectors: every embedding is counted
    mem = Memory(tmp_path / "m.db", embedder=fresh)
    mem.add(history_items(), scope="dana")
    seen = Counting(mem)
    ans = mem.ask("What is the name of Dana's cat?", scope="dana", engine=EngineConfig(context=context),
                  llm=ScriptedLLM(lambda m: "<answer>Figo</answer>"))
    assert ans.text == "Figo" and ans.receipt.context_tokens > 0
    assert (seen.bm25, seen.embeds) == (1, 1)
    mem.close()


def test_a_deep_ask_also_retrieves_once(tmp_path, embedder):
    from suffice import MiniLMEmbedder
    mem = Memory(tmp_path / "m.db", embedder=MiniLMEmbedder(query_cache=0))
    mem.add(history_items(), scope="dana")
    seen = Counting(mem)
    mem.ask("When is the Kyoto trip?", scope="dana", mode="deep",
            llm=ScriptedLLM(lambda m: "<answer>November</answer>"))
    assert (seen.bm25, seen.embeds) == (1, 1)
    mem.close()


def test_a_config_passed_to_a_call_applies_whole_and_only_to_that_call(memory: Memory):
    assert len(memory.search("Kyoto", scope="dana").hits) == 10
    assert len(memory.search("Kyoto", scope="dana", retrieval=RetrievalConfig(k=3)).hits) == 3
    assert len(memory.search("Kyoto", scope="dana").hits) == 10
    timeline = memory.render("Kyoto", 400, scope="dana", render=RenderConfig(mode="timeline"))
    assert {p.kind for p in timeline.parts} == {"record"}
    # The engine config reaches the reader's budget, the render config the reader's context.
    llm = ScriptedLLM(lambda m: "<answer>ok</answer>")
    r = memory.ask("Kyoto", scope="dana", llm=llm, engine=EngineConfig(reader_budget=300),
                   render=RenderConfig(mode="timeline")).receipt
    assert r.context_tokens <= 285 and {p.kind for p in r.parts} == {"record"}


@pytest.mark.parametrize(("call", "error"), [
    (lambda m: m.ask("q", scope="dana", tau=2.0, llm=ScriptedLLM("x")), ConfigError),
    (lambda m: m.ask("q", scope="dana", budget=-5, llm=ScriptedLLM("x")), ConfigError),
    (lambda m: m.search("q", scope="dana", k="3"), InvalidQueryError),
    (lambda m: m.search("q", scope="dana", k=1.5), InvalidQueryError),
    (lambda m: m.search("q", scope="dana", retrieval={"k": 3}), ConfigError),
    (lambda m: m.search("", scope="dana"), InvalidQueryError),
    (lambda m: m.ask("  ", scope="dana", llm=ScriptedLLM("x")), InvalidQueryError),
    (lambda m: m.render("q", -1, scope="dana"), BudgetError),
    (lambda m: m.search("q", scope="ghost"), UnknownScopeError),
    (lambda m: RetrievalConfig(k=-1), ConfigError),
    (lambda m: EngineConfig(anchor_blocks=5, max_blocks=4), ConfigError),
    (lambda m: m.add(5, scope="dana"), InvalidItemError),
    (lambda m: m.add([None], scope="dana"), InvalidItemError),
    (lambda m: m.add("x", scope="dana", batch_size=0), InvalidItemError),
    # keys of mixed kinds cannot be written sorted, as the stores write meta (a raw TypeError)
    (lambda m: m.add(["a", {"text": "b", "meta": {1: "x", "k": 2}}], scope="dana"), InvalidItemError),
    # a number key would come back as text: what is read would not be what was given
    (lambda m: m.add({"text": "b", "meta": {"outer": [{2: "x"}]}}, scope="dana"), InvalidItemError),
    (lambda m: m.ask("q", scope="dana", llm="http"), InvalidQueryError),  # a name, not a model
    (lambda m: m.ask("q", scope="dana", llm=ScriptedLLM("x"), deep_llm="gpt-4o"), InvalidQueryError),
    (lambda m: m.ask("q", scope="dana", llm=ScriptedLLM("x"), mode="auto", router=object()),
     InvalidQueryError),
])
def test_bad_arguments_are_refused_at_the_boundary_with_a_suffice_error(memory: Memory, call, error):
    with pytest.raises(error):
        call(memory)


def test_async_memory_gives_the_same_results(tmp_path, embedder):
    async def main():
        async with AsyncMemory(tmp_path / "a.db", embedder=embedder) as mem:
            stored = await mem.add(history_items(), scope="dana")
            ev = await mem.search("cat name", scope="dana", k=3)
            ctx = await mem.render("cat name", 300, scope="dana")
            ans = await mem.ask("cat name?", scope="dana", llm=ScriptedLLM(lambda m: "<answer>Figo</answer>"))
            listed = await mem.items(scope="dana", limit=3)
            report = await mem.forget(scope="dana", ids=[stored[0].id])
            sync = mem.memory
            return ev, ctx, ans, listed, report, sync.search("cat name", scope="dana", k=3)

    ev, ctx, ans, listed, report, again = asyncio.run(main())
    assert [h.item.text for h in ev.hits] and ctx.tokens <= ctx.cap and ans.text == "Figo"
    assert len(listed) == 3 and report.items == 1
    assert len(again.hits) == 3


def test_an_async_memory_used_after_close_says_it_is_closed(tmp_path, embedder):
    from suffice import ConfigError, StoreError

    async def main():
        mem = AsyncMemory(tmp_path / "a.db", embedder=embedder)
        await mem.add("x", scope="s")
        await mem.aclose()
        with pytest.raises(StoreError, match="is closed"):
            await mem.items(scope="s")

    asyncio.run(main())
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ConfigError, match="workers"):
            AsyncMemory(tmp_path / "b.db", embedder=embedder, workers=bad)
    assert not (tmp_path / "b.db").exists()  # refused before a store is opened


def test_closing_the_memory_ends_its_threads(tmp_path, embedder):
    before = {t.ident for t in threading.enumerate()}
    mem = Memory(tmp_path / "m.db", embedder=embedder)
    mem.add(history_items(), scope="dana")
    mem.search("Kyoto", scope="dana")
    ours = [t for t in threading.enumerate() if t.ident not in before and t.name.startswith("suffice")]
    assert ours  # BM25 ran on the memory's worker thread
    mem.close()
    assert not any(t.is_alive() for t in ours)


def test_many_threads_share_one_memory_safely(memory: Memory):
    errors: list[BaseException] = []

    def reader(i: int) -> None:
        try:
            for _ in range(5):
                memory.search(f"Kyoto trip {i}", scope="dana", k=5)
                memory.render(f"cat {i}", 300, scope="dana")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def writer() -> None:
        try:
            for i in range(10):
                memory.add(NewItem(f"note {i} about the river gauge", session="s9"), scope="dana")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = ([threading.Thread(target=reader, args=(i,)) for i in range(4)]
               + [threading.Thread(target=writer)])
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(memory.items(scope="dana", session="s9")) == 10


def test_a_message_may_carry_its_own_item_fields_and_every_text_part_is_searchable(memory: Memory):
    [a, b] = memory.add([
        {"role": "user", "content": [{"type": "input_text", "text": "I bought a red kayak."}],
         "observed_at": "2025-07-04", "session": "s-own", "meta": {"mood": "happy"}},
        {"role": "assistant", "content": None, "refusal": "I cannot book the kayak trip."},
    ], scope="dana", observed_at="2025-01-01")
    assert (a.observed_at, a.session, a.meta) == ("2025-07-04", "s-own", {"mood": "happy"})
    assert a.observed_ts == datetime(2025, 7, 4, tzinfo=UTC).timestamp()
    assert b.text == "I cannot book the kayak trip." and b.observed_at == "2025-01-01"
    assert {h.item.id for h in memory.search("kayak", scope="dana", k=3, method="bm25")} == {a.id, b.id}


def test_a_filter_narrows_dense_search_on_a_large_scope_too(memory: Memory):
    narrow = RetrievalConfig(dense_scan_items=5)  # the 30 items count as "many"
    session = memory.items(scope="dana")[-1].session
    ev = memory.search("grey cat shelter", scope="dana", k=5, method="dense", session=session,
                       retrieval=narrow)
    mine = [i for i in memory.items(scope="dana") if i.session == session]
    assert len(ev.hits) == min(5, len(mine)) and all(h.item.session == session for h in ev.hits)


def test_a_filtered_render_shows_no_words_of_the_items_it_leaves_out(tmp_path, embedder):
    mem = Memory(tmp_path / "m.db", embedder=embedder)
    mem.add([NewItem("The launch code for project zebra is 7741.", speaker="Ops"),
             NewItem("Book a table for two in Kyoto.", speaker="Ann"),
             NewItem("Kyoto trip planning continues.", speaker="Ann")], user_id="u", agent_id="travel")
    mem.add("Remember the zebra launch code 7741.", user_id="u", agent_id="ops")
    ctx = mem.render("Kyoto zebra code", 2000, user_id="u", agent_id="travel")
    assert "Kyoto" in ctx.text and "7741" in ctx.text  # the travel agent's own items
    ctx = mem.render("Kyoto zebra code", 2000, user_id="u", speaker="Ann")
    assert "Kyoto" in ctx.text and "zebra" not in ctx.text and "7741" not in ctx.text
    mem.close()


def test_forget_drops_every_in_process_copy_at_once(memory: Memory):
    secret = memory.add("my secret word is zqhunter2", scope="dana")[0]
    memory.render("secret word", 500, scope="dana")
    memory.search("secret word", scope="dana")
    memory.forget("dana", ids=[secret.id])
    assert all(q.text != secret.text for c in memory.renderer._caches.values() for q in c.items.values())
    assert not any("zqhunter2" in (t or "") for st in memory.records._scopes.values() for t in st.texts)


def test_a_store_from_before_saved_configs_rebuilds_records_of_another_unit_size(tmp_path, embedder):
    import sqlite3
    path = tmp_path / "legacy.db"
    with Memory(path, embedder=embedder, store_config=StoreConfig(unit_tokens=30)) as old:
        old.add([NewItem(f"turn {i} about the river gauge", session="s") for i in range(12)], scope="x")
        assert old.store.records("x")[0][2] < 11
    con = sqlite3.connect(path)
    con.execute("DELETE FROM meta WHERE key = 'store_config'")  # as stores written before 0.2 were
    con.commit()
    con.close()
    with Memory(path, embedder=embedder) as mem:
        assert mem.store_config.unit_tokens == 2000
        units = mem.retriever.index("x").views.units
        assert [(r[1], r[2]) for r in mem.store.records("x")] == [
            (u.first_seq, u.last_seq) for u in units if u.closed]


def test_a_forget_between_ranking_and_reading_is_a_clear_error_not_wrong_items(memory: Memory):
    from suffice import StoreError
    ranking = memory.retriever.rank("dana", "Kyoto trip", memory.retrieval)
    first = memory.items(scope="dana")[0]
    memory.store.forget("dana", ids=[first.id])  # as another process would
    with pytest.raises(StoreError, match="run the query again"):
        memory.retriever.evidence(ranking)
    assert memory.search("Kyoto trip", scope="dana").hits  # a new query just works


def test_agent_mode_ranks_only_what_lies_before_the_recent_window(memory: Memory):
    seen = []
    rank = memory.retriever.rank

    def spy(*a, **kw):
        seen.append(kw.get("flt"))
        return rank(*a, **kw)
    memory.retriever.rank = spy  # type: ignore[method-assign]
    ctx = memory.render("What should Dana do next?", 800, scope="dana", agent=True)
    recent = min(q for p in ctx.parts if p.kind == "recent" for q in p.seqs)
    assert seen and seen[0].before_seq == recent


def test_scope_names_have_one_form(memory: Memory):
    from suffice import InvalidInputError
    memory.add("in the one scope", scope="a")
    for spelling in (" a", "a ", "a\u00a0", "\ta\n"):
        assert [i.text for i in memory.items(scope=spelling)] == ["in the one scope"]
    memory.add("café", scope="caf\u0065\u0301")  # decomposed é
    assert memory.items(scope="caf\u00e9")[0].scope == "caf\u00e9"
    assert "A" not in memory.scopes()  # case is kept: "A" and "a" are two scopes
    memory.add("two words", scope="team red")  # the plain space separates words
    for bad in ("", "   ", "x" * 201, "evil\u202eeman", "a\x00b", "line\u2028break",
                "team\u00a0red", "team\u3000red"):  # look-alikes of "team red"
        with pytest.raises(InvalidInputError):
            memory.add("x", scope=bad)
    with pytest.raises(InvalidInputError, match="normal form"):
        memory.store.append(" a", [])


def test_a_memory_takes_a_path_a_url_or_an_opened_store_and_refuses_anything_else(tmp_path, monkeypatch):
    from suffice import SQLiteStore
    from suffice._embed.hashing import HashEmbedder
    monkeypatch.chdir(tmp_path)
    store = SQLiteStore(tmp_path / "own.db", vacuum_on_forget=False)
    mem = Memory(store, embedder=HashEmbedder())
    assert mem.store is store
    mem.add([NewItem("kept in the store it was given", id="k")], scope="s")
    assert mem.forget("s", ids=["k"]).scrubbed is False  # the store's own option holds
    mem.close()
    with pytest.raises(TypeError, match="not object"):
        Memory(object(), embedder=None)  # type: ignore[arg-type]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["own.db"]  # no file named after it


def test_a_rebuild_by_another_process_is_taken_up_before_the_next_write(tmp_path, embedder):
    path = tmp_path / "m.db"
    server = Memory(path, store_config=StoreConfig(unit_tokens=2000), embedder=embedder)
    server.add(NewItem(text="the river gauge read 3.1 metres", session="s"), scope="x")
    # Another process (here: another Memory on the same file) rebuilds with smaller pieces.
    with Memory(path, store_config=StoreConfig(unit_tokens=2000, piece_max_tokens=8),
                embedder=embedder, rebuild=True):
        pass
    long = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
    server.add(NewItem(text=long, session="s"), scope="x")
    assert server.store_config.piece_max_tokens == 8
    seq = server.items(scope="x")[-1].seq
    assert len(server.store.pieces("x", [seq])[seq]) > 1  # cut under the new settings
    server.close()


def test_a_restricted_view_follows_its_memory_through_a_rebuild(tmp_path, embedder):
    mem = Memory(tmp_path / "m.db", embedder=embedder)
    view = mem.restrict(["x"])
    mem.rebuild(StoreConfig(piece_max_tokens=8))
    assert view.store_config.piece_max_tokens == 8 and view.retriever is mem.retriever
    view.add(NewItem(text="the river gauge read 3.1 metres at the weir", session="s"), scope="x")
    assert view.search("river gauge", scope="x").hits
    mem.close()


def test_a_rebuild_for_another_encoder_stops_a_memory_with_the_old_one(tmp_path, embedder):
    from suffice import StoreConfigError
    from suffice._embed.hashing import HashEmbedder
    path = tmp_path / "m.db"
    server = Memory(path, embedder=embedder)
    server.add("the river gauge read 3.1 metres", scope="x")
    Memory(path, embedder=HashEmbedder(), rebuild=True).close()
    with pytest.raises(StoreConfigError, match="rebuilt for encoder 'hash-64'"):
        server.search("river", scope="x")
    server.close()


def test_a_rebuild_for_an_encoder_that_cannot_embed_changes_nothing(tmp_path, embedder):
    from suffice import ModelFileError
    from suffice._embed.hashing import HashEmbedder

    class Broken(HashEmbedder):
        name = "broken-encoder"

        def embed(self, texts):  # type: ignore[no-untyped-def]
            raise ValueError("Required inputs (['token_type_ids']) are missing")

    path = tmp_path / "m.db"
    with Memory(path, embedder=embedder) as mem:
        mem.add("the river gauge read 3.1 metres", scope="x")
    with pytest.raises(ModelFileError, match="broken-encoder cannot embed text"):
        Memory(path, embedder=Broken(), rebuild=True)
    with Memory(path, embedder=embedder) as mem:  # opens as before, its vectors all there
        assert mem.stats("x").embedded == 1 and mem.search("river", scope="x").hits


def test_a_new_store_is_not_tied_to_an_encoder_that_cannot_embed(tmp_path, embedder):
    from suffice import ModelFileError
    from suffice._embed.hashing import HashEmbedder

    class Broken(HashEmbedder):
        name = "broken-encoder"

        def embed(self, texts):  # type: ignore[no-untyped-def]
            raise ValueError("Required inputs (['token_type_ids']) are missing")

    with pytest.raises(ModelFileError, match="cannot embed text"):
        Memory(tmp_path / "m.db", embedder=Broken())
    with Memory(tmp_path / "m.db", embedder=embedder) as mem:  # the store took no encoder of it
        assert mem.add("the river gauge read 3.1 metres", scope="x")[0].seq == 0


def test_a_read_during_a_rebuild_waits_for_it_instead_of_restoring_the_old_config(tmp_path, embedder):
    with Memory(tmp_path / "m.db", embedder=embedder) as writer:
        writer.add([NewItem(text=f"gauge {i} read {i} metres at the weir", session="s") for i in range(5)],
                   scope="x")
    mem = Memory(tmp_path / "m.db", embedder=embedder)  # the reader below is its first call
    inside = threading.Event()
    slow = mem.store.rebuild_pieces

    def rebuild_pieces(*args, **kwargs):  # type: ignore[no-untyped-def]
        inside.set()
        threading.Event().wait(0.5)  # hold the rebuild open while another thread reads
        return slow(*args, **kwargs)

    mem.store.rebuild_pieces = rebuild_pieces  # type: ignore[method-assign]
    rebuild = threading.Thread(target=mem.rebuild, args=(StoreConfig(piece_max_tokens=8),))
    rebuild.start()
    inside.wait(10)
    reader = threading.Thread(target=mem.items, kwargs={"scope": "x"})
    reader.start()
    rebuild.join()
    reader.join()
    assert mem.store_config.piece_max_tokens == 8 == mem.store.load_config()["piece_max_tokens"]
    mem.close()


def test_a_config_restored_by_another_process_after_a_rebuild_here_is_taken_up(tmp_path, embedder):
    path = tmp_path / "m.db"
    mem = Memory(path, embedder=embedder)
    mem.add("the river gauge read 3.1 metres", scope="x")
    first = mem.store_config.piece_max_tokens
    mem.rebuild(StoreConfig(piece_max_tokens=8))
    Memory(path, store_config=StoreConfig(piece_max_tokens=first), embedder=embedder, rebuild=True).close()
    mem.items(scope="x")
    assert mem.store_config.piece_max_tokens == first
    mem.close()



@pytest.mark.parametrize(("part", "value"), [("embedder", "minilm"), ("router", "trained"), ("llm", "local"),
                                             ("deep_llm", "qwen2.5-1.5b"), ("reranker", "rr/"),
                                             ("store_config", {"unit_tokens": 500}), ("record_writer", "x")])
def test_a_part_of_the_wrong_kind_is_refused_before_the_store_opens(tmp_path, part, value):
    """A model's name where the model goes failed at the first query, with an AttributeError."""
    from suffice import ConfigError

    with pytest.raises(ConfigError, match=part):
        Memory(tmp_path / "m.db", **{part: value})
    assert not (tmp_path / "m.db").exists()


class _GivesOut:
    """An embedder whose third call fails (the first is the memory's probe of it)."""

    name, dim = "gives-out", 4

    def __init__(self) -> None:
        self.calls = 0

    def embed(self, texts):  # type: ignore[no-untyped-def]
        import numpy as np
        self.calls += 1
        if self.calls == 3:
            raise ProviderError("embedding endpoint timed out")
        return np.ones((len(texts), 4), dtype=np.float32)

    def embed_query(self, text):  # type: ignore[no-untyped-def]
        import numpy as np
        return np.ones(4, dtype=np.float32)


def test_an_add_of_items_without_ids_whose_later_batch_fails_stores_none_of_them(tmp_path):
    """The first batch was committed, and the obvious retry of items without ids stored it twice."""
    flaky = _GivesOut()
    with Memory(tmp_path / "m.db", embedder=flaky, router=None) as mem:
        with pytest.raises(ProviderError):
            mem.add([f"turn {i}" for i in range(4)], scope="u", batch_size=2)
        assert "u" not in mem.scopes()  # nothing of it stored, not even the first batch
        mem.add([f"turn {i}" for i in range(4)], scope="u", batch_size=2)  # the retry
        assert [it.text for it in mem.items(scope="u")] == [f"turn {i}" for i in range(4)]


def test_an_import_that_fails_midway_says_a_rerun_adds_only_the_rest(tmp_path):
    flaky = _GivesOut()
    with Memory(tmp_path / "m.db", embedder=flaky, router=None) as mem:
        parts = [("run-a", [NewItem("a0", id="a0")]),
                 ("run-b", [NewItem(f"b{i}", id=f"b{i}") for i in range(3)])]
        with pytest.raises(ProviderError) as caught:
            mem._add_scopes(parts)
        assert "imported whole (run-a)" in "".join(caught.value.__notes__)
        assert [it.text for it in mem.items(scope="run-a")] == ["a0"] and "run-b" not in mem.scopes()
        assert mem._add_scopes(parts) == {"run-a": 0, "run-b": 3}  # again: only the rest


def test_a_rebuild_stopped_halfway_is_named_by_check_and_completed_by_running_it_again(tmp_path, monkeypatch):
    """Items were left indexed two ways under the old saved config, and check() said all was well."""
    from suffice._store.sqlite import SQLiteStore

    path = tmp_path / "m.db"
    with Memory(path, embedder=None) as mem:
        mem.add([f"item {i} " + "word " * 10 for i in range(700)], scope="u", speaker="ana")
    original = SQLiteStore.rebuild_pieces

    def first_chunk_only(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        original(self, *args, **kwargs)
        raise KeyboardInterrupt  # killed after the first chunk

    monkeypatch.setattr(SQLiteStore, "rebuild_pieces", first_chunk_only)
    with Memory(path, embedder=None) as mem:
        with pytest.raises(KeyboardInterrupt):
            mem.rebuild(StoreConfig(index_header=False))
    monkeypatch.setattr(SQLiteStore, "rebuild_pieces", original)
    with Memory(path, embedder=None) as mem:
        assert any("did not finish" in p and "rebuild" in p for p in mem.check())
        mem.rebuild(StoreConfig(index_header=False))
        assert mem.check() == [] and not mem.store_config.index_header


def test_add_returns_meta_as_every_later_read_returns_it(memory: Memory):
    """A tuple is a list once stored: add returned the tuple, get the list."""
    stored = memory.add({"text": "Kyoto trip.", "id": "trip", "meta": {"days": (1, 2), "tags": {"a": (3,)}}},
                        scope="dana")[0]
    assert stored.meta == memory.get("trip", scope="dana").meta == {"days": [1, 2], "tags": {"a": [3]}}


def test_a_failed_add_takes_back_only_rows_it_wrote_not_another_writers(tmp_path, monkeypatch):
    """Another writer that stored the same ids meanwhile (a client's retry) keeps its items."""
    path = tmp_path / "m.db"
    items = [NewItem(f"turn {i}", id=f"t{i}") for i in range(4)]
    flaky = _GivesOut()
    with Memory(path, embedder=flaky, router=None) as a:
        real = a.store.append

        def after_another_writer(scope, rows, **kw):  # type: ignore[no-untyped-def]
            with Memory(path, embedder=_GivesOut(), router=None) as b:
                b.embedder.calls = -10  # b's embedder works
                b.add(items, scope="u")  # b's add succeeds: its four items are stored
            return real(scope, rows, **kw)

        monkeypatch.setattr(a.store, "append", after_another_writer)
        with pytest.raises(ProviderError):
            a.add(items, scope="u", batch_size=2)  # a's second batch fails
        assert [it.id for it in a.items(scope="u")] == ["t0", "t1", "t2", "t3"]


def test_a_rebuild_keeps_the_mark_of_an_import_that_never_finished(tmp_path):
    """The rebuild's own mark shares the slot, and used to clear the import's with it."""
    with Memory(tmp_path / "m.db", embedder=None) as mem:
        mem.add([f"item {i}" for i in range(5)], scope="u", speaker="ana")
        mem.store.note_transfer("u", {"source": "old.jsonl", "items": 10, "started": "2026-12-05"})
        assert any("did not finish" in p for p in mem.check())
        mem.rebuild(StoreConfig(index_header=False))
        problems = mem.check()
        assert any("old.jsonl" in p for p in problems) and not any("rebuild" in p for p in problems)


def test_a_failed_add_leaves_id_items_another_writer_was_told_are_stored(tmp_path, monkeypatch):
    """A's first batch is in, B (a client's retry) stores the same ids and is told all four are
    stored, then A's second batch fails: nothing B was told of may go."""
    path = tmp_path / "m.db"
    items = [NewItem(f"turn {i}", id=f"t{i}") for i in range(4)]
    with Memory(path, embedder=_GivesOut(), router=None) as a:
        real = a.store.append

        def then_a_retry(scope, rows, **kw):  # type: ignore[no-untyped-def]
            got = real(scope, rows, **kw)
            with Memory(path, embedder=_GivesOut(), router=None) as b:
                b.embedder.calls = -10
                assert [it.id for it in b.add(items, scope="u")] == ["t0", "t1", "t2", "t3"]
            return got

        monkeypatch.setattr(a.store, "append", then_a_retry)
        with pytest.raises(ProviderError):
            a.add(items, scope="u", batch_size=2)
        assert [it.id for it in a.items(scope="u")] == ["t0", "t1", "t2", "t3"]
