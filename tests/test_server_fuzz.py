"""A schema-driven fuzz run of the REST server (schemathesis): whatever a client sends that the
OpenAPI schema allows, or nearly allows, the server answers without a 5xx."""

from __future__ import annotations

import tempfile
from pathlib import Path

import schemathesis  # the [dev] extra holds it: a missing one fails the run, not skips it
from hypothesis import HealthCheck, settings

from suffice import HashEmbedder, Memory, ScriptedLLM
from suffice._server.rest import create_app

_DIR = Path(tempfile.mkdtemp(prefix="suffice-fuzz-"))
_MEM = Memory(_DIR / "fuzz.db", embedder=HashEmbedder(), llm=ScriptedLLM("<answer>ok</answer>"))
_MEM.add(["Ana moved to Lisbon in May.", "Her cat Figo came too."], user_id="ana", observed_at="2025-06-01")
_MEM.add(["Bob lives in Porto."], scope="default")


def _for_localhost(app):  # type: ignore[no-untyped-def]
    """The test client names its host "testserver"; a server without keys answers loopback
    names only (DNS rebinding), so the fuzz run's requests say "localhost"."""
    async def shim(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] == "http":
            headers = [(k, v) for k, v in scope["headers"] if k != b"host"]
            scope = {**scope, "headers": [*headers, (b"host", b"localhost")]}
        await app(scope, receive, send)
    return shim


schema = schemathesis.openapi.from_asgi("/openapi.json", _for_localhost(create_app(_MEM)))


@schema.parametrize()
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_makes_the_server_fail(case):
    response = case.call()
    assert response.status_code < 500, (case.method, case.path, case.body, response.text)
    if response.status_code >= 400:
        assert set(response.json()["error"]) - {"notes"} == {"code", "type", "message"}
