"""The ``suffice`` command: a thin layer over :class:`suffice.Memory`.

Every command opens the store at ``--db`` (or ``$SUFFICE_DB``), calls the library and prints.
Errors print one line naming what is wrong and exit with status 2; nothing is half-written.
Stored and remote text is printed as plain text: never read as markup, control characters shown
as escapes, so an item cannot restyle or take over the terminal.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ._errors import InvalidItemError, InvalidQueryError, SufficeError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Long-term memory for LLM agents: write once, spend per query only what it needs.")
import_app = typer.Typer(no_args_is_help=True, help="Import a dataset file into the store.")
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks on real data; --json FILE writes the figures.")
app.add_typer(import_app, name="import")
app.add_typer(bench_app, name="bench")
train_app = typer.Typer(no_args_is_help=True, help="Train the learned parts (needs the \\[train] extra).")
app.add_typer(train_app, name="train")

out = Console()
err = Console(stderr=True)

DbOpt = Annotated[str | None, typer.Option("--db", envvar="SUFFICE_DB",
                                              help="Store path or postgresql:// URL (default ./suffice.db).")]
ScopeOpt = Annotated[str | None, typer.Option("--scope", "-s",
                                              help="Scope (hard partition); default 'default'.")]
UserOpt = Annotated[str | None, typer.Option("--user", help="user_id: the scope user:<id>.")]
AgentOpt = Annotated[str | None, typer.Option("--agent",
                                              help="agent_id: the agent's items (or scope agent:<id>).")]
RunOpt = Annotated[str | None, typer.Option("--run", help="run_id: one run (a session) of the scope.")]
SessionOpt = Annotated[str | None, typer.Option("--session", help="Only this session.")]
SpeakerOpt = Annotated[str | None, typer.Option("--speaker", help="Only this speaker.")]
KindOpt = Annotated[str | None, typer.Option("--kind", help="Only this kind (message, tool_call, ...).")]
SinceOpt = Annotated[str | None, typer.Option("--since", help="Only items observed at or after this time.")]
UntilOpt = Annotated[str | None, typer.Option("--until", help="Only items observed before this time.")]
MetaOpt = Annotated[list[str] | None, typer.Option("--meta",
                                                  help=("KEY=VALUE a meta field must equal (repeatable). "
                                                        "VALUE is read as JSON when it is JSON (7, true, "
                                                        "[1]); a string that looks like JSON goes quoted: "
                                                        "zip='\"1000\"'."))]

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def safe(text: object) -> str:
    """Text fit for a terminal: control characters (escape sequences among them) shown as escapes."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group(0)):02x}", str(text))


def say(text: object, style: str | None = None, *, to: Console = out) -> None:
    """Print ``text`` literally (no markup, no highlighting) in an optional style."""
    to.print(safe(text), style=style, markup=False, highlight=False, soft_wrap=True)


def fail(message: str) -> None:
    err.print("error: ", style="red", end="", markup=False, highlight=False)
    say(message, to=err)
    raise typer.Exit(2)


@contextmanager
def errors() -> Iterator[None]:
    try:
        yield
    except SufficeError as exc:  # with its notes (what a failed transfer left behind, say)
        fail("\n".join([str(exc), *getattr(exc, "__notes__", ())]))
    except KeyboardInterrupt:
        fail("interrupted")


@contextmanager
def progress_bar(label: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr for long work; advances by the count given."""
    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True, disable=not err.is_terminal) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


@contextmanager
def fold_progress() -> Iterator[Callable[[str, int, int], None]]:
    """Progress of staged work (``stage, done, total``): a bar on a terminal, else a line on
    stderr every tenth of a stage, so a run in the background can be followed in its log."""
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err, transient=True, disable=not err.is_terminal) as bar:
        tasks: dict[str, Any] = {}

        def report(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done)
            if not err.is_terminal and (done == total or done % max(1, total // 10) == 0):
                print(f"{stage}: {done}/{total}", file=sys.stderr, flush=True)
        yield report


_state: dict[str, Any] = {"db": None, "encoder": None, "reranker": None, "retrieval": []}


@app.callback()
def _root(db: DbOpt = None, encoder: Annotated[str | None, typer.Option(
        "--encoder", envvar="SUFFICE_ENCODER",
        help="Folder of a trained encoder (suffice train retriever) to embed with.")] = None,
        reranker: Annotated[str | None, typer.Option(
            "--reranker", envvar="SUFFICE_RERANKER",
            help="Folder of a trained reranker (suffice train reranker) to order the prefix's "
                 "first candidates with (how many: --retrieval rerank=N, default 30).")] = None,
        retrieval: Annotated[list[str] | None, typer.Option(
            "--retrieval", help=("Retrieval setting KEY=VALUE for this command (repeatable), "
                                 "e.g. dense_weight=3 with a trained encoder."))] = None) -> None:
    """Options given before the command apply to every command."""
    _state["db"] = db
    _state["encoder"] = encoder
    _state["reranker"] = reranker
    _state["retrieval"] = retrieval or []


def configured_embedder() -> Any:
    """The encoder named by --encoder / $SUFFICE_ENCODER, else the default one."""
    if _state["encoder"]:
        from ._embed.minilm import load_encoder
        return load_encoder(_state["encoder"])
    return "default"


def open_memory(db: str | None, **kw: Any) -> Any:
    from ._api import Memory, default_db_path
    kw.setdefault("embedder", configured_embedder())
    if _state["reranker"]:
        from ._embed.rerank import load_reranker
        kw.setdefault("reranker", load_reranker(_state["reranker"]))
    if _state["retrieval"]:
        from ._config import RetrievalConfig, parse_overrides
        kw.setdefault("retrieval", RetrievalConfig(**parse_overrides(_state["retrieval"])))
    for given in (db, _state["db"]):
        if given is not None and not given.strip():
            raise InvalidQueryError("--db is empty; name a file or a postgresql:// URL")
    return Memory(db or _state["db"] or default_db_path(), **kw)


def where(scope: str | None, user: str | None, agent: str | None, run: str | None) -> dict[str, Any]:
    return {"scope": scope, "user_id": user, "agent_id": agent, "run_id": run}


def filters(session: str | None, speaker: str | None, kind: str | None, since: str | None,
            until: str | None, meta: list[str] | None) -> dict[str, Any]:
    pairs: dict[str, Any] = {}
    for entry in meta or []:
        key, sep, raw = entry.partition("=")
        if not sep or not key:
            raise InvalidQueryError(f"--meta takes KEY=VALUE, got {entry!r}")
        try:
            pairs[key] = json.loads(raw)
        except json.JSONDecodeError:
            pairs[key] = raw
    return {"session": session, "speaker": speaker, "kind": kind, "since": since, "until": until,
            "meta": pairs or None}


def print_json(data: Any) -> None:
    out.print_json(json.dumps(data, ensure_ascii=False, default=str))


def print_result(key: str, result: Any, **extra: Any) -> None:
    """A core result as the REST and MCP servers send it (``{key: ...}``, field for field)."""
    from ._server.wire import to_json

    print_json({key: to_json(result), **extra})


@app.command()
def add(
    text: Annotated[list[str] | None, typer.Argument(help="Text of one item each.")] = None,
    file: Annotated[Path | None, typer.Option("--file", "-f", help=(
        "JSONL file, one item or chat message per line."))] = None,
    scope: ScopeOpt = None, user: UserOpt = None, agent: AgentOpt = None, run: RunOpt = None,
    session: Annotated[str, typer.Option(help="Session the items belong to.")] = "",
    speaker: Annotated[str, typer.Option(help="Who said it.")] = "",
    observed_at: Annotated[str, typer.Option("--at", help="When it happened.")] = "",
    item_id: Annotated[str | None, typer.Option("--id", help="Client id (idempotent adds).")] = None,
    db: DbOpt = None,
) -> None:
    """Store items verbatim."""
    with errors():
        records: list[Any] = []
        line_of: list[int] = []  # the file line of each record, for errors
        if file is not None:
            if not file.is_file():
                fail(f"not a file: {file}")
            try:
                lines = file.read_text(encoding="utf-8").splitlines()
            except UnicodeDecodeError as exc:
                fail(f"{file}: not UTF-8 text ({exc.reason} at byte {exc.start})")
            # A line without an id gets one from its content and every line before it (and the
            # run or session it is added under): adding the same file again, or a longer copy of
            # it, stores nothing twice, while the same line in another file ("yes", "ok") is
            # another turn and is stored.
            chain = hashlib.sha256(f"{run or session}\n".encode())
            for n, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    fail(f"{file}:{n}: not valid JSON ({exc.msg})")
                if not isinstance(rec, dict):
                    fail(f"{file}:{n}: expected a JSON object per line")
                chain.update(line.strip().encode("utf-8") + b"\n")
                if rec.get("id") is None:
                    rec = {**rec, "id": f"line:{chain.copy().hexdigest()[:24]}"}
                records.append(rec)
                line_of.append(n)
        for t in text or []:
            records.append({"text": t, **({"id": item_id} if item_id else {})})
        if not records:
            raise InvalidItemError(f"{file}: no items (every line is blank)" if file is not None and not text
                                   else "nothing to add: give TEXT or --file")
        try:
            with memory_to_fill(db) as mem:
                target = mem._ident(scope, user, agent, run).scope
                before = mem.store.max_seq(target) if target in mem.scopes() else -1
                # One transaction for the whole input: a kill leaves all of it or none of it.
                with progress_bar("adding", len(records)) as advance:
                    stored = mem.add(records, **where(scope, user, agent, run), session=session,
                                     speaker=speaker, observed_at=observed_at,
                                     batch_size=max(len(records), 1), progress=advance)
        except InvalidItemError as exc:
            m = re.match(r"(?:item|message) (\d+)(?: \(id '[^']*'\))?: (.*)", str(exc), re.S)
            if m and int(m.group(1)) < len(line_of):  # the file's own line
                raise InvalidItemError(f"{file}:{line_of[int(m.group(1))]}: {m.group(2)}") from None
            raise
        new = sum(1 for it in stored if it.seq > before)
        say(f"stored {new} new item(s) ({len(stored) - new} already stored) in scope "
            f"{stored[0].scope if stored else scope!r} of {mem.path}")


@import_app.command("locomo")
def import_locomo(
    file: Annotated[Path | None, typer.Argument(help="LoCoMo JSON (default: the shared copy).")] = None,
    db: DbOpt = None,
) -> None:
    """Import a LoCoMo file: one scope per conversation, one item per turn."""
    with errors():
        from ._datasets.locomo import load_locomo
        convs = load_locomo(file)
        total = sum(len(c.items) for c in convs)
        t0 = time.perf_counter()
        with memory_to_fill(db, resumable=True) as mem, progress_bar("importing", total) as advance:
            counts = mem.import_locomo(convs, progress=advance)
        dt = time.perf_counter() - t0
        added = sum(counts.values())
        say(f"imported {added} new items ({total - added} already stored) in {len(counts)} "
            f"scopes ({dt:.1f} s, {total / max(dt, 1e-9):.0f} items/s) into {mem.path}")


@import_app.command("agent")
def import_agent(
    path: Annotated[Path, typer.Argument(help="A trajectory file, or a folder of them.")],
    fmt: Annotated[str, typer.Option("--format", help=(
        "ama (AMA-Bench), swe (mini-SWE-agent), tau (τ-bench), tau2 (τ²-bench) or auto "
        "(each file's own shape)."))] = "auto",
    db: DbOpt = None,
) -> None:
    """Import agent runs: one scope per run, each step's items with their kind and step number;
    re-importing adds nothing (the items carry stable ids)."""
    with errors():
        from ._datasets.trajectories import load_agent
        trajs = load_agent(path, fmt)  # every file is read and checked before any write
        total = sum(len(t.items) for t in trajs)
        t0 = time.perf_counter()
        # every run is checked before any write
        with memory_to_fill(db, resumable=True) as mem, progress_bar("importing", total) as advance:
            added = sum(mem.import_agent(trajs, progress=advance).values())
        dt = time.perf_counter() - t0
        say(f"imported {added} new items ({total - added} already stored) in {len(trajs)} "
            f"scopes ({dt:.1f} s, {total / max(dt, 1e-9):.0f} items/s) into {mem.path}")


def open_store_at(location: str | None, *, create: bool) -> Any:
    """The bare store at a path or postgresql:// URL: a backup copies what is stored, whatever
    settings and models built it, so no Memory (and no model) is opened."""
    from ._api import default_db_path
    from ._store import open_store
    return open_store(location or _state["db"] or default_db_path(), create=create)


@contextmanager
def store_to_fill(location: str | None) -> Iterator[Any]:
    """The store an import or migration writes into, created if need be; a store file (or
    PostgreSQL schema) this created is removed again when the transfer fails, so a refused
    file leaves nothing behind."""
    where, fresh = _target(location)
    store = open_store_at(where, create=True)
    try:
        yield store
    except BaseException:
        drop = getattr(store, "drop_if_created", None)
        if drop is not None:
            with suppress(Exception):  # the transfer's own error is the one to report
                drop()
        # The failed transfer has taken out its own items; a file it created goes only if
        # nothing else is in it (another program may have written there meanwhile).
        empty = False
        with suppress(Exception):
            empty = not store.scopes()
        store.close()
        if fresh and empty:
            _remove_store_file(where)
        raise
    store.close()


def _target(location: str | None) -> tuple[str, bool]:
    """(where a write goes, whether it creates a store file there)."""
    from ._api import default_db_path
    where = str(location or _state["db"] or default_db_path())
    return where, "://" not in where and where != ":memory:" and not Path(where).exists()


def _remove_store_file(where: str) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(where + suffix).unlink(missing_ok=True)


@contextmanager
def memory_to_fill(db: str | None, *, resumable: bool = False) -> Iterator[Any]:
    """The memory an add or import writes into, created if need be; a store file this created
    is removed again when the input is refused (or the command stopped) and nothing was stored,
    so a refused file leaves no empty store behind. ``resumable``: the items carry stable ids,
    so a command stopped halfway says that running it again adds only the rest."""
    where, fresh = _target(db)
    mem = open_memory(db)
    try:
        yield mem
    except (SufficeError, KeyboardInterrupt) as exc:
        if fresh and not mem.scopes():
            mem.close()
            _remove_store_file(where)
        elif isinstance(exc, KeyboardInterrupt) and resumable:
            fail(f"interrupted: what was stored stays in {mem.path}; the same command again adds "
                 "only the rest (stored items are recognised by their ids)")
        raise


def print_report(report: Any, *, to: Console = out) -> None:
    """A transfer's verification report; exit status 1 when it found a difference."""
    for line in report.lines():
        say(line, "red" if line.startswith(("problem:", "VERIFICATION")) else None, to=to)
    if not report.ok:
        raise typer.Exit(1)


TransferScopes = Annotated[list[str] | None, typer.Option(
    "--scope", "-s", help="Only this scope, with its audit lines (repeatable; default: all).")]


@app.command("export")
def export_cmd(
    out_file: Annotated[str, typer.Option("--out", "-o",
                                          help="File to write, or - for standard output.")] = "-",
    scopes: TransferScopes = None,
    db: DbOpt = None,
) -> None:
    """Write the store as suffice-jsonl (the backup format): items, pieces, vectors, records,
    links, config and audit lines; a file is read back and checked before it replaces one."""
    with errors():
        from ._store.transfer import export_jsonl
        store = open_store_at(db, create=False)
        try:
            with fold_progress() as progress:
                target: Any = sys.stdout.buffer if out_file == "-" else Path(out_file)
                report = export_jsonl(store, target, scopes=scopes, progress=progress)
        finally:
            store.close()
    print_report(report, to=err if out_file == "-" else out)


@import_app.command("jsonl")
def import_jsonl_cmd(
    file: Annotated[str, typer.Argument(help="A suffice export, or - for standard input.")],
    db: DbOpt = None,
) -> None:
    """Restore a suffice export: the file is checked whole first, the store must not hold its
    scopes (an import of the same file that was killed is completed by running it again); the
    store is then read back and compared with the file."""
    with errors():
        from ._store.transfer import import_jsonl
        with store_to_fill(db) as store, fold_progress() as progress:
            report = import_jsonl(store, sys.stdin.buffer if file == "-" else Path(file), progress=progress)
    print_report(report)


@app.command("migrate")
def migrate_cmd(
    src: Annotated[str, typer.Argument(help="The store to copy: a SQLite path or a postgresql:// URL.")],
    dst: Annotated[str, typer.Argument(help="The store to copy into (new, or without SRC's scopes).")],
    scopes: TransferScopes = None,
) -> None:
    """Copy a store into another (e.g. SQLite to PostgreSQL), then compare both sides' counts
    and content digests, scope by scope."""
    with errors():
        from ._store.transfer import migrate
        source = open_store_at(src, create=False)
        try:
            with store_to_fill(dst) as target, fold_progress() as progress:
                report = migrate(source, target, scopes=scopes, progress=progress)
        finally:
            source.close()
    print_report(report)


def print_item(it: Any, prefix: str = "") -> None:
    out.print(safe(prefix), style="dim", end="", markup=False, highlight=False)
    say(it.render())


@app.command()
def search(
    query: Annotated[str, typer.Argument(help="What to look for.")],
    scope: ScopeOpt = None, user: UserOpt = None, agent: AgentOpt = None, run: RunOpt = None,
    k: Annotated[int, typer.Option("-k", help="Number of hits.")] = 10,
    method: Annotated[str, typer.Option(help="fused, bm25, dense or recency.")] = "fused",
    session: SessionOpt = None, speaker: SpeakerOpt = None, kind: KindOpt = None,
    since: SinceOpt = None, until: UntilOpt = None, meta: MetaOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    db: DbOpt = None,
) -> None:
    """Run the shared retrieval prefix and print the evidence in time order."""
    with errors():
        mem = open_memory(db, create=False)
        ev = mem.search(query, **where(scope, user, agent, run), k=k, method=method,
                        **filters(session, speaker, kind, since, until, meta))
        if as_json:
            print_result("evidence", ev)
            return
        rank = {h.seq: h.rank for h in ev.hits}
        for it in ev.items:
            print_item(it, f"#{rank[it.seq] + 1:>2} seq {it.seq} ")
        t = ev.timings_ms
        say(f"{len(ev.hits)} hits in {t['total_ms']:.1f} ms "
            f"({', '.join(f'{k[:-3]} {v:.1f}' for k, v in t.items() if k != 'total_ms')})", "dim")
        if ev.notice:
            say(f"note: {ev.notice}", "yellow", to=err)


@app.command("items")
def list_items(
    scope: ScopeOpt = None, user: UserOpt = None, agent: AgentOpt = None, run: RunOpt = None,
    session: SessionOpt = None, speaker: SpeakerOpt = None, kind: KindOpt = None,
    since: SinceOpt = None, until: UntilOpt = None, meta: MetaOpt = None,
    offset: Annotated[int, typer.Option(help="Skip this many matching items.")] = 0,
    limit: Annotated[int | None, typer.Option(help="Show at most this many.")] = 50,
    newest: Annotated[bool, typer.Option("--newest", help="Newest first.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    db: DbOpt = None,
) -> None:
    """List stored items, filtered and paged."""
    with errors():
        mem = open_memory(db, create=False, embedder=None)
        items = mem.items(**where(scope, user, agent, run),
                          **filters(session, speaker, kind, since, until, meta),
                          offset=offset, limit=limit, newest_first=newest)
        if as_json:
            print_result("items", items)
            return
        for it in items:
            print_item(it, f"seq {it.seq} id {it.id} ")


@app.command()
def get(
    item_id: Annotated[str, typer.Argument(help="The item's id.")],
    scope: ScopeOpt = None, user: UserOpt = None, agent: AgentOpt = None, run: RunOpt = None,
    db: DbOpt = None,
) -> None:
    """Print one item as JSON."""
    with errors():
        mem = open_memory(db, create=False, embedder=None)
        print_result("item", mem.get(item_id, **where(scope, user, agent, run)))


@app.command()
def forget(
    scope: ScopeOpt = None, user: UserOpt = None, run: RunOpt = None,
    item_ids: Annotated[list[str] | None, typer.Option("--id", help="Forget this item (repeatable).")] = None,
    session: SessionOpt = None,
    everything: Annotated[bool, typer.Option("--all", help="Forget the whole scope.")] = False,
    db: DbOpt = None,
) -> None:
    """Delete items and every trace of them (for privacy): by id, a session, or --all of a scope."""
    with errors():
        if not (item_ids or session or run or everything):
            fail("say what to forget: --id ID, --session NAME, --run ID, or --all for the whole scope")
        if everything and (item_ids or session is not None):
            fail("--all forgets the whole scope; do not combine it with --id or --session")
        mem = open_memory(db, create=False, embedder=None)
        r = mem.forget(ids=item_ids or None, session=session, everything=everything,
                       **where(scope, user, None, run))
        notes = []
        if r.items and not r.checkpointed:
            notes.append("the write-ahead log is still in use by another process and will be "
                         "emptied at its next checkpoint")
        if r.items and not r.scrubbed:
            notes.append("the database was not rewritten, so old copies may stay in its free space "
                         "until the next VACUUM (VACUUM FULL on PostgreSQL)")
        say(f"forgot {r.items} item(s): {r.pieces} pieces, {r.vectors} vectors, {r.records} records, "
            f"{r.links} links" + "".join(f"; {n}" for n in notes))


@app.command()
def rebuild(
    sets: Annotated[list[str] | None, typer.Option("--set", help=(
        "Store setting KEY=VALUE (repeatable)."))] = None,
    records: Annotated[bool, typer.Option("--records", help=(
        "Also write every record (timeline line) again, e.g. after an upgrade changed their "
        "format: records are written once, when a unit closes."))] = False,
    db: DbOpt = None,
) -> None:
    """Re-derive the store's views (pieces, records, vectors) under new store settings; no re-ingest."""
    with errors():
        from ._api import Memory, default_db_path
        from ._config import parse_overrides
        path = db or _state["db"] or default_db_path()
        changes = parse_overrides(sets or [])
        named = sorted({"encoder", "encoder_dim"} & changes.keys())
        if named:  # the encoder is the memory's, not a setting: --set would be ignored
            fail(f"--set {named[0]} is not a setting: give the encoder with --encoder DIR "
                 "(e.g. suffice --encoder enc/ --db DB rebuild)")
        probe = Memory(path, create=False, embedder=None)
        config = probe.store_config.replace(**changes)
        probe.close()
        with Memory(path, create=False, store_config=config, rebuild=True,
                    embedder=configured_embedder()) as mem:
            n_records = None
            if records:  # the open's rebuild already wrote them when the new settings asked it to
                n_records = (mem._records_rewritten if mem._records_rewritten is not None
                             else mem.rebuild(records=True)["records"])
            done = ", ".join(f"{k}={v}" for k, v in changes.items()) or "its own settings"
            s = mem.stats()
            say(f"rebuilt the views of {mem.path} with {done}; {s.embedded} of {s.items} items "
                f"have vectors of {mem.store_config.encoder or 'no encoder'}"
                + ("" if n_records is None else f"; {n_records} records written again"))


@app.command()
def check(db: DbOpt = None) -> None:
    """Check the store: SQLite integrity, the full-text index, pieces, vectors, records, views."""
    with errors():
        mem = open_memory(db, create=False)
        problems = mem.check()
        for p in problems:
            say(f"problem: {p}", "red")
        if problems:
            raise typer.Exit(1)
        s = mem.stats()
        say(f"ok: {s.items} items in {s.scopes} scopes, {s.embedded} with vectors ({mem.path})")


@app.command()
def stats(scope: ScopeOpt = None, user: UserOpt = None, agent: AgentOpt = None, run: RunOpt = None,
          db: DbOpt = None) -> None:
    """Counts of the store (or of one scope, named as elsewhere)."""
    with errors():
        mem = open_memory(db, create=False, embedder=None)
        s = mem.stats(**where(scope, user, agent, run))
        for key, value in asdict(s).items():
            say(f"{key:>15}: {value}")


@app.command()
def render(
    query: Annotated[str, typer.Argument(help="What the memory is rendered for.")],
    scope: ScopeOpt = None, user: UserOpt = None, agent_id: AgentOpt = None, run: RunOpt = None,
    budget: Annotated[int, typer.Option("--budget", "-b", help="Token budget B (o200k).")] = 2000,
    mode: Annotated[str | None, typer.Option(
        help="unit, piece, unit+piece or timeline (default: the render config's mode).")] = None,
    agent: Annotated[bool, typer.Option("--agent-mode", help="Agent mode: keep a recent window.")] = False,
    session: SessionOpt = None, speaker: SpeakerOpt = None, kind: KindOpt = None,
    since: SinceOpt = None, until: UntilOpt = None, meta: MetaOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    db: DbOpt = None,
) -> None:
    """Render a budgeted memory (timeline + detail) and print it with its token accounting."""
    with errors():
        from ._config import RenderConfig
        mem = open_memory(db, create=False)
        config = RenderConfig.for_agent() if agent else mem.render_config
        if mode is not None:
            config = config.replace(mode=mode)
        ctx = mem.render(query, budget, **where(scope, user, agent_id, run), agent=agent, render=config,
                         **filters(session, speaker, kind, since, until, meta))
        if as_json:
            print_result("context", ctx)
            return
        say(ctx.text)
        say(f"--- {ctx.tokens} tokens of cap {ctx.cap} (budget {ctx.budget}), mode {ctx.mode}, "
            f"{len(ctx.parts)} parts", "dim")
        for p in ctx.parts:
            say(f"  {p.kind:<8} unit {p.unit if p.unit is not None else '-':>4} {p.tokens:>5} tok  "
                f"{p.reason}", "dim")
        if ctx.notice:
            say(ctx.notice, "yellow")


@bench_app.command("render")
def bench_render(
    dataset: Annotated[str, typer.Option(help="locomo or beam.")] = "locomo",
    data: Annotated[Path | None, typer.Option(help="Dataset file or folder (default: shared copy).")] = None,
    json_out: Annotated[Path | None, typer.Option(
        "--json", dir_okay=False, help="Write figures to this file.")] = None,
    plot: Annotated[Path | None, typer.Option(dir_okay=False, help="Write the PNG plot here.")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="Use only the first N conversations.")] = None,
    encoders_from: Annotated[Path | None, typer.Option(help=(
        "Folder of fold encoders kept by `bench retrieval --folds K --keep DIR`: each "
        "conversation is embedded by the encoder that never saw it."))] = None,
) -> None:
    """Share of questions with full gold evidence in the rendered context, per method and B."""
    with errors():
        bench_files("render", None, json_out=json_out, plot=plot, inputs=(data,))
        from ._bench import render as render_bench
        say(render_bench.main(dataset=dataset, data=data, json_out=json_out, plot=plot, limit=limit,
                              encoders_from=encoders_from, embedder=configured_embedder()))


def cached_reader(provider: str, model: str | None, base_url: str | None, cache: Path | None) -> Any:
    """:func:`make_reader`, its calls kept in ``cache`` when one is given."""
    llm = make_reader(provider, model, base_url)
    if cache is None:
        return llm
    from ._llm.cache import CachedLLM
    return CachedLLM(llm, cache)


def make_reader(provider: str, model: str | None, base_url: str | None) -> Any:
    from ._llm import make_llm
    if provider == "local":
        return make_llm("local", **({"model_path": model} if model else {}))
    if provider in ("http", "openai"):
        return make_llm("http", base_url=base_url, model=model)
    if provider == "scripted":  # deterministic and instant: for tests and dry runs of a setup
        from ._llm.scripted import ScriptedLLM, digest_answer
        if model is not None:  # always the same reply; named by it, so a cache keeps replies apart
            return ScriptedLLM(model, model=f"scripted-{hashlib.sha256(model.encode()).hexdigest()[:10]}")
        return ScriptedLLM(digest_answer, model="scripted-digest")
    fail(f"unknown provider {provider!r}; use local, http or scripted")


ProviderOpt = Annotated[str, typer.Option(
    help="local (llama.cpp, shipped model), http (OpenAI-compatible) or scripted (for tests: "
         "replies with the --model text, or without one with a digest of its prompt).")]
ModelOpt = Annotated[str | None, typer.Option(help="Model name, or a GGUF path for local.")]
BaseUrlOpt = Annotated[str | None, typer.Option(help="Base URL for --provider http.")]
StrategyOpt = Annotated[Literal["implementation", "reasoning", "capacity"], typer.Option(help=(
    "How the tier pipeline's tiers differ: implementation (rules / small models / the model), "
    "reasoning (one model: direct / step by step / plan, act, check) or capacity (a small, "
    "medium and large model, see --tier-models)."))]
CAPACITY_MODELS = ("smollm2-135m", "qwen2.5-0.5b", "qwen2.5-1.5b")
"""Shipped local models for the capacity strategy: 135M, 0.5B and (``[judge]`` extra) 1.5B."""
TierModelsOpt = Annotated[str | None, typer.Option(help=(
    "With --strategy capacity: the low,mid,high models, local names or GGUF paths (with --provider "
    f"http, model names at --base-url) [default: {','.join(CAPACITY_MODELS)}]."))]


def tier_strategy(mem: Any, strategy: str, tier_models: str | None, make: Callable[[str], Any]) -> None:
    """Give ``mem``'s tier pipeline its strategy; the capacity strategy gets its three models,
    each made by ``make`` from its name."""
    if tier_models is not None and strategy != "capacity":
        fail("--tier-models goes with --strategy capacity")
    if strategy == "implementation":
        return
    from dataclasses import replace
    mem.tier_settings = replace(mem.tier_settings, strategy=strategy)
    if strategy == "capacity":
        names = [n.strip() for n in tier_models.split(",")] if tier_models else list(CAPACITY_MODELS)
        if len(names) != 3 or not all(names):
            fail("--tier-models takes three models, low,mid,high")
        mem.tier_models = {tier: make(name) for tier, name in zip(("low", "mid", "high"), names, strict=True)}


def variant_list(text: str, known: Sequence[str]) -> list[str]:
    """A benchmark's ``--variants``: comma-separated names, each one of ``known``, at least one."""
    wanted = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in wanted if v not in known]
    if bad:
        fail(f"unknown variant(s) {', '.join(bad)}; use {', '.join(known)}")
    if not wanted:
        fail(f"--variants names none; use one or more of {', '.join(known)}")
    return wanted


RECORD_FIELDS = {
    "qa": {"variant", "key", "em"},
    "tiers": {"variant", "key", "pipeline_usd"},
    "progressive": {"key", "fast"},
    "agent qa": {"variant", "key", "group", "domain"},
    "agent recall": {"key", "methods"},
}
"""Fields every record of a benchmark's per-question file has: a file without them holds
another benchmark's records (or something else), which a resumed run must not append to."""

PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def bench_files(kind: str, records: Path | None, *, json_out: Path | None = None,
                plot: Path | None = None, inputs: Sequence[Path | None] = ()) -> None:
    """Check a benchmark's files before any work: the records file (``--out`` / ``--records``)
    holds this benchmark's records or none; ``--json`` and ``--plot`` name neither it nor an
    input (``--data``, ``--store``), which writing them would replace; a plot is a format
    matplotlib writes. A mistake here used to surface after hours of answers, or to overwrite
    them."""
    def same(a: Path, b: Path) -> bool:
        return a.resolve() == b.resolve()

    written = {"--json": json_out, "--plot": plot}
    for flag, path in written.items():
        if path is None:
            continue
        for other_flag, other in (("the records file", records), *(("an input", i) for i in inputs)):
            if other is not None and same(path, other):
                fail(f"{flag} {path} is {other_flag}: writing it would replace it; name another file")
    if json_out is not None and plot is not None and same(json_out, plot):
        fail(f"--json and --plot name the same file {json_out}")
    if plot is not None and plot.suffix.lower() not in PLOT_SUFFIXES:
        fail(f"--plot {plot}: give a file ending in {', '.join(PLOT_SUFFIXES)}")
    if records is None or not records.is_file():
        return
    if any(i is not None and same(records, i) for i in inputs):
        fail(f"the records file {records} is an input of the run; name another file")
    # The first line that reads as a record decides (a kill may have cut the very first one,
    # which the run then redoes); a file with no such line is a record file only when all it
    # holds is that one cut record.
    rec: Any = None
    cut = bad = False
    with records.open("rb") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                break
            except ValueError:
                if cut or not line.lstrip().startswith(b"{"):
                    bad = True
                    break
                cut = True
    if rec is None and not bad:  # empty, or a single record cut by a kill
        return
    if bad or not isinstance(rec, dict) or not RECORD_FIELDS[kind] <= set(rec):
        fail(f"{records} does not hold `bench {kind}` records (its first line lacks "
             f"{', '.join(sorted(RECORD_FIELDS[kind]))}): name a new file or one this benchmark wrote")


def locomo_run(data: Path | None, limit: int | None, store: Path) -> tuple[Any, Any, Any]:
    """Load LoCoMo, pick the first ``limit`` questions, and make sure their scopes are stored."""
    from ._bench import qa
    from ._datasets.locomo import load_locomo
    convs = load_locomo(data)
    items = qa.select(convs, limit)
    mem = open_memory(str(store))
    with progress_bar("ingesting", None) as advance:
        qa.ingest(mem, convs, {i.scope for i in items}, progress=advance)
    return convs, items, mem


@bench_app.command("qa")
def bench_qa(
    dataset: Annotated[str, typer.Option(help="Dataset name (locomo).")] = "locomo",
    data: Annotated[Path | None, typer.Option(help="Dataset file (default: the shared copy).")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="First N questions of categories 1-4.")] = 100,
    variants: Annotated[str, typer.Option(
        help="Comma list of fast, render, recency, no-memory.")] = "fast,recency,no-memory",
    budget: Annotated[int, typer.Option(help="Reader context budget in tokens.")] = 1000,
    provider: ProviderOpt = "local",
    model: ModelOpt = None,
    base_url: BaseUrlOpt = None,
    use_judge: Annotated[bool, typer.Option("--judge/--no-judge",
                                            help="Score with the LLM judge too.")] = True,
    out_path: Annotated[Path, typer.Option("--out", dir_okay=False, help="Per-question JSONL (resumable).")
                        ] = Path("runs/qa_locomo.jsonl"),
    store: Annotated[Path, typer.Option("--store", help="Store the dataset is ingested into.")
                     ] = Path("runs/locomo.db"),
    json_out: Annotated[Path | None, typer.Option(
        "--json", dir_okay=False, help="Write figures to this file.")] = None,
) -> None:
    """Answer questions from memory and report F1, judge, tokens, cost and latency per category."""
    with errors():
        if dataset != "locomo":
            fail(f"unknown dataset {dataset!r}; bench qa supports: locomo")
        bench_files("qa", out_path, json_out=json_out, inputs=(data, store))
        from ._bench import qa
        from ._bench.report import envelope, write_json
        from ._datasets.locomo import default_path
        wanted = variant_list(variants, qa.VARIANTS)
        llm = make_reader(provider, model, base_url)  # a bad provider fails before the ingest
        convs, items, mem = locomo_run(data, limit, store)
        with progress_bar("questions", len(items)) as advance:
            qa.run(mem, llm, items, wanted, budget, out_path, judge_llm=llm if use_judge else None,
                   progress=advance)
        summary = qa.summarize(out_path, qa.questions_of(items), qa.fingerprints(mem, llm, budget, wanted))
        say(qa.format_summary(summary))
        if json_out is not None:
            write_json(json_out, envelope("qa", dataset, str(data or default_path()),
                                          {"budget": budget, "limit": limit, "variants": wanted,
                                           "reader": llm.model, "judge": llm.model if use_judge else None},
                                          summary))
            say(f"wrote {json_out}")


@bench_app.command("judge")
def bench_judge(
    results: Annotated[Path, typer.Argument(help="A bench qa or progressive JSONL to grade.")],
    provider: ProviderOpt = "local",
    model: Annotated[str | None, typer.Option(
        help="Judge model: a shipped name or GGUF path (local; default qwen2.5-1.5b), or the "
        "server's model name (http; default $SUFFICE_LLM_MODEL).")] = None,
    base_url: BaseUrlOpt = None,
) -> None:
    """Grade every answer of a results file with an LLM judge, in place and resumably.

    Rerun the benchmark command afterwards (it resumes, so it only re-summarises) to get the
    judge column and the router AUC against judged correctness.
    """
    with errors():
        if not results.is_file():
            fail(f"no results file at {results}")
        from ._bench.judge import judge_file
        if model is None and provider == "local":
            model = "qwen2.5-1.5b"
        llm = make_reader(provider, model, base_url)
        n = sum(1 for line in results.read_text(encoding="utf-8").splitlines() if line.strip())
        with progress_bar("judging", n) as advance:
            counts = judge_file(results, llm, progress=advance)
        say(f"{results}: judged {counts['judged']:.0f} answers with {llm.model} "
            f"({counts['failed']:.0f} failed, {counts['skipped']:.0f} already judged); "
            f"mean judge score {counts['mean_judge']:.1f}")


@bench_app.command("tiers")
def bench_tiers(
    lambdas: Annotated[str, typer.Option(help="Cost weights whose trained policies to compare.")
                       ] = "0,0.1,0.3,0.5,0.9",
    policies: Annotated[Path | None, typer.Option(help="Folder of trained policies (suffice train tiers).")
                        ] = None,
    fixed: Annotated[str, typer.Option(help="Fixed all-<tier> pipelines to compare.")] = "low,mid,high",
    extra: Annotated[list[Path] | None, typer.Option("--policy", help=(
        "A policy file to compare too, e.g. the ablation without scale alignment (repeatable)."))] = None,
    heuristic: Annotated[bool, typer.Option("--heuristic/--no-heuristic",
                                            help="Compare the untrained default too.")] = True,
    dataset: Annotated[str, typer.Option(help="locomo or hotpotqa (the dev items).")] = "locomo",
    data: Annotated[Path | None, typer.Option(help="Dataset file (default: the shared copy).")] = None,
    limit: Annotated[int | None, typer.Option(
        min=1, help="First N questions (LoCoMo: of categories 1-4).")] = 150,
    budget: Annotated[int, typer.Option(help="Tokens of the summary the reader gets.")] = 1000,
    strategy: StrategyOpt = "implementation",
    tier_models: TierModelsOpt = None,
    provider: ProviderOpt = "local",
    model: ModelOpt = None,
    base_url: BaseUrlOpt = None,
    out_path: Annotated[Path, typer.Option("--out", dir_okay=False, help="Per-question JSONL (resumable).")
                        ] = Path("runs/tiers_locomo.jsonl"),
    store: Annotated[Path | None, typer.Option(help=(
        "Store the dataset is ingested into (default: runs/locomo.db, runs/hotpotqa_tiers.db)."))] = None,
    llm_cache: LLMCacheOpt = Path("runs/llm_cache_tiers.db"),
    module_cache: ModuleCacheOpt = Path("runs/tier_modules.db"),
    plot: Annotated[Path | None, typer.Option(
        dir_okay=False, help="Frontier PNG.")] = Path("runs/tiers_frontier.png"),
    json_out: Annotated[Path | None, typer.Option(
        "--json", dir_okay=False, help="Write figures to this file.")] = None,
) -> None:
    """Quality against cost: trained tier policies per lambda, the heuristic default and fixed
    all-Low / all-Mid / all-High pipelines, on the same questions with the real reader."""
    with errors():
        from ._bench import qa
        from ._bench import tiers as bt
        from ._route.tiers import FixedTiers, HeuristicTiers, load_tier_policy
        sources: list[Any] = []
        for t in [t.strip() for t in fixed.split(",") if t.strip()]:
            if t not in ("low", "mid", "high"):
                fail(f"--fixed takes low, mid and high, got {t!r}")
            sources.append(FixedTiers.all(t))  # type: ignore[arg-type]
        if dataset not in ("locomo", "hotpotqa"):
            fail(f"unknown dataset {dataset!r}; bench tiers supports locomo and hotpotqa")
        bench_files("tiers", out_path, json_out=json_out, plot=plot,
                    inputs=(data, store, llm_cache, module_cache))
        lams = _floats(lambdas, "--lambdas") if policies is not None else []  # before the setup
        if dataset == "locomo":
            convs, items, mem, llm, _ = _tier_setup(store or Path("runs/locomo.db"), data, provider,
                                                    model, base_url, llm_cache, module_cache, limit)
        else:
            items, mem, llm = _hotpot_setup(store or Path("runs/hotpotqa_tiers.db"), data, provider,
                                            model, base_url, llm_cache, module_cache, limit)
        tier_strategy(mem, strategy, tier_models,
                      lambda name: cached_reader(provider, name, base_url, llm_cache))
        if heuristic:
            sources.append(HeuristicTiers(embedder=mem.embedder is not None))
        if policies is not None:
            for lam in lams:
                pol = load_tier_policy(policies, lam)
                if abs(pol.lam - lam) > 1e-9:
                    say(f"no policy trained at lambda={lam:g} in {policies}; skipped", "yellow")
                    continue
                pol.name = f"policy λ={lam:g}"
                sources.append(pol)
        for f in extra or []:
            pol = load_tier_policy(f)
            pol.name = f"{f.stem} λ={pol.lam:g}"
            sources.append(pol)
        with progress_bar("answers", len(items) * len(sources)) as advance:
            counts = bt.run(mem, llm, items, sources, out_path, budget=budget, progress=advance)
        say(f"answers: {counts['ran']} run, {counts['reused']} reused")
        summary = bt.summarize(out_path, qa.questions_of(items),
                               bt.fingerprints(mem, llm, sources, budget=budget))
        say(bt.format_summary(summary))
        if plot is not None and summary["configs"]:
            bt.plot(summary, plot)
            say(f"wrote {plot}")
        if json_out is not None:
            from ._bench.report import envelope, write_json
            write_json(json_out, envelope("bench_tiers", dataset, str(data or "shared copy"),
                                          {"limit": limit, "budget": budget, "lambdas": lambdas,
                                           "policies": str(policies), "fixed": fixed, "strategy": strategy,
                                           "tier_models": sorted((k, m.model) for k, m in
                                                                 (mem.tier_models or {}).items())},
                                          summary))


@bench_app.command("progressive")
def bench_progressive(
    dataset: Annotated[str, typer.Option(help="Dataset name (locomo).")] = "locomo",
    data: Annotated[Path | None, typer.Option(help="Dataset file (default: the shared copy).")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="First N questions of categories 1-4.")] = 150,
    taus: Annotated[str, typer.Option(help="Comma list of router thresholds.")] = "0.1,0.3,0.5,0.7,0.9",
    budget: Annotated[int, typer.Option(help="Reader context budget in tokens.")] = 1000,
    provider: ProviderOpt = "local",
    model: ModelOpt = None,
    base_url: BaseUrlOpt = None,
    use_judge: Annotated[bool, typer.Option("--judge/--no-judge",
                                            help="Score with the LLM judge too.")] = False,
    out_path: Annotated[Path, typer.Option("--out", dir_okay=False, help="Per-question JSONL (resumable).")
                        ] = Path("runs/progressive_locomo.jsonl"),
    store: Annotated[Path, typer.Option("--store", help="Store the dataset is ingested into.")
                     ] = Path("runs/locomo.db"),
    plot: Annotated[Path | None, typer.Option(dir_okay=False, help="Quality-vs-latency PNG.")
                    ] = Path("runs/progressive_locomo.png"),
    json_out: Annotated[Path | None, typer.Option(
        "--json", dir_okay=False, help="Write figures to this file.")] = None,
    verify: Annotated[int, typer.Option(
        help="Also run auto for real on N recorded questions and check it matches the table.")] = 0,
    verify_tau: Annotated[float, typer.Option(help="Threshold for --verify (signals router).")] = 0.7,
    deep_model: Annotated[str | None, typer.Option(help=(
        "Model that writes the deep path's answers (a shipped name or GGUF path for local; the "
        "server's model name for http); default: the reader."))] = None,
    router_dirs: Annotated[list[Path] | None, typer.Option("--router", help=(
        "A trained router folder to compare too (repeatable); recorded answers are reused, so "
        "adding one costs no model call."))] = None,
    cache: Annotated[Path | None, typer.Option(help=(
        "Cache model calls here (replayed calls keep their tokens and time)."))] = None,
    stop_path: Annotated[bool, typer.Option("--stop-path", help=(
        "Also record the deep model over the fast budget: what auto answers an early stop with "
        "under EngineConfig(stop_reader='deep'); the summary then composes auto both ways "
        "(rows marked stop=deep). Needs --deep-model."))] = False,
) -> None:
    """Fast, deep and auto(tau): F1, early-termination rate, T_mem, T_e2e, tokens, cost, router AUC."""
    with errors():
        if dataset != "locomo":
            fail(f"unknown dataset {dataset!r}; bench progressive supports: locomo")
        bench_files("progressive", out_path, json_out=json_out, plot=plot, inputs=(data, store, cache))
        try:
            tau_list = [float(t) for t in taus.split(",") if t.strip()]
        except ValueError:
            fail(f"--taus must be numbers separated by commas, got {taus!r}")
        from ._bench import progressive, qa
        from ._bench.report import envelope, write_json
        from ._datasets.locomo import default_path
        if stop_path and not deep_model:
            fail("--stop-path records the deep model over the fast budget: give --deep-model too")
        convs, items, mem = locomo_run(data, limit, store)
        gold = qa.gold_finder(mem, {i.scope for i in items})
        llm = cached_reader(provider, model, base_url, cache)
        deep_llm = cached_reader(provider, deep_model, base_url, cache) if deep_model else None
        from ._route.trained import TrainedRouter
        trained = [TrainedRouter(d) for d in router_dirs or []]
        for r in trained:
            r.name = f"trained:{r.model}"
        with progress_bar("questions", len(items)) as advance:
            counts = progressive.run(mem, llm, items, out_path, budget=budget, gold_seqs=gold,
                                     judge_llm=llm if use_judge else None, deep_llm=deep_llm,
                                     extra_routers=trained, stop_path=stop_path, progress=advance)
        say(f"path results: {counts['ran']} run, {counts['reused']} reused; "
            f"{counts['routers_scored']} router scores added")
        summary = progressive.summarize(out_path, tau_list, qa.questions_of(items))
        if verify > 0:
            summary["verify"] = progressive.verify(mem, llm, items, out_path, n=verify,
                                                   tau=verify_tau, budget=budget, deep_llm=deep_llm)
            v = summary["verify"]
            say(f"verify: auto[{v['router']}] tau={v['tau']} run for real on {v['n']} "
                f"questions: {v['same_path']} took the recorded path, {v['same_answer']} "
                "gave the recorded answer")
        say(progressive.format_summary(summary))
        if plot is not None:
            progressive.plot(summary, plot)
            say(f"wrote {plot}")
        if json_out is not None:
            write_json(json_out, envelope("progressive", dataset, str(data or default_path()),
                                          {"budget": budget, "limit": limit, "taus": tau_list,
                                           "reader": llm.model,
                                           "deep_model": (deep_llm or llm).model,
                                           "routers": [r.card for r in trained],
                                           "store": mem.store_config.model_dump(),
                                           "retrieval": mem.retrieval.model_dump(),
                                           "render": mem.render_config.model_dump(),
                                           "engine": mem.engine_config.model_dump()},
                                          summary))
            say(f"wrote {json_out}")


AgentSampleOpt = Annotated[int | None, typer.Option(min=1, help=(
    "Episodes (AMA-Bench) or conversations (BEAM) to sample; all when omitted."))]


def _agent_qa_judge(use: bool, provider: str, model: str | None, base_url: str | None,
                    cache: Path | None) -> Any:
    """The judge of the agent QA runs: the local 1.5B when installed (or the model named), None
    with --no-judge or when the default judge is not installed (the run then reports F1 only)."""
    if not use:
        return None
    if provider == "local" and model is None:
        from ._errors import ModelFileError
        from ._llm.models import resolve_model
        try:
            resolve_model("qwen2.5-1.5b")
        except ModelFileError as exc:
            say(f"no judge: {exc}", "yellow")
            return None
        model = "qwen2.5-1.5b"
    return cached_reader(provider, model, base_url, cache)


def _agent_qa(dataset: str, data: Path | None, sources: int | None, per_source: int, limit: int | None,
              variants: str, budget: int, provider: str, model: str | None, base_url: str | None,
              use_judge: bool, judge_provider: str, judge_model: str | None, judge_base_url: str | None,
              out_path: Path, store: Path, cache: Path | None, json_out: Path | None,
              deep_model: str | None = None) -> None:
    from ._bench import agent_qa
    bench_files("agent qa", out_path, json_out=json_out, inputs=(data, store, cache))
    wanted = variant_list(variants, agent_qa.VARIANTS)
    wanted = [v for v in agent_qa.VARIANTS if v in wanted]  # auto after fast and deep: replays
    llm = cached_reader(provider, model, base_url, cache)
    judge_llm = _agent_qa_judge(use_judge, judge_provider, judge_model, judge_base_url, cache)
    mem = agent_qa.open_store(str(store), configured_embedder() or "default")
    if deep_model:  # the capacity lever of docs/benchmarks.md section 7
        mem.deep_llm = cached_reader(provider, deep_model, base_url, cache)
    with progress_bar("questions", None) as advance:
        summary = agent_qa.main(dataset, mem=mem, llm=llm, judge_llm=judge_llm, data=data, sources=sources,
                                per_source=per_source, limit=limit, variants=wanted, budget=budget,
                                out=out_path, json_out=json_out, progress=advance)
    c = summary["counts"]
    say(f"answers: {c['ran']} run, {c['reused']} reused; {c['judged']} judged; "
        f"{summary['n_questions']} of {summary['sample']['questions']} sampled questions complete")
    say(agent_qa.format_summary(summary, group_label="type" if dataset == "ama" else "ability"))
    if json_out is not None:
        say(f"wrote {json_out}")


DeepModelOpt = Annotated[str | None, typer.Option(help=(
    "Model that writes the deep path's answers (a shipped name or GGUF path for local; the "
    "server's model name for http); default: the reader."))]
AgentVariantsOpt = Annotated[str, typer.Option(help=(
    "Comma list of fast, deep, auto, truncation, prefix-fill."))]
JudgeProviderOpt = Annotated[str, typer.Option(help="Judge provider: local or http (OpenAI-compatible).")]
JudgeModelOpt = Annotated[str | None, typer.Option(help=(
    "Judge model (local default: qwen2.5-1.5b from the \\[judge] extra; http: the server's name)."))]
JudgeBaseUrlOpt = Annotated[str | None, typer.Option(help="Base URL for --judge-provider http.")]
AgentJudgeOpt = Annotated[bool, typer.Option("--judge/--no-judge", help=(
    "Judge the answers (a later run with --judge fills in what a --no-judge run left)."))]


bench_agent_app = typer.Typer(no_args_is_help=True, help=(
    "Agent memory on real runs: recall of the evidence in a B-token context (evidence, "
    "checkpoints; no LLM) and question answering (qa, beam)."))
bench_app.add_typer(bench_agent_app, name="agent")


DenseOpt = Annotated[bool, typer.Option("--dense", help=(
    "Rank with the shipped MiniLM's vectors too (items stored without vectors are embedded at "
    "their run's first question; give a store of its own with --store)."))]


def _bench_agent_recall(dataset: str, data: Path | None, store: Path, records: Path, budgets: str | None,
                        limit: int | None, json_out: Path | None, dense: bool = False) -> None:
    from ._bench import agent as agent_bench
    bench_files("agent recall", records, json_out=json_out, inputs=(data, store))
    try:
        wanted = tuple(int(b) for b in budgets.split(",")) if budgets else None
    except ValueError:
        wanted = ()
    if wanted is not None and (not wanted or min(wanted) <= 0):
        fail(f"--budgets takes whole numbers above 0 separated by commas, got {budgets!r}")
    _, text = agent_bench.main(dataset, db=store, out=records, data=data, budgets=wanted, limit=limit,
                               json_out=json_out, embedder="default" if dense else None)
    say(text)


@bench_agent_app.command("evidence")
def bench_agent_evidence(
    data: Annotated[Path | None, typer.Option(help="AMA-Bench folder (default: the shared copy).")] = None,
    store: Annotated[Path, typer.Option(help="The store, built here once (resumable).")
                     ] = Path("runs/agent/ama.db"),
    records: Annotated[Path, typer.Option("--records", dir_okay=False, help="Per-question JSONL (resumable).")
                       ] = Path("runs/agent/evidence_ama.jsonl"),
    budgets: Annotated[str | None, typer.Option(help="Comma-separated budgets (default 2000,4000,8000).")
                       ] = None,
    limit: Annotated[int | None, typer.Option(
        min=1, help="Stop after this many questions in the records.")] = None,
    json_out: Annotated[Path | None, typer.Option(
        "--json", dir_okay=False, help="Write the summary here.")] = None,
    dense: DenseOpt = False,
) -> None:
    """Evidence recall on AMA-Bench: the items of the cited steps inside the context, against
    truncation, observation masking and prefix fill."""
    with errors():
        _bench_agent_recall("ama", data, store, records, budgets, limit, json_out, dense)


@bench_agent_app.command("checkpoints")
def bench_agent_checkpoints(
    dataset: Annotated[str, typer.Argument(help="swe (SWE-bench runs), tau (τ-bench) or tau2 (τ²-bench).")],
    data: Annotated[Path | None, typer.Option(help="The runs (default: the shared copy).")] = None,
    store: Annotated[Path | None, typer.Option(help="The store (default runs/agent/DATASET.db).")] = None,
    records: Annotated[Path | None, typer.Option("--records", help=(
        "Per-checkpoint JSONL (default runs/agent/checkpoints_DATASET.jsonl; resumable)."))] = None,
    budgets: Annotated[str | None, typer.Option(help="Comma-separated budgets (default 4000,8000).")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="Stop after this many checkpoints in the records.")
                     ] = None,
    json_out: Annotated[Path | None, typer.Option(
        "--json", dir_okay=False, help="Write the summary here.")] = None,
    dense: DenseOpt = False,
) -> None:
    """Checkpoint recall: just before a step that needs an earlier step's output, is that
    output inside the context rendered from the history so far?"""
    with errors():
        if dataset not in ("swe", "tau", "tau2"):
            fail(f"unknown dataset {dataset!r}; use swe, tau or tau2")
        _bench_agent_recall(dataset, data, store or Path(f"runs/agent/{dataset}.db"),
                            records or Path(f"runs/agent/checkpoints_{dataset}.jsonl"), budgets, limit,
                            json_out, dense)


@bench_agent_app.command("qa")
def bench_agent_qa(
    data: Annotated[Path | None, typer.Option(help="AMA-Bench folder (default: the shared copy).")] = None,
    episodes: AgentSampleOpt = 12,
    per_episode: Annotated[int, typer.Option(min=1, help="Questions per sampled episode.")] = 2,
    limit: Annotated[int | None, typer.Option(
        min=1, help="Only the first N questions of the sample.")] = None,
    variants: AgentVariantsOpt = "fast,truncation,prefix-fill,deep,auto",
    budget: Annotated[int, typer.Option(help="Reader context budget in tokens.")] = 1000,
    provider: ProviderOpt = "local",
    model: ModelOpt = None,
    base_url: BaseUrlOpt = None,
    use_judge: AgentJudgeOpt = True,
    judge_provider: JudgeProviderOpt = "local",
    judge_model: JudgeModelOpt = None,
    judge_base_url: JudgeBaseUrlOpt = None,
    out_path: Annotated[Path, typer.Option("--out", dir_okay=False, help="Per-question JSONL (resumable).")
                        ] = Path("runs/agent_qa_ama.jsonl"),
    store: Annotated[Path, typer.Option(help="Store the sampled episodes are ingested into.")
                     ] = Path("runs/agent_qa_ama.db"),
    deep_model: DeepModelOpt = None,
    cache: Annotated[Path | None, typer.Option(help="Model-call cache (replays keep their tokens and time).")
                     ] = Path("runs/llm_cache_agent_qa.db"),
    json_out: Annotated[Path | None, typer.Option(
        "--json", dir_okay=False, help="Write figures to this file.")] = None,
) -> None:
    """AMA-Bench open-ended QA: fast / deep / auto against truncation and prefix fill at the same
    budget; F1 and judge per question type and domain, early-exit rate, T_mem, T_e2e, tokens.

    The sample is deterministic and balanced over domains and types (round-robin over domains,
    types rotated per episode); a rerun resumes from the records in --out.
    """
    with errors():
        _agent_qa("ama", data, episodes, per_episode, limit, variants, budget, provider, model, base_url,
                  use_judge, judge_provider, judge_model, judge_base_url, out_path, store, cache, json_out,
                  deep_model)


@bench_agent_app.command("beam")
def bench_beam(
    data: Annotated[Path | None, typer.Option(help="BEAM tier folder (default: the shared 100K).")] = None,
    conversations: AgentSampleOpt = 1,
    per_ability: Annotated[int, typer.Option(min=1, help="Questions per ability and conversation.")] = 1,
    limit: Annotated[int | None, typer.Option(
        min=1, help="Only the first N questions of the sample.")] = None,
    variants: AgentVariantsOpt = "fast,deep,auto",
    budget: Annotated[int, typer.Option(help="Reader context budget in tokens.")] = 1000,
    provider: ProviderOpt = "local",
    model: ModelOpt = None,
    base_url: BaseUrlOpt = None,
    use_judge: AgentJudgeOpt = True,
    judge_provider: JudgeProviderOpt = "local",
    judge_model: JudgeModelOpt = None,
    judge_base_url: JudgeBaseUrlOpt = None,
    out_path: Annotated[Path, typer.Option("--out", dir_okay=False, help="Per-question JSONL (resumable).")
                        ] = Path("runs/agent_qa_beam.jsonl"),
    store: Annotated[Path, typer.Option(help="Store the sampled conversations are ingested into.")
                     ] = Path("runs/agent_qa_beam.db"),
    deep_model: DeepModelOpt = None,
    cache: Annotated[Path | None, typer.Option(help="Model-call cache (replays keep their tokens and time).")
                     ] = Path("runs/llm_cache_agent_qa.db"),
    json_out: Annotated[Path | None, typer.Option(
        "--json", dir_okay=False, help="Write figures to this file.")] = None,
) -> None:
    """BEAM QA with fast / deep / auto, each answer judged against the question's rubric items
    (0 / 0.5 / 1 per item, averaged), by ability, with T_e2e; resumable from --out."""
    with errors():
        _agent_qa("beam", data, conversations, per_ability, limit, variants, budget, provider, model,
                  base_url, use_judge, judge_provider, judge_model, judge_base_url, out_path, store, cache,
                  json_out, deep_model)


@app.command()
def ask(
    question: Annotated[str, typer.Argument(help="The question.")],
    scope: ScopeOpt = None, user: UserOpt = None, agent: AgentOpt = None, run: RunOpt = None,
    mode: Annotated[str | None, typer.Option(help="fast, deep or auto [default: fast; deep with --tiered].")
                    ] = None,
    tau: Annotated[float | None, typer.Option(help="Router threshold for --mode auto.")] = None,
    router: Annotated[str, typer.Option(help=(
        "For --mode auto: default (the trained router when one is installed or named by "
        "$SUFFICE_ROUTER, else signals), signals (retrieval signals, no model call), lm "
        "(zero-shot), or the folder of a router from `suffice train router`."))] = "default",
    deep_model: Annotated[str | None, typer.Option(help=(
        "Model for the deep path's answer (capacity escalation), e.g. qwen2.5-1.5b with the "
        "\\[judge] extra; default: the fast path's model."))] = None,
    budget: Annotated[int, typer.Option(help="Reader context budget in tokens.")] = 1000,
    timeout: Annotated[float | None, typer.Option(
        help="Seconds for the whole query, every model call included; then it answers from what it has.")
    ] = None,
    tiered: Annotated[bool, typer.Option("--tiered", help=(
        "The deep path reads through the tier pipeline (filter, entity/temporal/topic, "
        "summary) at the tiers a policy picks ($SUFFICE_TIERS, else the heuristic default)."))] = False,
    lam: Annotated[float | None, typer.Option(help="With --tiered: the cost weight of the policy to use.")
                   ] = None,
    tier_cap: Annotated[str | None, typer.Option(help="With --tiered: no module above low, mid or high.")
                        ] = None,
    strategy: StrategyOpt = "implementation",
    tier_models: TierModelsOpt = None,
    provider: ProviderOpt = "local",
    model: ModelOpt = None,
    base_url: BaseUrlOpt = None,
    session: SessionOpt = None, speaker: SpeakerOpt = None, kind: KindOpt = None,
    since: SinceOpt = None, until: UntilOpt = None, meta: MetaOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the answer and receipt as JSON.")] = False,
    db: DbOpt = None,
) -> None:
    """Answer a question from memory and print the answer with its receipt."""
    with errors():
        if tiered and mode == "fast":
            fail("--tiered runs on the deep path: use --mode deep (its default) or --mode auto")
        mode = mode or ("deep" if tiered else "fast")
        if mode not in ("fast", "deep", "auto"):
            fail(f"unknown mode {mode!r}; use fast, deep or auto")
        if router not in ("default", "signals", "lm") and not Path(router).is_dir():
            fail(f"unknown router {router!r}; use default, signals, lm or a router folder")
        if mode != "auto" and (router != "default" or tau is not None):
            fail("--router and --tau go with --mode auto")
        tiers: dict[str, Any] = {}
        if tiered:
            tiers = {"agent": "tiered", "lam": lam, "tier_cap": tier_cap}
        elif lam is not None or tier_cap is not None or strategy != "implementation" or tier_models:
            fail("--lam, --tier-cap, --strategy and --tier-models go with --tiered")
        mem = open_memory(db, create=False)
        # What can be checked without a model is, before one loads (seconds for a local one):
        # the scope, a router folder, the router auto mode would use by default.
        mem._require(mem._ident(scope, user, agent, run).scope)
        from ._route import LMRouter, ScoreRouter, TrainedRouter
        named = mode == "auto" and router not in ("default", "signals", "lm")
        folder = TrainedRouter(router) if named else None
        if mode == "auto" and router == "default":
            _ = mem.router
        llm = make_reader(provider, model, base_url)
        deep_llm = make_reader(provider, deep_model, base_url) if deep_model else None
        rt: Any = None
        if mode == "auto" and router != "default":
            rt = LMRouter(llm) if router == "lm" else ScoreRouter() if router == "signals" else folder
        tier_strategy(mem, strategy, tier_models, lambda name: make_reader(provider, name, base_url))
        ans = mem.ask(question, **where(scope, user, agent, run), llm=llm, deep_llm=deep_llm,
                      mode=mode, router=rt,
                      tau=tau, budget=budget, timeout=timeout, **tiers,
                      **filters(session, speaker, kind, since, until, meta))
        r = ans.receipt
        # The engine's stand-in when no model answered: the top evidence, noted as such.
        failed = r.path == "fast" and any(n.startswith("answer call failed") for n in r.notes)
        if as_json:
            print_result("answer", ans, failed=failed)  # the servers' JSON, and whether a model answered
            if failed:
                raise typer.Exit(1)
            return
        if failed:  # the library's stand-in (the top evidence) is shown as what it is
            say(f"(no answer: the model failed) best matching item: {ans.text}", "yellow")
        else:
            say(ans.text, "bold")
        routed = (f", router {r.router} {r.router_score:.2f} vs tau {r.tau}"
                  if r.router_score is not None else "")
        say(f"path {r.path} (mode {r.mode}{routed}) | model {r.model} | {r.input_tokens} in + "
            f"{r.output_tokens} out tokens, ${r.cost_usd:.5f} | {r.t_e2e_ms:.0f} ms end to end, "
            f"{r.t_mem_ms:.0f} ms memory", "dim")
        say("stages: " + ", ".join(f"{k} {v:.0f} ms" for k, v in r.stages_ms.items()), "dim")
        for m in r.modules:
            fell = f" (asked {m.asked})" if m.asked != m.tier else ""
            say(f"module {m.module}: {m.tier}{fell} by {m.model}, {m.input_tokens} in + "
                f"{m.output_tokens} out tokens, {m.latency_ms:.0f} ms, ${m.cost_usd:.2e}", "dim")
        for b in r.blocks:
            say(f"block {b.block} items {b.first_seq}-{b.last_seq}: {b.why}; "
                f"{'relevant' if b.relevant else 'nothing relevant'} ({b.latency_ms:.0f} ms)", "dim")
        for n in r.notes:
            say(f"note: {n}", "yellow")
        if failed:
            raise typer.Exit(1)


keys_app = typer.Typer(no_args_is_help=True,
                       help="API keys of the REST server (digests kept, tokens shown once).")
app.add_typer(keys_app, name="keys")
KeysOpt = Annotated[Path, typer.Option("--keys", envvar="SUFFICE_KEYS", help=(
    "The key file (digests only, mode 0600)."))]
LOOPBACK = ("127.0.0.1", "::1", "localhost")


@keys_app.command("add")
def keys_add(scopes: Annotated[list[str], typer.Option("--scope", "-s", help=(
                 "A scope the key may touch (repeatable): a name, a prefix ending in *, or *."))],
             name: Annotated[str, typer.Option(help="A label to recognise the key by.")] = "",
             keys: KeysOpt = Path("suffice-keys.json")) -> None:
    """Create a key bound to scopes and print it once; only its digest is stored."""
    with errors():
        from ._access import KeyRing
        token, key = KeyRing(keys).create(scopes, name)
        typer.echo(token)  # alone on stdout, so a script can capture it
        say(f"key {key.key_id} for {', '.join(key.grant.patterns)} saved in {keys} "
            "(the token is not stored: keep it now)", "dim", to=err)


@keys_app.command("list")
def keys_list(keys: KeysOpt = Path("suffice-keys.json")) -> None:
    """The keys of a key file: id, name, scopes (never the tokens)."""
    with errors():
        from ._access import KeyRing
        for k in KeyRing(keys).keys():
            typer.echo(f"{k.key_id}\t{k.name or '-'}\t{','.join(k.grant.patterns)}")  # tab-separated


@keys_app.command("revoke")
def keys_revoke(key_id: Annotated[str, typer.Argument(help="The key's id (from keys list).")],
                keys: KeysOpt = Path("suffice-keys.json")) -> None:
    """Remove a key; a running server refuses it from its next request."""
    with errors():
        from ._access import KeyRing
        if not KeyRing(keys).revoke(key_id):
            fail(f"no key {key_id!r} in {keys}")
        say(f"revoked {key_id}", "dim")


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to bind (loopback unless you mean it).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.", min=0, max=65535)] = 8765,
    keys: KeysOpt = Path("suffice-keys.json"),
    dev: Annotated[bool, typer.Option("--dev", help=(
        "No API keys, every scope: for a laptop. Binds loopback only."))] = False,
    provider: ProviderOpt = "local",
    model: ModelOpt = None,
    base_url: BaseUrlOpt = None,
    db: DbOpt = None,
) -> None:
    """The REST server (OpenAPI at /docs): add, get, list, search, render, ask, stats, forget."""
    with errors():
        try:
            import uvicorn

            from ._server.rest import create_app, server_settings
        except ImportError as exc:
            from ._errors import MissingExtraError
            raise MissingExtraError("server", exc.name or "fastapi") from None
        from ._access import KeyRing
        settings = server_settings()  # before anything opens: a bad limit is said at once
        if dev and host not in LOOPBACK:
            fail(f"--dev serves without keys and binds loopback only; {host!r} is not loopback")
        ring = None if dev else KeyRing(keys)
        if ring is not None and not ring.keys():
            fail(f"no API keys in {keys}: create one with `suffice keys add --scope SCOPE --keys {keys}`, "
                 "or run with --dev on loopback")
        # The local model loads on the first ask, not at start-up.
        llm = None if provider == "local" and model is None else make_reader(provider, model, base_url)
        mem = open_memory(db, llm=llm)
        warn_installed_parts(mem)
        say(f"suffice serving {mem.path} on http://{host}:{port} "
            f"({'dev mode: no keys' if dev else f'{len(ring.keys()) if ring else 0} key(s) from {keys}'})",
            "dim", to=err)
        try:
            uvicorn.run(create_app(mem, keys=ring, settings=settings), host=host, port=port,
                        log_level="warning")
        finally:
            mem.close()


def warn_installed_parts(mem: Any) -> None:
    """Load the router and tier policy that ``$SUFFICE_ROUTER`` / ``$SUFFICE_TIERS`` name, at a
    server's start: a broken one fails only the calls that use it (auto mode, the tiered
    agent), which a server would otherwise find at its first such request, in a client's
    error. Said on stderr, not refused: every other call works."""
    import os
    import warnings as _warnings

    from ._errors import SufficeError
    from ._route.tiers import TIERS_ENV, default_tiers
    from ._route.trained import ROUTER_ENV
    checks = ((ROUTER_ENV, lambda: mem.router),
              (TIERS_ENV, lambda: default_tiers(None, mem.embedder.name if mem.embedder else "")))
    for env, load in checks:
        if not os.environ.get(env, "").strip():
            continue
        with _warnings.catch_warnings(record=True) as caught:
            _warnings.simplefilter("always")
            try:
                load()
            except SufficeError as exc:
                say(f"warning: {exc}", "yellow", to=err)
        for w in caught:
            say(f"warning: {w.message}", "yellow", to=err)


@app.command("mcp")
def mcp_server(
    transport: Annotated[str, typer.Option(help=(
        "stdio (an MCP client launches the server) or http (streamable HTTP)."))] = "stdio",
    host: Annotated[str, typer.Option(help="With --transport http: the address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help=(
        "With --transport http: the TCP port (0: any free one; the URL is printed on stderr)."),
        min=0, max=65535)] = 8000,
    path: Annotated[str, typer.Option(help="With --transport http: the endpoint's path.")] = "/mcp",
    scopes: Annotated[list[str] | None, typer.Option("--scope", "-s", help=(
        "Bind the server to this scope (repeatable): a name, or a prefix ending in *; one name "
        "is also the default scope of every call. Default: every scope."))] = None,
    keys: Annotated[Path | None, typer.Option("--keys", help=(
        "With --transport http: require an API key of this file (`suffice keys add`) on every "
        "request, each key limited to its scopes; the server may then bind any address."))] = None,
    allow_remote: Annotated[bool, typer.Option("--allow-remote", help=(
        "Let --transport http without --keys bind a non-loopback address (no authentication)."))
    ] = False,
    provider: ProviderOpt = "local",
    model: ModelOpt = None,
    base_url: BaseUrlOpt = None,
    db: DbOpt = None,
) -> None:
    """The MCP server: tools remember, recall, ask, list, forget and fit, over stdio or streamable HTTP."""
    with errors():
        if transport not in ("stdio", "http"):
            fail(f"unknown transport {transport!r}; use stdio or http")
        if provider not in ("local", "http", "openai", "scripted"):
            fail(f"unknown provider {provider!r}; use local, http or scripted")
        from ._server.mcp import LazyModel, build_mcp_server, check_http
        from ._server.mcp import serve as serve_mcp
        ring = None
        if keys is not None:
            if transport != "http":
                fail("--keys needs --transport http: over stdio the client that launches the "
                     "server is the only caller")
            from ._access import KeyRing
            ring = KeyRing(keys)
            if not ring.keys():
                fail(f"no API keys in {keys}: create one with `suffice keys add --scope SCOPE --keys {keys}`")
        if transport == "http":
            check_http(host, path, allow_remote or ring is not None)

        # No model is loaded before the first ask: clients launch the server for every session.
        lazy = (None if provider == "local" and model is None
                else LazyModel(lambda: make_reader(provider, model, base_url)))
        mem = open_memory(db)
        try:
            warn_installed_parts(mem)
            server = build_mcp_server(mem, scopes=scopes, llm=lazy, keys=ring)
            serve_mcp(server, "http" if transport == "http" else "stdio", host=host, port=port, path=path,
                      allow_remote=allow_remote, announce=lambda line: say(line, "dim", to=err))
        finally:
            if lazy is not None:
                lazy.close()
            mem.close()


@bench_app.command("retrieval")
def bench_retrieval(
    dataset: Annotated[str, typer.Option(
        help="Dataset: locomo, beam, ama (AMA-Bench) or hotpotqa.")] = "locomo",
    data: Annotated[Path | None, typer.Option(
        help="Dataset file or folder (default: the shared copy).")] = None,
    json_out: Annotated[Path | None, typer.Option(
        "--json", dir_okay=False, help="Write figures to this file.")] = None,
    db: Annotated[str | None, typer.Option("--db", help="Store to use (default: a temporary one).")] = None,
    folds: Annotated[int, typer.Option(min=0, max=100, help=(
        "LoCoMo: also train the encoder on K-1 folds of conversations and score it on the "
        "held-out fold (rows dense-tuned, fused-tuned); needs the \\[train] extra. 0: off."))] = 0,
    epochs: Annotated[int, typer.Option(min=1, max=50, help="Training epochs per fold.")] = 1,
    keep: Annotated[Path | None, typer.Option(help=(
        "Keep the fold models and stores here; a rerun reuses those trained on the same folds."))] = None,
    rerank: Annotated[bool, typer.Option(help=(
        "With --folds: also train a cross-encoder reranker per fold and report the trained "
        "prefix reordered by it at several depths."))] = False,
    tuned_encoder: Annotated[Path | None, typer.Option(help=(
        "Also rank with this trained encoder (rows dense-tuned, fused-tuned, with paired gains): "
        "how an encoder transfers to a dataset it was not trained on."))] = None,
) -> None:
    """Evidence recall@k and all-evidence-in-B for bm25, dense, fused and recency."""
    with errors():
        import tempfile

        from ._bench import retrieval
        from ._bench.report import envelope, write_json
        if rerank and not folds:
            fail("--rerank needs --folds K: a reranker is only judged on conversations it never saw")
        if folds and dataset != "locomo":
            fail("--folds is implemented for locomo; for other datasets use --tuned-encoder")
        if folds and tuned_encoder:
            fail("--folds trains its own encoders; --tuned-encoder is for a dataset it was not trained on")
        evset = retrieval.load_set(dataset, data)
        if folds and not 2 <= folds <= len(evset.histories):
            fail(f"--folds must be 0 (off) or between 2 and the {len(evset.histories)} conversations, "
                 f"got {folds}")
        tuned_embedder = None
        if tuned_encoder is not None:
            from ._embed.minilm import load_encoder
            tuned_embedder = load_encoder(tuned_encoder)
        with tempfile.TemporaryDirectory() as tmp:
            mem = open_memory(db or str(Path(tmp) / "bench.db"))
            t0 = time.perf_counter()
            n_items = sum(len(items) for _, items in evset.histories)
            with progress_bar("ingesting", n_items) as advance:
                for scope, items in evset.histories:
                    mem.add(items, scope=scope, progress=advance)
            ingest_s = time.perf_counter() - t0
            if folds:
                from ._bench import folds as cv
                from ._train.encoder import TrainConfig
                convs = retrieval.load(data)
                work = keep or Path(tmp)
                work.mkdir(parents=True, exist_ok=True)
                with fold_progress() as report:
                    if rerank:
                        from ._bench import rerank as rr
                        res = rr.run(mem, convs, folds, work, encoder_config=TrainConfig(epochs=epochs),
                                     progress=report)
                    else:
                        res = cv.run(mem, convs, folds, work, config=TrainConfig(epochs=epochs),
                                     progress=report)
            else:
                tuned = None
                if tuned_embedder is not None:
                    tuned = open_memory(str(Path(tmp) / "tuned.db"), embedder=tuned_embedder)
                    with progress_bar("ingesting (trained encoder)", n_items) as advance:
                        for scope, items in evset.histories:
                            tuned.add(items, scope=scope, progress=advance)
                questions = evset.questions(mem)
                with progress_bar("questions", len(questions) * (2 if tuned else 1)) as advance:
                    res = retrieval.run_set(mem, questions, tuned, progress=advance)
                if tuned is not None:
                    res["tuned_encoder"] = tuned_embedder.name if tuned_embedder else None
                    tuned.close()
            mem.close()
        res["ingest_s"] = ingest_s
        say(retrieval.format_results(res))
        if "paired" in res:
            from ._bench.folds import format_gains
            say(format_gains(res, only_overall=rerank))
        if json_out is not None:
            write_json(json_out, envelope("retrieval", dataset, evset.source,
                                          {"store": mem.store_config.model_dump(),
                                           "retrieval": mem.retrieval.model_dump()}, res))
            say(f"wrote {json_out}")


LICENCES = {
    "locomo": "LoCoMo: CC BY-NC 4.0 (non-commercial use only)",
    "beam": "BEAM: no licence stated by its authors (research use; terms unconfirmed)",
    "ama": "AMA-Bench: licence unconfirmed (MIT code; trajectories from benchmarks with their own terms)",
    "hotpotqa-train": "HotpotQA: CC BY-SA 4.0",
    "hotpotqa": "HotpotQA: CC BY-SA 4.0",
}


def training_pairs(datasets: list[str], data: Path | None, exclude: list[str], hard: int,
                   work: Path) -> tuple[list[Any], list[str]]:
    """Pairs mined from each dataset with the default prefix, leaving out ``exclude`` groups;
    returns them and the groups trained on."""
    from ._api import Memory
    from ._bench import retrieval
    from ._train.pairs import mine
    if data is not None and len(datasets) > 1:
        fail("--data names one dataset's file; give one --dataset with it")
    sets = [retrieval.load_set(name, data) for name in datasets]
    known = {scope for evset in sets for scope, _ in evset.histories}
    unknown = sorted(set(exclude) - known)
    if unknown:  # a mistyped acceptance set would otherwise be trained on without a word
        fail(f"--exclude names no history of {', '.join(datasets)}: {', '.join(unknown)}")
    pairs, groups = [], []
    for name, evset in zip(datasets, sets, strict=True):
        histories = [(scope, items) for scope, items in evset.histories if scope not in exclude]
        base = Memory(work / f"{name}.db")
        with progress_bar(f"ingesting {name}", sum(len(items) for _, items in histories)) as advance:
            for scope, items in histories:
                base.add(items, scope=scope, progress=advance)
        questions = [q for q in evset.questions(base) if q.group not in exclude]
        with progress_bar(f"mining hard negatives ({name})", len(questions)) as advance:
            pairs += mine(base, questions, hard=hard, progress=advance)
        groups += sorted({q.group for q in questions})
        base.close()
    if not pairs:
        fail("no annotated questions left to train on")
    return pairs, groups


MODEL_FILES = {"model.onnx", "card.json"}


def model_out(out_dir: Path, kind: str) -> None:
    """Check a training command's ``--out`` before any training: a new or empty folder, or one
    holding a trained ``kind`` (replaced, whole, when the new one is written: see
    :func:`~suffice._files.staged_folder`). A folder with anything else is refused rather than
    emptied an hour later."""
    if out_dir.is_symlink() or (out_dir.exists() and not out_dir.is_dir()):
        fail(f"--out {out_dir} is a file or a link; name a folder (new, empty, or holding a trained {kind})")
    if not out_dir.is_dir():
        return
    if out_dir.is_mount():  # the new folder takes the old one's place by a rename
        fail(f"--out {out_dir} is a mount point; name a folder inside it")
    found = {p.name for p in out_dir.iterdir()}
    if not found:
        return
    try:
        card = json.loads((out_dir / "card.json").read_text(encoding="utf-8"))
        held = (card.get("kind") or "encoder") if isinstance(card, dict) else None
    except (OSError, ValueError):
        held = None
    if held != kind or not found <= MODEL_FILES:
        fail(f"--out {out_dir} holds {', '.join(sorted(found)[:5])}{' ...' if len(found) > 5 else ''}, "
             f"not a trained {kind}: name a new or empty folder (a trained {kind} there is replaced)")
    say(f"{out_dir} holds a trained {kind}: it is replaced when the new one is written", style="yellow")


def training_card(prefix: str, base: str, datasets: list[str], groups: list[str], exclude: list[str] | None,
                  data: Path | None, n_pairs: int, hard: int, report: Any, config: Any) -> dict[str, Any]:
    """What a trained model's card says: its base, data, exclusions, training and licence."""
    return {"name_prefix": f"{prefix}-" + "-".join(datasets), "base": base, "datasets": datasets,
            "trained_on": groups, "excluded": sorted(exclude or []), "data": str(data or "shared copies"),
            "pairs": n_pairs, "hard_negatives": hard, "steps": report.steps,
            "train_s": round(report.seconds, 1),
            "train_config": {f: getattr(config, f) for f in config.__dataclass_fields__},
            "licence": "weights derived from: " + "; ".join(LICENCES[d] for d in datasets)
                       + ". Share and use them only as all of these allow."}


DatasetsOpt = Annotated[list[str] | None, typer.Option("--dataset", help=(
    "Dataset to train on (repeatable): locomo, beam, ama, hotpotqa-train (HotpotQA's train "
    "sample; hotpotqa is its dev set, kept for evaluation)."))]
ExcludeOpt = Annotated[list[str] | None, typer.Option(help=(
    "Conversation or episode (scope) to leave out of training (repeatable). Default: LoCoMo's "
    "conv-26, the acceptance set, when LoCoMo is trained on; 'none' leaves nothing out."))]


def held_back(exclude: list[str] | None, datasets: Sequence[str]) -> list[str]:
    """The histories a training command leaves out: ``--exclude`` as given, ``none`` for none,
    and by default LoCoMo's conv-26, on which every learned part is judged: a part trained on
    it would be judged on what it saw."""
    if exclude is None:
        if "locomo" not in datasets:
            return []
        say("leaving out conv-26, the acceptance conversation (--exclude none keeps it)")
        return ["conv-26"]
    return [] if exclude == ["none"] else exclude


@train_app.command("retriever")
def train_retriever(
    out_dir: Annotated[Path, typer.Option(
        "--out", file_okay=False, help="Folder to write model.onnx and card.json to.")],
    dataset: DatasetsOpt = None,
    data: Annotated[Path | None, typer.Option(help="Dataset file (default: the shared copy).")] = None,
    exclude: ExcludeOpt = None,
    epochs: Annotated[int, typer.Option(min=1, max=50)] = 1,
    hard: Annotated[int, typer.Option(min=0, max=50, help="Hard negatives per question.")] = 4,
) -> None:
    """Fine-tune the dense encoder on datasets' evidence annotations and export it (int8 ONNX).

    Use it with `suffice --encoder DIR ...` or `Memory(embedder=load_encoder(DIR))`; an existing
    store is re-embedded, without re-ingest, by `suffice --encoder DIR --db STORE rebuild`."""
    with errors():
        import tempfile

        from ._files import staged_folder
        from ._train.encoder import TrainConfig, export, steps, train
        model_out(out_dir, "encoder")
        datasets = dataset or ["locomo"]
        exclude = held_back(exclude, datasets)
        config = TrainConfig(epochs=epochs)
        with tempfile.TemporaryDirectory() as tmp:
            pairs, groups = training_pairs(datasets, data, exclude, hard, Path(tmp))
        with progress_bar("training", steps(len(pairs), config)) as advance:
            model, report = train(pairs, config, advance)
        with staged_folder(out_dir) as staging:
            export(model, staging, training_card(
                "minilm", "sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0)", datasets, groups, exclude,
                data, len(pairs), hard, report, config))
        say(f"trained on {len(pairs)} questions in {report.seconds:.0f} s; wrote {out_dir}")


@train_app.command("reranker")
def train_reranker_cmd(
    out_dir: Annotated[Path, typer.Option(
        "--out", file_okay=False, help="Folder to write model.onnx and card.json to.")],
    dataset: DatasetsOpt = None,
    data: Annotated[Path | None, typer.Option(help="Dataset file (default: the shared copy).")] = None,
    exclude: ExcludeOpt = None,
    epochs: Annotated[int, typer.Option(min=1, max=50)] = 1,
    hard: Annotated[int, typer.Option(min=1, max=50, help="Hard negatives per question.")] = 7,
) -> None:
    """Train the cross-encoder reranker (MiniLM with a score head) on datasets' evidence
    annotations and export it (int8 ONNX); use it with `suffice --reranker DIR ...` or
    `Memory(reranker=load_reranker(DIR))`.

    Measure before you use it: trained on LoCoMo's ~1,000 questions it ordered the trained
    prefix's candidates worse than the prefix did (docs/benchmarks.md section 6)."""
    with errors():
        import tempfile

        from ._files import staged_folder
        from ._train.encoder import steps
        from ._train.reranker import RerankConfig, export_reranker, train_reranker
        model_out(out_dir, "reranker")
        datasets = dataset or ["locomo"]
        exclude = held_back(exclude, datasets)
        config = RerankConfig(epochs=epochs)
        with tempfile.TemporaryDirectory() as tmp:
            pairs, groups = training_pairs(datasets, data, exclude, hard, Path(tmp))
        pairs = [p for p in pairs if p.negatives]
        with progress_bar("training", steps(len(pairs), config)) as advance:
            model, report = train_reranker(pairs, config, advance)
        with staged_folder(out_dir) as staging:
            export_reranker(model, staging, training_card(
                "minilm-rerank", "sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0) with a new score head",
                datasets, groups, exclude, data, len(pairs), hard, report, config))
        say(f"trained on {len(pairs)} questions in {report.seconds:.0f} s; wrote {out_dir}")


@train_app.command("router")
def train_router_cmd(
    out_dir: Annotated[Path, typer.Option(
        "--out", file_okay=False, help="Folder to write model.onnx and card.json to.")],
    dataset: DatasetsOpt = None,
    data: Annotated[Path | None, typer.Option(help="Dataset file (default: the shared copy).")] = None,
    exclude: ExcludeOpt = None,
    folds: Annotated[int, typer.Option(min=0, max=50, help=(
        "Also cross-validate by conversation with this many folds (0: no) and put the "
        "figures in the card."))] = 0,
    beta: Annotated[float, typer.Option(min=0.0, max=10.0, help=(
        "Weight of the rationale distillation term (0: the ablation without it)."))] = 0.5,
    epochs: Annotated[int, typer.Option(min=1, max=500)] = 24,
    precision: Annotated[float | None, typer.Option(min=0.0, max=1.0, help=(
        "tau: the smallest threshold whose early stops meet --calibrate-on's test (lose nothing "
        "to width, or hold all gold evidence) this often on the validation conversations "
        "[default: 0.9; not with --stop-rate]."))] = None,
    stop_rate: Annotated[float | None, typer.Option(min=0.01, max=1.0, help=(
        "tau instead: the largest threshold at which at least this share of validation "
        "contexts stop early (a time budget, for auto with stop_reader='deep')."))] = None,
    val_histories: Annotated[int | None, typer.Option(min=1, max=1000, help=(
        "Histories (conversations, episodes) held out of training to choose the checkpoint and "
        "tau on, spread over the sorted names (default: a seventh of them, at least one); more "
        "give a steadier tau."))] = None,
    budget: Annotated[int, typer.Option(help="The reader's context budget the router judges.")] = 1000,
    target: Annotated[Literal["evidence", "width"], typer.Option(help=(
        "What the router predicts. evidence: the context holds all the gold evidence (the "
        "interventions apply). width: reading twice as wide would show no more of it, so a stop "
        "answered by the deep model loses nothing (natural contexts only)."))] = "evidence",
    calibrate_on: Annotated[Literal["width", "label"], typer.Option(help=(
        "What --precision is measured against when tau is set: width (the render at twice the "
        "budget shows no more evidence: all that an early stop gives up when the deep model "
        "answers it, the engine's default) or label (what the router learns)."))] = "width",
    work: Annotated[Path | None, typer.Option(help=(
        "Folder for the dataset stores (kept and reused by later runs; default: a temporary one)."))] = None,
    verify_model: Annotated[str | None, typer.Option(help=(
        "Drop intervened negatives this local model still answers correctly (slow: one call each)."))] = None,
    rationale_model: Annotated[str | None, typer.Option(help=(
        "Have this local model write the rationales (one call per example) instead of building "
        "them from the annotations."))] = None,
    threads: Annotated[int, typer.Option(min=1, max=64, help=(
        "torch threads (1 when the machine is busy: 2 contending threads are far slower)."))] = 2,
    json_out: Annotated[Path | None, typer.Option(
        "--json", dir_okay=False, help="Write the training report here.")] = None,
) -> None:
    """Train the sufficiency router on evidence-annotated datasets and export it (ONNX + card).

    LoCoMo's conv-26, the acceptance conversation, is left out by default (--exclude none
    keeps every history).

    Natural contexts (the engine's own renders and hits) and interventions on the ranking
    (gold taken out, in part or whole; gold moved to the top) are labelled by whether every
    piece of gold evidence is shown. Use the result with `Memory(router=TrainedRouter(DIR))`,
    `suffice ask --mode auto --router DIR`, or by default through $SUFFICE_ROUTER=DIR."""
    with errors():
        import tempfile

        from ._files import staged_folder
        from ._train import router as rt
        from ._train import sufficiency_data as sd
        model_out(out_dir, "router")
        datasets = dataset or ["locomo"]
        if precision is not None and stop_rate is not None:
            fail("--precision and --stop-rate are two ways to set tau: give one")
        exclude = held_back(exclude, datasets)
        cfg = rt.RouterTrainConfig(epochs=epochs, beta=beta, stop_rate=stop_rate,
                                   precision=0.9 if precision is None else precision,
                                   eval_budget=budget, threads=threads, calibrate_on=calibrate_on)
        budgets = {budget // 2, budget, 2 * budget} | ({4 * budget} if target == "width" else set())
        dcfg = sd.DataConfig(fast_budget=budget, budgets=tuple(sorted(budgets)),
                             interventions=target == "evidence")
        t0 = time.perf_counter()
        with fold_progress() as report, tempfile.TemporaryDirectory() as tmp:
            encoder = configured_embedder()
            from ._bench import retrieval
            sets = [retrieval.load_set(name, data) for name in datasets]
            examples = sd.from_datasets(sets, exclude or [], work or Path(tmp), dcfg, report, encoder)
            if verify_model or rationale_model:
                from ._llm import make_llm
            if verify_model:
                from ._bench.metrics import token_f1
                examples, dropped = sd.verify(examples, make_llm("local", model_path=verify_model), token_f1,
                                              progress=lambda done, total: report("verify", done, total))
                say(f"verification dropped {dropped} negative(s) the model still answered")
            if rationale_model:
                examples = sd.llm_rationales(examples, make_llm("local", model_path=rationale_model),
                                             progress=lambda done, total: report("rationales", done, total))
            if target == "width":
                examples = sd.width_examples(examples)
            built_s = time.perf_counter() - t0
            summary = sd.summary(examples)
            cv = (rt.cross_validate(examples, folds, cfg, n_val=val_histories, progress=report)
                  if folds else None)
            train_groups, val_groups = rt.split_groups([e.group for e in examples], n_val=val_histories)
            tr = [e for e in examples if e.group in set(train_groups)]
            va = [e for e in examples if e.group in set(val_groups)]
            net, rep = rt.train(tr, va, cfg, report)
        if not va:
            say("warning: one history only, so none is held out for validation: the checkpoint is the "
                f"last epoch and tau is the default {rep.tau}, not calibrated (train on two or more)")
        card = {"encoder": getattr(encoder, "name", "") or _default_encoder_name(),
                "tau_calibrated": bool(va), "datasets": datasets, "excluded": sorted(exclude or []),
                "trained_on": train_groups,
                "validation": val_groups, "budget": budget, "k": dcfg.prefix_k, "target": target,
                "data": summary,
                "train_config": {f: getattr(cfg, f) for f in cfg.__dataclass_fields__},
                "report": rep.summary(), "history": rep.history, "cross_validation": cv,
                "tau": rep.tau, "build_s": round(built_s, 1), "total_s": round(time.perf_counter() - t0, 1),
                "rationales": rationale_model or "from the annotations",
                "licence": "weights derived from: " + "; ".join(LICENCES[d] for d in datasets)
                           + ". Share and use them only as all of these allow."}
        with staged_folder(out_dir) as staging:
            rt.export_router(net, staging, card)
            # tau from the exported (int8) model's scores, the ones the runtime compares with it
            card = rt.recalibrate_exported(staging, va, cfg)
        say(f"trained on {len(tr)} contexts of {len(train_groups)} histories in {rep.seconds:.0f} s "
            f"(data {built_s:.0f} s); validation AUC "
            f"{rep.val_auc if rep.val_auc is not None else float('nan'):.3f}, "
            f"tau {card['tau']:.3f} (fp32 network: {rep.tau:.3f}); wrote {out_dir}")
        if cv is not None:
            say(f"cross-validated ({folds} folds by history): mean AUC {cv['mean_auc']:.3f}, "
                f"pooled {cv['pooled_auc']:.3f}")
        if json_out is not None:
            from ._bench.report import envelope, write_json
            write_json(json_out, envelope("train_router", "+".join(datasets), str(data or "shared copies"),
                                          card["train_config"], card))


LLMCacheOpt = Annotated[Path | None, typer.Option(help="Model-call cache (replays keep tokens and time).")]
ModuleCacheOpt = Annotated[Path | None, typer.Option(help="Tier-pipeline module-output cache.")]


def _tier_setup(store: Path, data: Path | None, provider: str, model: str | None, base_url: str | None,
                llm_cache: Path | None, module_cache: Path | None, limit: int | None) -> tuple[Any, ...]:
    """LoCoMo in a store, the reader (cached), and a pipeline sharing one module cache."""
    from ._pipeline import ModuleCache, TieredPipeline
    convs, items, mem = locomo_run(data, limit, store)
    llm = cached_reader(provider, model, base_url, llm_cache)
    cache = ModuleCache(module_cache)
    mem.tier_cache = cache
    return convs, items, mem, llm, TieredPipeline(llm, mem.embedder, mem.tier_settings, cache)


def _hotpot_setup(store: Path, data: Path | None, provider: str, model: str | None, base_url: str | None,
                  llm_cache: Path | None, module_cache: Path | None, limit: int | None) -> tuple[Any, ...]:
    """HotpotQA dev items as histories of sentences in a store, as QA items scored by token F1."""
    from ._bench import retrieval
    from ._bench.qa import QAItem
    from ._datasets.locomo import LocomoQuestion
    from ._pipeline import ModuleCache
    ev = retrieval.load_set("hotpotqa", data)
    histories = ev.histories[:limit] if limit else ev.histories
    mem = open_memory(str(store))
    with progress_bar("ingesting", len(histories)) as advance:
        for scope, rows in histories:
            if not mem._store.has_scope(scope):
                mem.add(rows, scope=scope)
            elif [it.text for it in mem.items(scope=scope)] != [r.text for r in rows]:
                # HotpotQA's sentences carry no ids to match them by: compare the texts
                fail(f"{store}: scope {scope!r} holds other text than the HotpotQA item of that name; "
                     "this store was not made from this data: name another --store")
            advance(1)
    wanted = {scope for scope, _ in histories}
    # category 2: the LoCoMo scorer's plain token F1
    items = [QAItem(f"{q.scope}:{q.index}", q.scope, q.index, LocomoQuestion(q.query, q.answer, 2, ()))
             for q in ev.questions(mem) if q.scope in wanted]
    llm = cached_reader(provider, model, base_url, llm_cache)
    mem.tier_cache = ModuleCache(module_cache)
    return items, mem, llm


def _staged(report: Callable[[str, int, int], None], label: str) -> Callable[[str, int, int], None]:
    return lambda stage, done, total: report(f"{label} {stage}", done, total)


def _floats(text: str, what: str) -> list[float]:
    """Comma-separated cost weights: at least one, each a finite number, none negative (a
    negative weight would pay the policy for spending)."""
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or not all(math.isfinite(v) and v >= 0 for v in values):
        fail(f"{what} must be numbers of 0 or more separated by commas, got {text!r}")
    return values


@train_app.command("tiers")
def train_tiers_cmd(
    out_dir: Annotated[Path, typer.Option(
        "--out", file_okay=False, help="Folder for the policies (tiers-<lam>.npz, .json).")],
    lambdas: Annotated[str, typer.Option(help="Cost weights to train one policy each for.")] = "0,0.3,0.9",
    data: Annotated[Path | None, typer.Option(help="LoCoMo file (default: the shared copy).")] = None,
    exclude: ExcludeOpt = None,
    val_conv: Annotated[str, typer.Option(help="The conversation the checkpoint is chosen on.")] = "conv-48",
    per_conv: Annotated[int, typer.Option(min=1, max=10_000, help=(
        "Questions per training conversation (a seeded shuffle of categories 1-4)."))] = 6,
    val_questions: Annotated[int, typer.Option(min=1, max=10_000, help=(
        "Questions of --val-conv the checkpoint is chosen on (the same shuffle; the first "
        "--per-conv of them are the ones a smaller setting picks). Few questions cannot tell a "
        "mix of tiers from the fixed pipelines it lies between."))] = 30,
    epochs: Annotated[int, typer.Option(min=1, max=500)] = 6,
    batch: Annotated[int, typer.Option(min=2, max=4096)] = 16,
    align: Annotated[bool, typer.Option("--align/--no-align", help=(
        "Scale alignment of the task reward (--no-align: the ablation)."))] = True,
    reward: Annotated[Literal["recall", "reader"], typer.Option(help=(
        "Task reward: 'recall' (gold answer words in the summary; no answer call) or 'reader' "
        "(token F1 of the reader's answer)."))] = "recall",
    tier_cap: Annotated[Literal["low", "mid", "high"], typer.Option(help=(
        "The highest tier the policies may choose. 'mid' keeps every LLM module out of training "
        "(and out of the policy), so many more questions can be trained on in the same time."))] = "high",
    provider: ProviderOpt = "local",
    model: ModelOpt = None,
    base_url: BaseUrlOpt = None,
    store: Annotated[Path, typer.Option(help="Store LoCoMo is ingested into.")] = Path("runs/locomo_all.db"),
    llm_cache: LLMCacheOpt = Path("runs/llm_cache_tiers.db"),
    module_cache: ModuleCacheOpt = Path("runs/tier_modules.db"),
    threads: Annotated[int, typer.Option(min=1, max=64, help="torch threads.")] = 1,
    warm: Annotated[bool, typer.Option("--warm/--no-warm", help=(
        "First run every tier combination that matters once per question, so training itself "
        "makes no new module call."))] = True,
    json_out: Annotated[Path | None, typer.Option(
        "--json", dir_okay=False, help="Write the training report here.")] = None,
) -> None:
    """Train tier policies with PPO (one per cost weight) on LoCoMo conversations.

    Conversations in --exclude (default conv-26, the acceptance set) are never read; the
    checkpoint is the epoch whose greedy policy scores best on --val-conv, every epoch scored
    under the final reward state; of epochs that score the same, the cheaper."""
    with errors():
        import random

        import torch

        from ._bench.metrics import answer_recall, token_f1
        from ._prompts import answer_messages, choose_style
        from ._train import tiers as tt
        torch.set_num_threads(threads)
        lams = _floats(lambdas, "--lambdas")
        convs, items, mem, llm, pipeline = _tier_setup(store, data, provider, model, base_url,
                                                       llm_cache, module_cache, None)
        skip = set(held_back(exclude, ["locomo"]))
        names = {c.scope: c.sample_id for c in convs}
        unknown = skip - set(names.values())
        if unknown:
            fail(f"--exclude names no LoCoMo conversation: {', '.join(sorted(unknown))}")
        if val_conv not in names.values() or val_conv in skip:
            fail(f"--val-conv {val_conv!r} is not a LoCoMo conversation outside --exclude")
        by_conv: dict[str, list[Any]] = {}
        for it in items:
            if names[it.scope] not in skip:
                by_conv.setdefault(names[it.scope], []).append(it)
        rng = random.Random(42)
        picked = []
        for conv in sorted(by_conv):
            qs = list(by_conv[conv])
            rng.shuffle(qs)
            picked += qs[:val_questions if conv == val_conv else per_conv]
        t0 = time.perf_counter()
        questions = []
        from ._pipeline import chunks_for
        for it in picked:
            ranking = mem._retriever.rank(it.scope, it.q.question, mem.retrieval, depth=100)
            chunks = chunks_for(ranking, mem._store, it.scope, pipeline.settings)
            questions.append(tt.TierQuestion(it.key, names[it.scope], it.q.question, it.q.answer,
                                             tuple(chunks), ranking.qvec))
        train = [q for q in questions if q.group != val_conv]
        val = [q for q in questions if q.group == val_conv]

        def reader_f1(q: Any, res: Any) -> float:
            reply = llm.chat(answer_messages(q.question, res.text, choose_style(q.question)),
                             max_tokens=48, stage="answer").text
            return float(token_f1(reply, q.answer))

        def recall(q: Any, res: Any) -> float:
            return answer_recall(res.text, q.answer)

        reports = []
        with fold_progress() as report:
            if warm:
                t_warm = time.perf_counter()
                tt.warm_cache(pipeline, train + val, cap=tier_cap, progress=report)
                say(f"warmed the module cache in {time.perf_counter() - t_warm:.0f} s")
            for lam in lams:
                cfg = tt.PPOConfig(lam=lam, epochs=epochs, batch=batch, align=align, cap=tier_cap)
                # An ablation is named apart, so a folder of policies never serves one by default.
                name = f"tiers-{lam:g}" if align else f"noalign-{lam:g}"
                rep = tt.train_tiers(pipeline, mem.embedder, train, val, cfg, out_dir / f"{name}.npz",
                                     score=reader_f1 if reward == "reader" else recall,
                                     progress=_staged(report, f"lam={lam:g}"))
                say(f"lam={lam:g}: best epoch {rep['best_epoch']}, validation task {rep['val']['task']:.3f}, "
                    f"cost ${rep['val']['cost_usd']:.2e}, {rep['train_s']:.0f} s; module cache "
                    f"{rep['cache_hits']} hits / {rep['cache_misses']} misses")
                reports.append(rep)
        if reports:
            for name, v in reports[-1]["fixed_val"].items():
                say(f"{name} on the validation questions: task {v['task']:.3f}, cost ${v['cost_usd']:.2e}")
        if json_out is not None:
            from ._bench.report import envelope, write_json
            write_json(json_out, envelope("train_tiers", "locomo", str(data or "shared copy"),
                                          {"lambdas": lams, "per_conv": per_conv, "epochs": epochs,
                                           "batch": batch, "align": align, "reward": reward,
                                           "tier_cap": tier_cap,
                                           "train_questions": len(train), "val_questions": len(val),
                                           "val_conv": val_conv, "excluded": sorted(skip),
                                           "wall_s": time.perf_counter() - t0},
                                          {"runs": [{**r, "history": [h for h in r["history"]
                                                                       if "val" in h or h["batch"] == 0]}
                                                    for r in reports]}))


def _default_encoder_name() -> str:
    from ._embed.minilm import MiniLMEmbedder
    return MiniLMEmbedder().name


def main() -> None:
    try:
        app()
    except BrokenPipeError:
        sys.exit(0)


if __name__ == "__main__":
    main()
