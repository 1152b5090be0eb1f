"""Reliability harness (``make reliability``): kills, load, fuzzing and provider faults.

Not part of the test suite: it runs for several minutes and prints the figures
``docs/reliability.md`` records.

    python benchmarks/reliability.py all --json docs/results/reliability.json
    python benchmarks/reliability.py crash --kills 50       # SIGKILL ingesting processes
    python benchmarks/reliability.py load --writers 4 --items 10000 --readers 2
    python benchmarks/reliability.py fuzz --cases 10000      # hypothesis, then atheris if installed
    python benchmarks/reliability.py faults                  # a fault-injecting proxy before the local model

Each part exits non-zero when a promise breaks; ``all`` runs every part and says which broke.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def _child(code: str, *args: str) -> subprocess.Popen[str]:
    """A Python child running ``code`` with ``args`` in sys.argv, stdout piped line by line."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([PY, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


# -- crash: SIGKILL while ingesting ------------------------------------------------------------------

API_WORKER = r"""
import random, sys
from suffice import Memory, NewItem
db, run, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rnd = random.Random(seed)
mem = Memory(db)
i = 0
while i < 3000:
    n = rnd.randint(1, 200)
    batch = [NewItem(text=f"run {run} item {j} says {rnd.random():.6f}", id=f"{run}-{j}",
                     session=f"s{j // 100}")
             for j in range(i, min(3000, i + n))]
    mem.add(batch, scope="api", batch_size=rnd.choice([16, 64, 512]))
    i += n
    print(f"ack {run} {i}", flush=True)
print("done", flush=True)
"""


def crash(kills: int, workdir: Path, rnd: random.Random) -> dict[str, Any]:
    """Half the kills hit ``Memory.add`` in batches with client ids, half a CLI file import.

    After each kill: the store passes ``check``, every acknowledged item is there exactly once,
    and a file import is all or nothing.
    """
    db = str(workdir / "crash.db")
    acked: dict[str, int] = {}  # run -> items acknowledged
    problems: list[str] = []
    api_kills = cli_kills = 0
    lines = [json.dumps({"text": f"file line {i} {rnd.random():.6f}", "session": f"f{i // 300}"})
             for i in range(3000)]
    jsonl = workdir / "import.jsonl"
    jsonl.write_text("\n".join(lines) + "\n", encoding="utf-8")
    imports_done = 0
    for k in range(kills):
        if k % 2 == 0:
            run = f"r{k % 6}"  # runs repeat: a run resumed after a kill re-adds its ids
            proc = _child(API_WORKER, db, run, str(rnd.randrange(10**6)))
        else:
            proc = _child("from suffice._cli import main; import sys; "
                          "sys.argv = ['suffice'] + sys.argv[1:]; main()",
                          "--db", db, "add", "--file", str(jsonl), "--scope", "cli")
        # A file import of 3,000 lines takes about 20 s here: kills of imports are spread past
        # that, so some imports finish and the "all" side of all-or-nothing is seen too.
        time.sleep(rnd.uniform(0.3, 12.0 if k % 2 == 0 else 36.0))
        proc.send_signal(signal.SIGKILL)
        out, _err = proc.communicate()
        if k % 2 == 0:
            api_kills += 1
            for line in out.splitlines():
                if line.startswith("ack "):
                    _, r, n = line.split()
                    acked[r] = max(acked.get(r, 0), int(n))
        elif proc.returncode == 0:
            imports_done += 1
        problems += _verify_crash(db, acked, imports_done, k)
        cli_kills += k % 2
    from suffice import Memory
    with Memory(db, embedder=None) as mem:
        n_api = len(mem.items(scope="api", limit=None)) if "api" in mem.scopes() else 0
    return {"kills": kills, "api_kills": api_kills, "cli_kills": cli_kills,
            "acknowledged": sum(acked.values()),
            "api_items": n_api, "imports_completed": imports_done, "problems": problems,
            "items_lost": sum(p.startswith("lost") for p in problems),
            "duplicates": sum(p.startswith("duplicate") for p in problems)}


def _verify_crash(db: str, acked: dict[str, int], imports_done: int, k: int) -> list[str]:
    from suffice import Memory
    out: list[str] = []
    with Memory(db, embedder=None) as mem:
        out += [f"after kill {k}: check: {p}" for p in mem.store.check()]
        scopes = mem.scopes()
        api = mem.items(scope="api", limit=None) if "api" in scopes else []
        ids = [it.id for it in api]
        if len(ids) != len(set(ids)):
            out.append(f"duplicate ids after kill {k}")
        have = set(ids)
        for run, n in acked.items():
            missing = [j for j in range(n) if f"{run}-{j}" not in have]
            if missing:
                out.append(f"lost {len(missing)} acknowledged items of {run} after kill {k}")
        # Lines get ids from their content, so every import of the file stores the same 3,000
        # items: a completed import leaves all of them, any import leaves all or none.
        cli = len(mem.items(scope="cli", limit=None)) if "cli" in scopes else 0
        if cli not in (0, 3000):
            out.append(f"a file import was half-written after kill {k}: {cli} items")
        elif imports_done and cli == 0:
            out.append(f"lost a completed file import after kill {k}")
        texts = [it.text for it in mem.items(scope="cli", limit=None)] if cli else []
        if len(texts) != len(set(texts)):
            out.append(f"duplicate import lines after kill {k}")
    return out


# -- load: writers and readers at once ----------------------------------------------------------------

WRITER = r"""
import sys, time
from suffice import Memory, NewItem
db, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
mem = Memory(db)
t0 = time.perf_counter()
for i in range(0, n, 250):
    mem.add([NewItem(text=f"writer {tag} note {j} about the river gauge {j % 97}", id=f"{tag}-{j}",
                     session=f"{tag}-{j // 500}") for j in range(i, min(n, i + 250))], scope="load")
print(f"wrote {n} {time.perf_counter() - t0:.3f}", flush=True)
"""

READER = r"""
import os, random, sys, time
from suffice import Memory, UnknownScopeError
db, stop = sys.argv[1], sys.argv[2]
mem = Memory(db)
rnd = random.Random(7)
lat, errors = [], 0
while not os.path.exists(stop):
    q = f"river gauge note {rnd.randrange(10000)}"
    t = time.perf_counter()
    try:
        mem.search(q, scope="load", k=10)
        mem.render(q, 1000, scope="load")
        lat.append((time.perf_counter() - t) * 1e3)
    except UnknownScopeError:
        time.sleep(0.05)
    except Exception as exc:
        errors += 1
        print("error", type(exc).__name__, exc, flush=True)
lat.sort()
print(f"queries {len(lat)} errors {errors} p50 {lat[len(lat) // 2] if lat else 0:.1f}", flush=True)
"""


def load(writers: int, items: int, readers: int, workdir: Path) -> dict[str, Any]:
    db = str(workdir / "load.db")
    from suffice import Memory
    Memory(db, embedder=None).close()
    t0 = time.perf_counter()
    stop = workdir / "stop-readers"
    ws = [_child(WRITER, db, f"w{i}", str(items)) for i in range(writers)]
    rs = [_child(READER, db, str(stop)) for _ in range(readers)]
    for w in ws:
        w.wait()
    wall = time.perf_counter() - t0
    stop.touch()
    reader_out = []
    for r in rs:
        try:
            out, err = r.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            r.kill()
            out, err = r.communicate()
        reader_out.append(out + err)
    writer_errors = [w.stderr.read() for w in ws if w.returncode != 0 and w.stderr]  # type: ignore[union-attr]
    with Memory(db, embedder=None) as mem:
        got = mem.items(scope="load", limit=None)
        problems = mem.store.check()
    ids = [it.id for it in got]
    queries = errors = 0
    p50s = []
    for out in reader_out:
        for line in out.splitlines():
            if line.startswith("queries"):
                parts = line.split()
                queries += int(parts[1])
                errors += int(parts[3])
                p50s.append(float(parts[5]))
            elif line.startswith("error"):
                problems.append(f"reader: {line}")
    expected = writers * items
    if len(ids) != expected or len(set(ids)) != expected:
        problems.append(f"expected {expected} items, found {len(ids)} ({len(set(ids))} distinct)")
    problems += [f"writer failed: {e.strip().splitlines()[-1]}" for e in writer_errors if e.strip()]
    return {"writers": writers, "items_per_writer": items, "readers": readers, "items": len(ids),
            "wall_s": wall, "items_per_s": len(ids) / wall, "reader_queries": queries,
            "reader_errors": errors, "reader_p50_ms": statistics.median(p50s) if p50s else None,
            "problems": problems}


# -- fuzz ---------------------------------------------------------------------------------------------


def fuzz(cases: int) -> dict[str, Any]:
    """The property-based fuzz targets of the test suite at ``cases`` examples each, then the
    coverage-guided (atheris) targets for as many runs when atheris is installed."""
    env = {**os.environ, "SUFFICE_FUZZ_CASES": str(cases)}
    t0 = time.perf_counter()
    proc = subprocess.run([PY, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(ROOT / "tests" / "test_fuzz.py")],
                          env=env, capture_output=True, text=True, cwd=ROOT)
    result: dict[str, Any] = {"hypothesis_cases_per_target": cases, "hypothesis_ok": proc.returncode == 0,
                              "hypothesis_s": time.perf_counter() - t0,
                              "hypothesis_tail": proc.stdout.strip().splitlines()[-1:] if proc.stdout else []}
    if proc.returncode != 0:
        result["hypothesis_failure"] = proc.stdout[-4000:]
    try:
        import atheris  # noqa: F401
    except ImportError:
        result["atheris"] = "not installed (pip install atheris): skipped"
        return result
    runs = {}
    seeds = {
        "items": [json.dumps({"text": "hi", "session": "s", "meta": {"a": [1, 2]}, "id": "x"}),
                  json.dumps([{"role": "user", "content": "hello"}, "plain text"])],
        "messages": [json.dumps({"content": [{"type": "text", "text": "hi"}], "name": "ana"}),
                     json.dumps({"content": None, "tool_calls": [{"id": "c", "type": "function",
                                 "function": {"name": "f", "arguments": "{}"}}]})],
        "query": ["\x00\x01cats near the river", "\x10\x00OR NEAR(\"x\" *) AND"],
        "locomo": [json.dumps([{"sample_id": "c1", "conversation": {
            "speaker_a": "A", "speaker_b": "B", "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [{"speaker": "A", "dia_id": "D1:1", "text": "I love hiking."}]},
            "qa": [{"question": "q?", "answer": "a", "evidence": ["D1:1"], "category": 1}]}])],
    }
    for target in ("items", "messages", "query", "locomo"):
        corpus = Path(tempfile.mkdtemp(prefix=f"corpus-{target}-"))
        for i, seed in enumerate(seeds[target]):
            (corpus / f"seed{i}").write_text(seed, encoding="utf-8")
        t0 = time.perf_counter()
        p = subprocess.run([PY, str(ROOT / "benchmarks" / "fuzz_targets.py"), target, f"-runs={cases}",
                            "-max_len=4096", "-len_control=0", str(corpus)],
                           capture_output=True, text=True, cwd=ROOT)
        runs[target] = {"ok": p.returncode == 0, "s": time.perf_counter() - t0,
                        "tail": (p.stderr or p.stdout).strip().splitlines()[-2:]}
    result["atheris"] = runs
    return result


# -- faults: a hostile server in front of the real local model ------------------------------------------


def faults(queries_per_fault: int, workdir: Path) -> dict[str, Any]:
    """Every fault of ``benchmarks/fault_proxy.py`` in front of the local model: each query ends
    within its deadline, in an answer or a degraded answer that says so, and writes nothing."""
    from fault_proxy import FAULTS, FaultProxy

    from suffice import LocalLlama, Memory, OpenAIHTTP
    from suffice._llm.models import resolve_model
    db = workdir / "faults.db"
    mem = Memory(db)
    mem.add([{"role": "user", "content": "My cat is called Figo and I live in Lisbon."},
             {"role": "assistant", "content": "Noted: Figo, Lisbon."}], user_id="ana")
    before = mem.stats().items
    local = LocalLlama(resolve_model(None))
    deadline_s = 20.0
    rows = []
    overruns = 0
    for fault in FAULTS:
        with FaultProxy(local, fault) as proxy:
            llm = OpenAIHTTP(proxy.base_url, model="proxy", timeout=5.0, retries=2, backoff=0.1)
            for q in range(queries_per_fault):
                t0 = time.monotonic()
                try:
                    ans = mem.ask("Where does Ana live?", user_id="ana", llm=llm, timeout=deadline_s)
                    outcome = "degraded" if ans.receipt.degraded else "answered"
                    said = bool(ans.receipt.notes) if ans.receipt.degraded else True
                except Exception as exc:  # a clear error is allowed; an unclear one is not
                    outcome, said = f"error {type(exc).__name__}", type(exc).__module__.startswith("suffice")
                took = time.monotonic() - t0
                overruns += took > deadline_s + 1.0
                rows.append({"fault": fault, "query": q, "outcome": outcome, "said_so": said,
                             "s": round(took, 2)})
    after = mem.stats().items
    mem.close()
    return {"faults": list(FAULTS), "queries": len(rows), "deadline_s": deadline_s,
            "deadline_overruns": overruns,
            "outcomes": {f: [r["outcome"] for r in rows if r["fault"] == f] for f in FAULTS},
            "unexplained": [r for r in rows if not r["said_so"]], "items_written": after - before}


# -- main --------------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("part", choices=("all", "crash", "load", "fuzz", "faults"))
    ap.add_argument("--kills", type=int, default=50)
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--items", type=int, default=10_000)
    ap.add_argument("--readers", type=int, default=2)
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--fault-queries", type=int, default=3)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    rnd = random.Random(args.seed)
    results: dict[str, Any] = {}
    broken: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.part in ("all", "crash"):
            results["crash"] = r = crash(args.kills, work, rnd)
            print(f"crash: {r['kills']} kills survived ({r['api_kills']} API, {r['cli_kills']} CLI import); "
                  f"{r['acknowledged']} acknowledged items, lost {r['items_lost']}, "
                  f"duplicates {r['duplicates']}; "
                  f"problems {len(r['problems'])}", flush=True)
            broken += ["crash"] if r["problems"] else []
        if args.part in ("all", "load"):
            results["load"] = r = load(args.writers, args.items, args.readers, work)
            print(f"load: {r['writers']} writers x {r['items_per_writer']} items in {r['wall_s']:.0f} s "
                  f"({r['items_per_s']:.0f} items/s) with {r['readers']} readers "
                  f"({r['reader_queries']} queries, "
                  f"p50 {r['reader_p50_ms']} ms, {r['reader_errors']} errors); {r['items']} items; "
                  f"problems {len(r['problems'])}", flush=True)
            broken += ["load"] if r["problems"] or r["reader_errors"] else []
        if args.part in ("all", "fuzz"):
            results["fuzz"] = r = fuzz(args.cases)
            print(f"fuzz: hypothesis {r['hypothesis_cases_per_target']} cases per target: "
                  f"{'ok' if r['hypothesis_ok'] else 'FAILED'} ({r['hypothesis_s']:.0f} s); atheris: "
                  + (r["atheris"] if isinstance(r["atheris"], str) else
                     ", ".join(f"{k} {'ok' if v['ok'] else 'FAILED'}"
                               for k, v in r["atheris"].items())), flush=True)
            atheris_ok = isinstance(r["atheris"], str) or all(v["ok"] for v in r["atheris"].values())
            broken += ["fuzz"] if not (r["hypothesis_ok"] and atheris_ok) else []
        if args.part in ("all", "faults"):
            results["faults"] = r = faults(args.fault_queries, work)
            print(f"faults: {r['queries']} queries over {len(r['faults'])} faults, "
                  f"deadline {r['deadline_s']:g} s: "
                  f"overruns {r['deadline_overruns']}, unexplained {len(r['unexplained'])}, "
                  f"items written {r['items_written']}", flush=True)
            broken += ["faults"] if r["deadline_overruns"] or r["unexplained"] or r["items_written"] else []
    if args.json:
        from suffice._bench.report import envelope, write_json
        doc = envelope("reliability", "synthetic", "", vars(args) | {"json": str(args.json)}, results)
        doc["command"] = "python benchmarks/reliability.py " + " ".join(sys.argv[1:])
        write_json(args.json, doc)
    print("reliability: " + ("all promises held" if not broken else "BROKEN: " + ", ".join(broken)))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
