"""Scope grants and API keys: a restricted memory touches only what it was granted, and a key
file never holds a usable token."""

from __future__ import annotations

import asyncio
import json
import stat

import pytest

from suffice import (
    AccessDeniedError,
    AsyncMemory,
    AuthenticationError,
    ConfigError,
    Grant,
    HashEmbedder,
    InvalidInputError,
    KeyRing,
    Memory,
)


@pytest.fixture
def mem(tmp_path):
    m = Memory(tmp_path / "m.db", embedder=HashEmbedder())
    m.add(["Ana moved to Lisbon.", "Her cat is Figo."], user_id="ana")
    m.add(["Bob lives in Porto."], user_id="bob")
    m.add(["The red team ships on Friday."], scope="team:red:plan")
    yield m
    m.close()


def test_a_grant_matches_names_prefixes_and_everything():
    g = Grant.of(["user:ana", "team:red:*"])
    assert g.allows("user:ana") and g.allows("team:red:plan") and g.allows("team:red:")
    assert not g.allows("user:anabel") and not g.allows("team:blue") and not g.allows("user:bob")
    assert Grant.of(["*"]).allows("anything") and Grant.of("*").everything


def test_two_grants_meet_in_the_scopes_both_allow():
    bound = Grant.of(["team:a"])
    assert bound.intersect(Grant.of(["*"])) == Grant.of(["team:a"])
    assert bound.intersect(Grant.of(["team:*", "x"])) == Grant.of(["team:a"])
    assert Grant.of(["a:*"]).intersect(Grant.of(["a:b*", "c"])) == Grant.of(["a:b*"])
    assert bound.intersect(Grant.of(["team:b"])) is None


def test_a_grant_refuses_malformed_patterns():
    with pytest.raises(InvalidInputError):
        Grant.of([])
    with pytest.raises(InvalidInputError, match="control"):
        Grant.of(["user:\x07"])


def test_a_view_reads_and_writes_its_own_scope(mem):
    ana = mem.restrict(["user:ana"])
    assert [h.item.text for h in ana.search("Lisbon", user_id="ana", k=1)] == ["Ana moved to Lisbon."]
    ana.add("She works at a bakery.", user_id="ana")
    assert len(ana.items(user_id="ana")) == 3
    assert ana.scopes() == ["user:ana"]
    assert ana.stats().items == 3 and ana.stats().scopes == 1


@pytest.mark.parametrize("call", [
    lambda m: m.search("Porto", user_id="bob"),
    lambda m: m.render("Porto", 200, user_id="bob"),
    lambda m: m.items(user_id="bob"),
    lambda m: m.get("x", user_id="bob"),
    lambda m: m.add("sneaky", user_id="bob"),
    lambda m: m.forget(user_id="bob", everything=True),
    lambda m: m.stats("user:bob"),
    lambda m: m.ask("Where?", user_id="bob", llm=None),
    lambda m: m.search("Lisbon"),  # the default scope is a scope too
    lambda m: m.rebuild(),
    lambda m: m.check(),
    lambda m: m.import_locomo([]),
])
def test_a_view_refuses_every_other_scope_before_reading(mem, call):
    ana = mem.restrict(["user:ana"])
    before = mem.stats()
    with pytest.raises(AccessDeniedError):
        call(ana)
    assert mem.stats() == before
    assert [it.text for it in mem.items(user_id="bob")] == ["Bob lives in Porto."]


def test_the_refusal_names_no_other_scope(mem):
    with pytest.raises(AccessDeniedError) as info:
        mem.restrict(["user:ana"]).search("x", user_id="bob")
    assert "user:ana" not in str(info.value) and "team" not in str(info.value)


def test_a_view_can_narrow_but_never_widen(mem):
    team = mem.restrict(["team:*"])
    assert team.restrict(["team:red:*"]).scopes() == ["team:red:plan"]
    for wider in (["*"], ["user:ana"], ["t*"]):
        with pytest.raises(AccessDeniedError, match="widened"):
            team.restrict(wider)


def test_closing_a_view_leaves_the_memory_open(mem):
    mem.restrict(["user:ana"]).close()
    assert mem.search("Porto", user_id="bob", k=1).hits


def test_audit_lines_of_a_view_are_its_own(mem):
    mem.forget(user_id="bob", everything=True)
    mem.restrict(["user:ana"]).forget(ids=[mem.items(user_id="ana")[0].id], user_id="ana")
    assert len(mem.audit()) == 2
    assert len(mem.restrict(["user:ana"]).audit()) == 1
    assert len(mem.restrict(["user:bob"]).audit()) == 1


def test_async_views_share_the_threads(tmp_path):
    asyncio.run(_async_views(tmp_path))


async def _async_views(tmp_path):
    async with AsyncMemory(tmp_path / "a.db", embedder=HashEmbedder()) as amem:
        await amem.add("Ana moved to Lisbon.", user_id="ana")
        view = amem.restrict(["user:ana"])
        assert (await view.search("Lisbon", user_id="ana")).hits
        with pytest.raises(AccessDeniedError):
            await view.add("x", user_id="bob")
        await view.aclose()  # a view's close leaves the parent running
        assert await amem.scopes() == ["user:ana"]


def test_a_key_file_keeps_digests_not_tokens(tmp_path):
    ring = KeyRing(tmp_path / "keys.json")
    token, key = ring.create(["user:ana"], name="ana's app")
    text = (tmp_path / "keys.json").read_text()
    assert token not in text and token.split("_")[-1] not in text
    assert json.loads(text)["keys"][0]["sha256"] == key.sha256
    assert stat.S_IMODE((tmp_path / "keys.json").stat().st_mode) == 0o600
    assert ring.authenticate(token).grant.patterns == ("user:ana",)


def test_unknown_missing_and_revoked_keys_are_refused(tmp_path):
    ring = KeyRing(tmp_path / "keys.json")
    token, key = ring.create(["user:ana"])
    other, _ = ring.create(["user:bob"])
    for bad in (None, "", token + "x", token[:-1], "sfk_nope"):
        with pytest.raises(AuthenticationError):
            ring.authenticate(bad)
    assert ring.revoke(key.key_id) and not ring.revoke(key.key_id)
    with pytest.raises(AuthenticationError):
        ring.authenticate(token)
    assert ring.authenticate(other).grant.patterns == ("user:bob",)


def test_a_second_reader_of_the_key_file_sees_new_and_revoked_keys(tmp_path):
    server, admin = KeyRing(tmp_path / "keys.json"), KeyRing(tmp_path / "keys.json")
    token, key = admin.create(["user:ana"])
    assert server.authenticate(token).key_id == key.key_id
    admin.revoke(key.key_id)
    with pytest.raises(AuthenticationError):
        server.authenticate(token)


def test_views_share_the_memorys_one_model(tmp_path):
    loads = []

    class Counting(Memory):
        def default_llm(self):
            if self._view_of is None and self._llm is None:
                loads.append(1)
                from suffice import ScriptedLLM
                self._llm = ScriptedLLM("<answer>x</answer>")
            return super().default_llm()

    with Counting(tmp_path / "m.db", embedder=HashEmbedder()) as mem:
        mem.add("Ana moved to Lisbon.", user_id="ana")
        mem.add("Bob lives in Porto.", user_id="bob")
        mem.restrict(["user:ana"]).ask("Where?", user_id="ana")
        mem.restrict(["user:bob"]).ask("Where?", user_id="bob")
        assert len(loads) == 1 and mem.restrict(["*"]).default_llm() is mem.default_llm()


def _add_keys(path: str, n: int, ready: str, go: str) -> None:
    import os
    import time
    open(ready, "w").close()
    while not os.path.exists(go):
        time.sleep(0.001)
    for i in range(n):
        KeyRing(path).create([f"user:p{i}"], f"k{i}")


def test_processes_adding_and_revoking_keys_at_once_lose_nothing(tmp_path):
    """Each change reads and writes the file under one lock: a key another process printed
    is stored, and a revoked key stays revoked."""
    import multiprocessing as mp
    import time
    path = str(tmp_path / "keys.json")
    token, victim = KeyRing(path).create(["user:victim"], "victim")
    ctx = mp.get_context("spawn")
    ready = [tmp_path / f"ready-{i}" for i in range(4)]
    procs = [ctx.Process(target=_add_keys, args=(path, 10, str(r), str(tmp_path / "go"))) for r in ready]
    for p in procs:
        p.start()
    while not all(r.exists() for r in ready):
        time.sleep(0.01)
    (tmp_path / "go").touch()
    while len(KeyRing(path).keys()) < 4 and any(p.is_alive() for p in procs):
        time.sleep(0.001)
    assert KeyRing(path).revoke(victim.key_id)  # while the others are still adding
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    assert len(KeyRing(path).keys()) == 40
    with pytest.raises(AuthenticationError):
        KeyRing(path).authenticate(token)


def test_a_key_file_that_cannot_be_written_is_a_config_error(tmp_path):
    (tmp_path / "file").write_text("")  # a file where the key file's folder should be
    with pytest.raises(ConfigError, match="key file"):
        KeyRing(tmp_path / "file" / "keys.json").create(["user:a"])
