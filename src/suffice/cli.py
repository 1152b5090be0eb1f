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

DbOpt = Annotated[str | None, typer.Option("--db", envvar="SUFFICE_DB",
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
    text: Annotated[list[str] | None, typer.Argument(help="Text of one item each.")] = None,
    file: Annotated[Path | None, typer.Option("--file", "-f", help="JSONL file, one item per line.")] = None,
    scope: ScopeOpt = "default",
    session: Annotated[str, typer.Option(help="Session the items belong to.")] = "",
    speaker: Annotated[str, typer.Option(help="Who said it.")] = "",
    observed_at: Annotated[str, typer.Option("--at", help="When it happened.")] = "",
    item_id: Annotated[str | None, typer.Option("--id", help="Client id (idempotent adds).")] = None,
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
    file: Annotated[Path | None, typer.Argument(help="LoCoMo JSON (default: the shared copy).")] = None,
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
            counts = mem.import_locomo(convs, progress=advance)
        dt = time.perf_counter() - t0
        added = sum(counts.values())
        out.print(f"imported {added} new items ({total - added} already stored) in {len(counts)} "
                  f"scopes ({dt:.1f} s, {total / max(dt, 1e-9):.0f} items/s) into {mem.path}")


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
def stats(scope: Annotated[str | None, typer.Option("--scope", "-s")] = None,
          db: DbOpt = None) -> None:
    """Counts of the store (or of one scope)."""
    with errors():
        mem = open_memory(db, embedder=None)
        s = mem.stats(scope)
        for key, value in s.__dict__.items() if hasattr(s, "__dict__") else (
                (f, getattr(s, f)) for f in s.__slots__):
            out.print(f"{key:>15}: {value}")


@app.command()
def render(
    query: Annotated[str, typer.Argument(help="What the memory is rendered for.")],
    scope: ScopeOpt = "default",
    budget: Annotated[int, typer.Option("--budget", "-b", help="Token budget B (o200k).")] = 2000,
    mode: Annotated[str | None, typer.Option(
        help="unit, piece, unit+piece or timeline (default: the settings' render_mode).")] = None,
    agent: Annotated[bool, typer.Option("--agent", help="Agent mode: keep a recent window.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    db: DbOpt = None,
) -> None:
    """Render a budgeted memory (timeline + detail) and print it with its token accounting."""
    with errors():
        if mode is not None and mode not in ("unit", "piece", "unit+piece", "timeline"):
            fail(f"unknown mode {mode!r}; use unit, piece, unit+piece or timeline")
        mem = open_memory(db)
        ctx = mem.render(query, budget, scope=scope, mode=mode, agent=agent)
        if as_json:
            from dataclasses import asdict
            out.print_json(data=asdict(ctx))
            return
        out.print(ctx.text, highlight=False, markup=False)
        out.print(f"[dim]--- {ctx.tokens} tokens of cap {ctx.cap} (budget {ctx.budget}), "
                  f"mode {ctx.mode}, {len(ctx.parts)} parts[/dim]")
        for p in ctx.parts:
            out.print(f"[dim]  {p.kind:<8} unit {p.unit if p.unit is not None else '-':>4} "
                      f"{p.tokens:>5} tok  {p.reason}[/dim]", highlight=False)
        if ctx.notice:
            out.print(f"[yellow]{ctx.notice}[/yellow]")


@bench_app.command("render")
def bench_render(
    dataset: Annotated[str, typer.Option(help="locomo or beam.")] = "locomo",
    data: Annotated[Path | None, typer.Option(help="Dataset file or folder (default: shared copy).")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write figures to this file.")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write the PNG plot here.")] = None,
    limit: Annotated[int | None, typer.Option(help="Use only the first N conversations.")] = None,
) -> None:
    """Share of questions with full gold evidence in the rendered context, per method and B."""
    with errors():
        from .bench import render as render_bench
        out.print(render_bench.main(dataset=dataset, data=data, json_out=json_out, plot=plot,
                                    limit=limit), highlight=False, markup=False)


def make_reader(provider: str, model: str | None, base_url: str | None) -> Any:
    from .llm import make_llm
    if provider == "local":
        return make_llm("local", **({"model_path": model} if model else {}))
    if provider in ("http", "openai"):
        return make_llm("http", base_url=base_url, model=model)
    fail(f"unknown provider {provider!r}; use local or http")


ProviderOpt = Annotated[str, typer.Option(
    help="local (llama.cpp, shipped model) or http (OpenAI-compatible).")]
ModelOpt = Annotated[str | None, typer.Option(help="Model name, or a GGUF path for local.")]
BaseUrlOpt = Annotated[str | None, typer.Option(help="Base URL for --provider http.")]


def locomo_run(data: Path | None, limit: int | None, store: Path) -> tuple[Any, Any, Any]:
    """Load LoCoMo, pick the first ``limit`` questions, and make sure their scopes are stored."""
    from .bench import qa
    from .datasets.locomo import load_locomo
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
    limit: Annotated[int | None, typer.Option(help="First N questions of categories 1-4.")] = 100,
    variants: Annotated[str, typer.Option(
        help="Comma list of fast, render, recency, no-memory.")] = "fast,recency,no-memory",
    budget: Annotated[int, typer.Option(help="Reader context budget in tokens.")] = 1000,
    provider: ProviderOpt = "local",
    model: ModelOpt = None,
    base_url: BaseUrlOpt = None,
    use_judge: Annotated[bool, typer.Option("--judge/--no-judge",
                                            help="Score with the LLM judge too.")] = True,
    out_path: Annotated[Path, typer.Option("--out", help="Per-question JSONL (resumable).")
                        ] = Path("runs/qa_locomo.jsonl"),
    store: Annotated[Path, typer.Option("--store", help="Store the dataset is ingested into.")
                     ] = Path("runs/locomo.db"),
    json_out: Annotated[Path | None, typer.Option("--json", help="Write figures to this file.")] = None,
) -> None:
    """Answer questions from memory and report F1, judge, tokens, cost and latency per category."""
    with errors():
        if dataset != "locomo":
            fail(f"unknown dataset {dataset!r}; bench qa supports: locomo")
        from .bench import qa
        from .bench.report import envelope, write_json
        from .datasets.locomo import default_path
        wanted = [v.strip() for v in variants.split(",") if v.strip()]
        bad = [v for v in wanted if v not in qa.VARIANTS]
        if bad:
            fail(f"unknown variant(s) {', '.join(bad)}; use {', '.join(qa.VARIANTS)}")
        convs, items, mem = locomo_run(data, limit, store)
        llm = make_reader(provider, model, base_url)
        with progress_bar("questions", len(items)) as advance:
            qa.run(mem, llm, items, wanted, budget, out_path, judge_llm=llm if use_judge else None,
                   progress=advance)
        summary = qa.summarize(out_path, {i.key for i in items})
        out.print(qa.format_summary(summary), highlight=False, markup=False)
        if json_out is not None:
            write_json(json_out, envelope("qa", dataset, str(data or default_path()),
                                          {"budget": budget, "limit": limit, "variants": wanted,
                                           "reader": llm.model, "judge": llm.model if use_judge else None},
                                          summary))
            out.print(f"wrote {json_out}")


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
        from .bench.judge import judge_file
        if model is None and provider == "local":
            model = "qwen2.5-1.5b"
        llm = make_reader(provider, model, base_url)
        n = sum(1 for line in results.read_text(encoding="utf-8").splitlines() if line.strip())
        with progress_bar("judging", n) as advance:
            counts = judge_file(results, llm, progress=advance)
        out.print(f"{results}: judged {counts['judged']:.0f} answers with {llm.model} "
                  f"({counts['failed']:.0f} failed, {counts['skipped']:.0f} already judged); "
                  f"mean judge score {counts['mean_judge']:.1f}")


@bench_app.command("progressive")
def bench_progressive(
    dataset: Annotated[str, typer.Option(help="Dataset name (locomo).")] = "locomo",
    data: Annotated[Path | None, typer.Option(help="Dataset file (default: the shared copy).")] = None,
    limit: Annotated[int | None, typer.Option(help="First N questions of categories 1-4.")] = 150,
    taus: Annotated[str, typer.Option(help="Comma list of router thresholds.")] = "0.1,0.3,0.5,0.7,0.9",
    budget: Annotated[int, typer.Option(help="Reader context budget in tokens.")] = 1000,
    provider: ProviderOpt = "local",
    model: ModelOpt = None,
    base_url: BaseUrlOpt = None,
    use_judge: Annotated[bool, typer.Option("--judge/--no-judge",
                                            help="Score with the LLM judge too.")] = False,
    out_path: Annotated[Path, typer.Option("--out", help="Per-question JSONL (resumable).")
                        ] = Path("runs/progressive_locomo.jsonl"),
    store: Annotated[Path, typer.Option("--store", help="Store the dataset is ingested into.")
                     ] = Path("runs/locomo.db"),
    plot: Annotated[Path | None, typer.Option(help="Quality-vs-latency PNG.")
                    ] = Path("docs/progressive_locomo.png"),
    json_out: Annotated[Path | None, typer.Option("--json", help="Write figures to this file.")] = None,
    verify: Annotated[int, typer.Option(
        help="Also run auto for real on N recorded questions and check it matches the table.")] = 0,
    verify_tau: Annotated[float, typer.Option(help="Threshold for --verify (signals router).")] = 0.7,
) -> None:
    """Fast, deep and auto(tau): F1, early-termination rate, T_mem, T_e2e, tokens, cost, router AUC."""
    with errors():
        if dataset != "locomo":
            fail(f"unknown dataset {dataset!r}; bench progressive supports: locomo")
        try:
            tau_list = [float(t) for t in taus.split(",") if t.strip()]
        except ValueError:
            fail(f"--taus must be numbers separated by commas, got {taus!r}")
        from .bench import progressive, qa
        from .bench.report import envelope, write_json
        from .datasets.locomo import default_path
        convs, items, mem = locomo_run(data, limit, store)
        gold = qa.gold_finder(mem, {i.scope for i in items})
        llm = make_reader(provider, model, base_url)
        with progress_bar("questions", len(items)) as advance:
            progressive.run(mem, llm, items, out_path, budget=budget, gold_seqs=gold,
                            judge_llm=llm if use_judge else None, progress=advance)
        summary = progressive.summarize(out_path, tau_list, {i.key for i in items})
        if verify > 0:
            summary["verify"] = progressive.verify(mem, llm, items, out_path, n=verify,
                                                   tau=verify_tau, budget=budget)
            v = summary["verify"]
            out.print(f"verify: auto[{v['router']}] tau={v['tau']} run for real on {v['n']} "
                      f"questions: {v['same_path']} took the recorded path, {v['same_answer']} "
                      "gave the recorded answer", highlight=False, markup=False)
        out.print(progressive.format_summary(summary), highlight=False, markup=False)
        if plot is not None:
            progressive.plot(summary, plot)
            out.print(f"wrote {plot}")
        if json_out is not None:
            write_json(json_out, envelope("progressive", dataset, str(data or default_path()),
                                          {"budget": budget, "limit": limit, "taus": tau_list,
                                           "reader": llm.model, "settings": mem.settings.__class__.__name__},
                                          summary))
            out.print(f"wrote {json_out}")


@app.command()
def ask(
    question: Annotated[str, typer.Argument(help="The question.")],
    scope: ScopeOpt = "default",
    mode: Annotated[str, typer.Option(help="fast, deep or auto.")] = "fast",
    tau: Annotated[float | None, typer.Option(help="Router threshold for --mode auto.")] = None,
    router: Annotated[str, typer.Option(
        help="signals (retrieval signals, no model call) or lm (zero-shot), for --mode auto.")
    ] = "signals",
    budget: Annotated[int, typer.Option(help="Reader context budget in tokens.")] = 1000,
    provider: ProviderOpt = "local",
    model: ModelOpt = None,
    base_url: BaseUrlOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the answer and receipt as JSON.")] = False,
    db: DbOpt = None,
) -> None:
    """Answer a question from memory and print the answer with its receipt."""
    with errors():
        if mode not in ("fast", "deep", "auto"):
            fail(f"unknown mode {mode!r}; use fast, deep or auto")
        if router not in ("signals", "lm"):
            fail(f"unknown router {router!r}; use signals or lm")
        mem = open_memory(db)
        mem.store.require_scope(scope)
        llm = make_reader(provider, model, base_url)
        rt: Any = None
        if mode == "auto":
            from .route.sufficiency import LMRouter, ScoreRouter
            rt = LMRouter(llm) if router == "lm" else ScoreRouter()
        ans = mem.ask(question, scope=scope, llm=llm, mode=mode, router=rt, tau=tau,
                      budget=budget)
        r = ans.receipt
        if as_json:
            from dataclasses import asdict
            out.print_json(data={"answer": ans.text, "receipt": asdict(r)})
            return
        out.print(f"[bold]{ans.text}[/bold]", highlight=False)
        routed = (f", router {r.router} {r.router_score:.2f} vs tau {r.tau}"
                  if r.router_score is not None else "")
        out.print(f"[dim]path {r.path} (mode {r.mode}" + routed
                  + f") | model {r.model} | {r.input_tokens} in + {r.output_tokens} out tokens, "
                  f"${r.cost_usd:.5f} | {r.t_e2e_ms:.0f} ms end to end, {r.t_mem_ms:.0f} ms memory[/dim]",
                  highlight=False)
        out.print("[dim]stages: " + ", ".join(f"{k} {v:.0f} ms" for k, v in r.stages_ms.items()) + "[/dim]")
        for b in r.blocks:
            out.print(f"[dim]block {b.block} items {b.first_seq}-{b.last_seq}: {b.why}; "
                      f"{'relevant' if b.relevant else 'nothing relevant'} ({b.latency_ms:.0f} ms)[/dim]")
        for n in r.notes:
            out.print(f"[yellow]note: {n}[/yellow]", highlight=False)


@bench_app.command("retrieval")
def bench_retrieval(
    dataset: Annotated[str, typer.Option(help="Dataset name (locomo).")] = "locomo",
    data: Annotated[Path | None, typer.Option(help="Dataset file (default: the shared copy).")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write figures to this file.")] = None,
    db: Annotated[str | None, typer.Option("--db", help="Store to use (default: a temporary one).")] = None,
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
