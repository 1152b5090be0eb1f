"""Test helpers for the LLM backends: real and fake servers on loopback, model lookup.

Not a conftest: test modules import what they need from here.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def have_llama_cpp() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def smollm2_path() -> Path:
    """The SmolLM2 GGUF, or skip the test with the reason it is unavailable."""
    if not have_llama_cpp():
        pytest.skip("llama-cpp-python is not installed (pip install 'suffice[local]')")
    from suffice._errors import ModelFileError
    from suffice._llm.models import resolve_model

    try:
        return resolve_model("smollm2-135m")
    except ModelFileError as exc:
        pytest.skip(f"SmolLM2 model package missing: {exc}")


# -- a real OpenAI-compatible server (llama-cpp-python's) ------------------------------------


@contextmanager
def llama_server(model_path: Path, alias: str = "smol", wait_s: float = 60.0) -> Iterator[str]:
    """Run ``python -m llama_cpp.server`` on a free loopback port; yields its /v1 base URL."""
    if importlib.util.find_spec("uvicorn") is None or importlib.util.find_spec("fastapi") is None:
        pytest.skip("llama-cpp-python's server extras are missing (pip install 'suffice[server]')")
    port = free_port()
    cmd = [
        sys.executable, "-m", "llama_cpp.server",
        "--model", str(model_path), "--model_alias", alias,
        "--host", "127.0.0.1", "--port", str(port),
        "--n_threads", "2", "--n_ctx", "2048",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + wait_s
        while True:
            if proc.poll() is not None:
                pytest.fail(f"llama_cpp.server exited early with code {proc.returncode}")
            try:
                if httpx.get(f"{base}/models", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama_cpp.server did not answer within {wait_s:.0f} s")
            time.sleep(0.25)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


# -- a scripted HTTP server for status-code scenarios ---------------------------------------


@dataclass
class Reply:
    status: int = 200
    body: bytes | str | dict[str, Any] = b""
    headers: dict[str, str] = field(default_factory=dict)


def chat_body(text: str, usage: bool = True, **extra: Any) -> dict[str, Any]:
    """A minimal OpenAI chat-completion response."""
    body: dict[str, Any] = {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": "stop"}],
    }
    if usage:
        body["usage"] = {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
    body.update(extra)
    return body


class FakeOpenAI:
    """Serves scripted replies in order (the last one repeats) and records request bodies."""

    def __init__(self, replies: list[Reply], delay_s: float = 0.0) -> None:
        self.replies = list(replies)
        self.delay_s = delay_s
        self.active = 0
        self.peak = 0
        """Most requests that were being handled at the same moment."""
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(length)
                with owner._lock:
                    owner.requests.append(json.loads(raw or b"{}"))
                    owner.headers.append(dict(self.headers))
                    reply = owner.replies.pop(0) if len(owner.replies) > 1 else owner.replies[0]
                    owner.active += 1
                    owner.peak = max(owner.peak, owner.active)
                time.sleep(owner.delay_s)
                with owner._lock:
                    owner.active -= 1
                body = reply.body
                if isinstance(body, dict):
                    data = json.dumps(body).encode()
                elif isinstance(body, str):
                    data = body.encode()
                else:
                    data = body
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> FakeOpenAI:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def silent_server() -> Iterator[str]:
    """A socket that accepts connections and never answers; yields a /v1 base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.settimeout(0.1)
    stop = threading.Event()
    held: list[socket.socket] = []

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
                held.append(conn)
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    finally:
        stop.set()
        thread.join(timeout=2)
        for conn in held:
            conn.close()
        sock.close()
