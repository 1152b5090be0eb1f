"""An OpenAI-compatible server on loopback that answers with a real model, or misbehaves.

``FaultProxy(llm, fault)`` serves ``/v1/chat/completions`` by calling ``llm`` (the local
llama.cpp model in the reliability harness) and injects one fault:

* ``ok``        the model's answer, as a well-formed reply;
* ``timeout``   accepts the request and never answers;
* ``429``       every other request is refused with 429 and ``Retry-After: 1``;
* ``500``       every request fails with 500;
* ``truncated`` the JSON body stops halfway and the connection closes;
* ``garbage``   200 with bytes that are not JSON;
* ``trickle``   the real reply, one byte every half second;
* ``null``      200 with ``"content": null``;
* ``usage``     the real reply with absurd token usage (10^12 prompt tokens).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FAULTS = ("ok", "timeout", "429", "500", "truncated", "garbage", "trickle", "null", "usage")


class FaultProxy:
    def __init__(self, llm: Any, fault: str) -> None:
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; use one of {', '.join(FAULTS)}")
        self.llm, self.fault = llm, fault
        self.requests = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                with owner._lock:
                    owner.requests += 1
                    n = owner.requests
                owner.handle(self, body, n)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> FaultProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()

    def _reply(self, body: dict[str, Any]) -> dict[str, Any]:
        out = self.llm.chat(body["messages"], max_tokens=int(body.get("max_tokens", 64)))
        return {"id": "p", "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": out.text},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": out.record.input_tokens,
                          "completion_tokens": out.record.output_tokens}}

    def handle(self, h: BaseHTTPRequestHandler, body: dict[str, Any], n: int) -> None:
        fault = self.fault
        if fault == "timeout":
            self._stop.wait(120)
            return
        if fault == "500" or (fault == "429" and n % 2 == 1):
            status = 500 if fault == "500" else 429
            data = json.dumps({"error": {"message": f"injected {status}"}}).encode()
            h.send_response(status)
            if status == 429:
                h.send_header("Retry-After", "1")
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)
            return
        if fault == "garbage":
            data = bytes(range(256)) * 4
        elif fault == "null":
            data = json.dumps({"choices": [{"message": {"role": "assistant", "content": None},
                                            "finish_reason": "stop"}]}).encode()
        else:
            reply = self._reply(body)
            if fault == "usage":
                reply["usage"] = {"prompt_tokens": 10**12, "completion_tokens": 10**9}
            data = json.dumps(reply).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        try:
            if fault == "truncated":
                h.wfile.write(data[: len(data) // 2])
                h.wfile.flush()
                h.close_connection = True
            elif fault == "trickle":
                for b in data:
                    if self._stop.is_set():
                        return
                    h.wfile.write(bytes([b]))
                    h.wfile.flush()
                    time.sleep(0.5)
            else:
                h.wfile.write(data)
        except OSError:
            pass  # the client hung up (as it should, at its deadline)
