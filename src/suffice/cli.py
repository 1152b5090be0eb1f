"""The ``suffice`` command: a thin layer over :class:`suffice.Memory`.

Every command opens the store at ``--db`` (or ``$SUFFICE_DB``), calls the library and prints.
Errors print one line naming what is wrong and exit with status 2; nothing is half-written.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .errors import InvalidItemError, SufficeError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Long-term memory for LLM agents: write once, spend per query only what it needs.")
import_app = typer.Typer(no_args_is_help=True, help="Import a dataset file into the store.")
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks on real data; --json FILE writes the figures.")
app.add_typer(import_app, name="import")
app.add_typer(bench_app, name="bench")

out = Console()
err = Console(stderr=True)

DbOpt = Annotated[str | None, typer.Option("--db", envvar="SUFFICE_DB",  # noqa: UP007
                                              help="Store path (default ./suffice.db).")]
ScopeOpt = Annotated[str, typer.Option("--scope", "-s", help="Scope (hard partition) to use.")]


def fail(message: str) -> None:
    err.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


@contextmanager
def errors() -> Iterator[None]:
    try:
        yield
    except SufficeError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        fail("interrupted")


@contextmanager
def progress_bar(label: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr for long work; advances by the count given."""
    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True, disable=not err.is_terminal) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


_state: dict[str, str | None] = {"db": None}


@app.callback()
def _root(db: DbOpt = None) -> None:
    """Options given before the command apply to every command."""
    _state["db"] = db


def open_memory(db: str | None, **kw: Any) -> Any:
    from .api import Memory, default_db_path
    return Memory(db or _state["db"] or default_db_path(), **kw)


@app.command()
def add(
    text: Annotated[list[str] | None, typer.Argument(help="Text of one item each.")] = None,  # noqa: UP007
    file: Annotated[Path | None, typer.Option("--file", "-f", help="JSONL file, one item per line.")] = None,  # noqa: UP007
    scope: ScopeOpt = "default",
    session: Annotated[str, typer.Option(help="Session the items belong to.")] = "",
    speaker: Annotated[str, typer.Option(help="Who said it.")] = "",
    observed_at: Annotated[str, typer.Option("--at", help="When it happened.")] = "",
    item_id: Annotated[str | None, typer.Option("--id", help="Client id (idempotent adds).")] = None,  # noqa: UP007
    db: DbOpt = None,
) -> None:
    """Store items verbatim."""
    with errors():
        records: list[Any] = []
        if file is not None:
            if not file.exists():
                fail(f"file not found: {file}")
            for n, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    fail(f"{file}:{n}: not valid JSON ({exc.msg})")
                if not isinstance(rec, dict):
                    fail(f"{file}:{n}: expected a JSON object per line")
                records.append(rec)
        for t in text or []:
            records.append({"text": t, **({"id": item_id} if item_id else {})})
        if not records:
            raise InvalidItemError("nothing to add: give TEXT or --file")
        mem = open_memory(db)
        with progress_bar("adding", len(records)) as advance:
            stored = mem.add(records, scope=scope, session=session, speaker=speaker,
                             observed_at=observed_at, progress=advance)
        out.print(f"stored {len(stored)} item(s) in scope {scope!r} of {mem.path}")


@import_app.command("locomo")
def import_locomo(
    file: Annotated[Path | None, typer.Argument(help="LoCoMo JSON (default: the shared copy).")] = None,  # noqa: UP007
    db: DbOpt = None,
) -> None:
    """Import a LoCoMo file: one scope per conversation, one item per turn."""
    with errors():
        from .datasets.locomo import load_locomo
        convs = load_locomo(file)
        total = sum(len(c.items) for c in convs)
        mem = open_memory(db)
        t0 = time.perf_counter()
        with progress_bar("importing", total) as advance:
            counts = {}
            for conv in convs:
                counts[conv.scope] = len(mem.add(list(conv.items), scope=conv.scope, progress=advance))
        dt = time.perf_counter() - t0
        out.print(f"imported {sum(counts.values())} items in {len(counts)} scopes "
                  f"({dt:.1f} s, {sum(counts.values()) / max(dt, 1e-9):.0f} items/s) into {mem.path}")


@app.command()
def search(
    query: Annotated[str, typer.Argument(help="What to look for.")],
    scope: ScopeOpt = "default",
    k: Annotated[int, typer.Option("-k", help="Number of hits.")] = 10,
    method: Annotated[str, typer.Option(help="fused, bm25, dense or recency.")] = "fused",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    db: DbOpt = None,
) -> None:
    """Run the shared retrieval prefix and print the evidence in time order."""
    with errors():
        if method not in ("fused", "bm25", "dense", "recency"):
            fail(f"unknown method {method!r}; use fused, bm25, dense or recency")
        mem = open_memory(db)
        ev = mem.search(query, scope=scope, k=k, method=method)
        if as_json:
            from dataclasses import asdict
            out.print_json(data={"hits": [asdict(h) for h in ev.hits], "context": ev.text,
                                 "timings_ms": ev.timings_ms})
            return
        rank = {h.seq: h.rank for h in ev.hits}
        for it in ev.items:
            out.print(f"[dim]#{rank[it.seq] + 1:>2} seq {it.seq}[/dim] {it.render()}", highlight=False)
        t = ev.timings_ms
        out.print(f"[dim]{len(ev.hits)} hits in {t['total_ms']:.1f} ms "
                  f"({', '.join(f'{k[:-3]} {v:.1f}' for k, v in t.items() if k != 'total_ms')})[/dim]")


@app.command()
def stats(scope: Annotated[str | None, typer.Option("--scope", "-s")] = None,  # noqa: UP007
          db: DbOpt = None) -> None:
    """Counts of the store (or of one scope)."""
    with errors():
        mem = open_memory(db, embedder=None)
        s = mem.stats(scope)
        for key, value in s.__dict__.items() if hasattr(s, "__dict__") else (
                (f, getattr(s, f)) for f in s.__slots__):
            out.print(f"{key:>15}: {value}")


@bench_app.command("retrieval")
def bench_retrieval(
    dataset: Annotated[str, typer.Option(help="Dataset name (locomo).")] = "locomo",
    data: Annotated[Path | None, typer.Option(help="Dataset file (default: the shared copy).")] = None,  # noqa: UP007
    json_out: Annotated[Path | None, typer.Option("--json", help="Write figures to this file.")] = None,  # noqa: UP007
    db: Annotated[str | None, typer.Option("--db", help="Store to use (default: a temporary one).")] = None,  # noqa: UP007
) -> None:
    """Evidence recall@k and all-evidence-in-B for bm25, dense, fused and recency."""
    with errors():
        if dataset != "locomo":
            fail(f"unknown dataset {dataset!r}; bench retrieval supports: locomo")
        import tempfile

        from .bench import retrieval
        from .bench.report import envelope, write_json
        convs = retrieval.load(data)
        with tempfile.TemporaryDirectory() as tmp:
            mem = open_memory(db or str(Path(tmp) / "bench.db"))
            t0 = time.perf_counter()
            with progress_bar("ingesting", sum(len(c.items) for c in convs)) as advance:
                for conv in convs:
                    mem.add(list(conv.items), scope=conv.scope, progress=advance)
            ingest_s = time.perf_counter() - t0
            with progress_bar("questions", retrieval.count_questions(convs)) as advance:
                res = retrieval.run(mem, convs, progress=advance)
            mem.close()
        res["ingest_s"] = ingest_s
        out.print(retrieval.format_results(res))
        if json_out is not None:
            from .datasets.locomo import default_path
            write_json(json_out, envelope("retrieval", dataset, str(data or default_path()),
                                          mem.settings, res))
            out.print(f"wrote {json_out}")


def main() -> None:
    try:
        app()
    except BrokenPipeError:
        sys.exit(0)


if __name__ == "__main__":
    main()
