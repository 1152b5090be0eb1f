"""`suffice keys` and `suffice serve` from the command line: keys shown once and stored as
digests, a real server process that answers on loopback, and the refusals that keep a
keyless server off the network."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest
from typer.testing import CliRunner

from suffice import KeyRing, Memory
from suffice._cli import app

pytest.importorskip("uvicorn")


def cli(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(app, list(args), env=env)


def test_keys_are_added_listed_and_revoked(tmp_path):
    keys = str(tmp_path / "k.json")
    made = cli("keys", "add", "--scope", "user:ana", "--scope", "team:*", "--name", "ana app", "--keys", keys)
    assert made.exit_code == 0, made.output
    token = made.stdout.strip().splitlines()[0]
    assert token.startswith("sfk_") and token not in (tmp_path / "k.json").read_text()
    listed = cli("keys", "list", "--keys", keys)
    key_id = listed.stdout.split("\t")[0]
    assert "user:ana,team:*" in listed.stdout and "ana app" in listed.stdout
    assert KeyRing(keys).authenticate(token).key_id == key_id
    assert cli("keys", "revoke", key_id, "--keys", keys).exit_code == 0
    assert cli("keys", "revoke", key_id, "--keys", keys).exit_code != 0


def test_a_keyless_server_stays_on_loopback(tmp_path):
    out = cli("--db", str(tmp_path / "m.db"), "serve", "--dev", "--host", "0.0.0.0")
    assert out.exit_code != 0 and "loopback" in out.output


def test_a_server_without_keys_or_dev_refuses_to_start(tmp_path):
    out = cli("--db", str(tmp_path / "m.db"), "serve", "--keys", str(tmp_path / "none.json"))
    assert out.exit_code != 0 and "suffice keys add" in out.output


@pytest.mark.parametrize(("name", "value", "said"), [("SUFFICE_SERVER_MAX_K", "abc", "SUFFICE_SERVER_MAX_K"),
                                                      ("SUFFICE_SERVER_DEADLINE_S", "0", "greater than 0"),
                                                      ("SUFFICE_SERVER_MAXK", "5", "not a server setting")])
def test_a_bad_server_limit_is_refused_before_the_server_starts(tmp_path, monkeypatch, name, value, said):
    monkeypatch.setenv(name, value)
    out = cli("--db", str(tmp_path / "m.db"), "serve", "--dev")
    assert out.exit_code == 2 and said in out.output and "serving" not in out.output
    assert not (tmp_path / "m.db").exists()


def test_serve_runs_a_real_server_process(tmp_path):
    db = tmp_path / "m.db"
    with Memory(db) as mem:
        mem.add("Ana moved to Lisbon in May.", user_id="ana")
    keys = tmp_path / "k.json"
    token, _ = KeyRing(keys).create(["user:ana"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "SUFFICE_DB": str(db), "SUFFICE_KEYS": str(keys)}
    proc = subprocess.Popen([sys.executable, "-m", "suffice._cli", "serve", "--port", str(port),
                             "--provider", "scripted"], env=env, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            try:
                httpx.get(f"{url}/v1/health", timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < end, "the server did not come up"
                time.sleep(0.2)
        auth = {"Authorization": f"Bearer {token}"}
        ans = httpx.post(f"{url}/v1/ask", headers=auth, json={"user_id": "ana", "question": "Where?"},
                         timeout=60).json()["answer"]
        assert ans["text"].startswith("digest ") and ans["receipt"]["model"] == "scripted-digest"
        assert httpx.post(f"{url}/v1/search", headers=auth, json={"user_id": "bob", "query": "x"}
                          ).status_code == 403
    finally:
        proc.terminate()
        proc.wait(20)


def test_a_server_names_a_broken_router_or_tier_policy_at_start_not_at_the_first_request(
        tmp_path, monkeypatch, capsys):
    from suffice import Memory
    from suffice._cli import warn_installed_parts

    monkeypatch.setenv("SUFFICE_ROUTER", str(tmp_path / "no-router"))
    monkeypatch.setenv("SUFFICE_TIERS", str(tmp_path / "no-policy"))
    with Memory(tmp_path / "m.db", embedder=None) as mem:
        warn_installed_parts(mem)  # warns, and serving goes on: only auto and tiered need them
    said = " ".join(capsys.readouterr().err.split())
    assert "$SUFFICE_ROUTER=" in said and "no tier policy at" in said
