"""Any OpenAI-compatible chat server over HTTP (hosted APIs, llama.cpp server, vLLM, ...).

Plain httpx rather than a vendor SDK: the two requests we need are small, and owning the loop
lets us bound concurrency, retry only what is worth retrying, and turn every failure into a
:class:`ProviderError` that names the endpoint and status, which is what a user debugging a
misconfigured server needs to see. Every call, failed or not, leaves a record in the ledger.
"""

from __future__ import annotations

import math
import os
import random
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from .._errors import ConfigError, DeadlineError, ProviderError
from .base import CallRecord, Completion, Ledger, Message, Price, count_message_tokens, record_call
from .base import count_text_tokens as _count
from .pricing import price_for

ENV_BASE_URL = "SUFFICE_LLM_BASE_URL"
ENV_API_KEY = "SUFFICE_LLM_API_KEY"
ENV_MODEL = "SUFFICE_LLM_MODEL"

MAX_RETRY_AFTER_S = 30.0
"""Cap on a server's Retry-After, so one overloaded provider cannot stall a run for minutes."""

TOP_LOGPROBS = 20
"""The most alternatives the OpenAI API returns per position."""


def _retryable(status: int) -> bool:
    return status in (408, 429) or status >= 500


def _error_detail(resp: httpx.Response) -> str:
    """The server's own error message if it sent one, else the start of the body."""
    try:
        body = resp.json()
    except (ValueError, RecursionError):
        return resp.text[:300].strip() or resp.reason_phrase
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body))
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])[:300]
        return str(err)[:300]
    return str(body)[:300]


def _retry_after(resp: httpx.Response) -> float | None:
    value = resp.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, min(float(value), MAX_RETRY_AFTER_S))
    except ValueError:
        return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _plausible(local_count: int) -> int:
    """The most tokens a server may report for text we count as ``local_count``: tokenizers
    differ (and chat templates add tokens), but not by an order of magnitude."""
    return 4 * local_count + 512


class _Cut(Exception):
    """The reply was cut off at the deadline."""


MAX_REPLY_BYTES = 16 * 1024 * 1024
"""Largest reply body read from a server: a chat completion is far smaller."""

MAX_BACKOFF_S = 8.0
"""Longest pause between two attempts, whatever the back-off doubling reaches."""

class OpenAIHTTP:
    """Chat completions and next-token choice probabilities from an OpenAI-compatible server.

    ``base_url`` is the API root including its version (``http://host:port/v1``). Unset
    arguments fall back to ``$SUFFICE_LLM_BASE_URL``, ``$SUFFICE_LLM_MODEL`` and
    ``$SUFFICE_LLM_API_KEY`` (then ``$OPENAI_API_KEY``). At most ``max_concurrency`` requests
    are in flight per instance; 408/429/5xx, timeouts and connection errors are retried up to
    ``retries`` times with exponential backoff from ``backoff`` seconds. ``prices`` is a
    :class:`Price` or a price-override mapping for :func:`price_for`.
    """

    def __init__(
        self,
        base_url: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_concurrency: int = 4,
        retries: int = 3,
        backoff: float = 0.5,
        prices: Price | Mapping[str, Any] | None = None,
        *,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        base_url = base_url or os.environ.get(ENV_BASE_URL) or os.environ.get("OPENAI_BASE_URL")
        model = model or os.environ.get(ENV_MODEL)
        given_key = api_key
        api_key = api_key or os.environ.get(ENV_API_KEY) or os.environ.get("OPENAI_API_KEY")
        if not base_url:
            raise ConfigError(
                f"no LLM server given: pass base_url (e.g. http://127.0.0.1:8080/v1) or set "
                f"${ENV_BASE_URL}"
            )
        if not model:
            raise ConfigError("no model name given: pass model (--model on the command line) or set "
                              f"${ENV_MODEL}")
        if max_concurrency < 1:
            raise ConfigError(f"max_concurrency must be at least 1, got {max_concurrency}")
        if retries < 0 or backoff < 0 or timeout <= 0:
            raise ConfigError("retries and backoff must be >= 0 and timeout > 0")
        auth: tuple[str, str] | None = None
        try:
            parsed: httpx.URL | None = httpx.URL(base_url)
        except (httpx.InvalidURL, TypeError):
            parsed = None  # said at the first call, as a URL httpx cannot use
        if parsed is not None and parsed.userinfo:
            # Credentials in the URL go into the request's auth, never into a message, a receipt
            # or the cache's record of which server answered.
            if given_key:
                raise ConfigError("base_url carries a user and password and an API key is given too: "
                                  "give the credentials once")
            api_key = None  # the URL's credentials win over a key from the environment
            auth = (parsed.username, parsed.password)
            base_url = str(parsed.copy_with(username=None, password=None))
        if api_key and (api_key != api_key.strip() or any(ord(c) < 32 or ord(c) == 127 for c in api_key)):
            # It would go into a header httpx refuses, and the refusal quotes the header.
            raise ConfigError("the API key holds spaces or control characters (a newline read from a "
                              "file?); give the key alone")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.identity = f"{self.base_url} {model}"
        """Which backend answers: a cache keeps answers of one server apart from another's."""
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.backoff = float(backoff)
        self.price = prices if isinstance(prices, Price) else price_for(model, prices)
        self._sem = threading.BoundedSemaphore(max_concurrency)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            timeout=httpx.Timeout(self.timeout),
            limits=httpx.Limits(max_connections=max_concurrency,
                                max_keepalive_connections=max_concurrency),
            headers=headers,
            transport=transport,
            auth=auth,
        )

    @property
    def chat_url(self) -> str:
        return f"{self.base_url}/chat/completions"

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> OpenAIHTTP:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"OpenAIHTTP(base_url={self.base_url!r}, model={self.model!r})"

    # -- transport ------------------------------------------------------------------------

    def _delay(self, attempt: int, hinted: float | None) -> float:
        base = min(self.backoff * (2.0**attempt), MAX_BACKOFF_S)
        if hinted is not None:
            base = max(base, hinted)
        return base * (1.0 + 0.1 * random.random())  # jitter: spread retries of many threads

    def _post(self, payload: dict[str, Any], deadline: float | None = None) -> dict[str, Any]:
        """POST to /chat/completions, retrying what may succeed later; the decoded JSON body.

        One deadline bounds the whole call, retries and a reply still streaming in included:
        twice the timeout, or the query's ``deadline`` when that comes first.
        """
        url = self.chat_url
        attempts = self.retries + 1
        own = time.monotonic() + 2 * self.timeout
        call_deadline = own if deadline is None else min(own, deadline)
        for attempt in range(attempts):
            hinted: float | None = None
            left = call_deadline - time.monotonic()
            if left <= 0:
                raise self._out_of_time(deadline, own, f"before attempt {attempt + 1}")
            # Waiting for one of the max_concurrency slots counts against the deadline too.
            if not self._sem.acquire(timeout=left):
                raise self._out_of_time(deadline, own, "waiting for a free connection slot")
            try:
                left = call_deadline - time.monotonic()
                if left <= 0:
                    raise self._out_of_time(deadline, own, "waiting for a free connection slot")
                resp = self._fetch(url, payload, min(self.timeout, left), call_deadline)
            except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
                raise ProviderError(
                    f"{url} is not a usable URL ({exc}); base_url should look like "
                    "http://host:port/v1",
                    endpoint=url,
                ) from exc
            except _Cut:
                raise self._out_of_time(deadline, own, "while the reply was arriving") from None
            except httpx.TimeoutException as exc:
                if deadline is not None and deadline <= own and time.monotonic() >= deadline - 0.01:
                    raise self._out_of_time(deadline, own, "waiting for the reply") from exc
                err = ProviderError(
                    f"{url}: no response within {self.timeout:g} s ({type(exc).__name__}); the "
                    "server may be overloaded or the timeout too short",
                    endpoint=url,
                )
            except httpx.LocalProtocolError as exc:  # refused before sending: no retry helps
                raise ProviderError(f"request to {url} could not be sent: the client refused a header or "
                                    "the body (LocalProtocolError); check the API key and base_url",
                                    endpoint=url) from exc
            except httpx.TransportError as exc:
                err = ProviderError(
                    f"cannot reach {url}: {type(exc).__name__}: {exc or 'connection failed'}; "
                    f"is the server running and is {ENV_BASE_URL} right?",
                    endpoint=url,
                )
            except httpx.HTTPError as exc:  # anything else httpx raises is not transient
                raise ProviderError(f"request to {url} failed: {type(exc).__name__}: {exc}",
                                    endpoint=url) from exc
            else:
                status = resp.status_code
                if 200 <= status < 300:
                    return self._decode(resp)
                err = ProviderError(
                    f"{url} returned HTTP {status}: {_error_detail(resp)}",
                    endpoint=url,
                    status=status,
                )
                if not _retryable(status):
                    raise err
                hinted = _retry_after(resp)
            finally:
                self._sem.release()
            if attempt + 1 >= attempts:
                if attempts > 1:
                    raise ProviderError(
                        f"{err} (gave up after {attempts} attempts)",
                        endpoint=err.endpoint,
                        status=err.status,
                    )
                raise err
            delay = self._delay(attempt, hinted)
            if time.monotonic() + delay >= call_deadline:
                if call_deadline != own:
                    raise DeadlineError(f"{err} (gave up after {attempt + 1} attempt(s): the query's "
                                        "deadline would pass)", endpoint=err.endpoint, status=err.status)
                raise ProviderError(f"{err} (gave up after {attempt + 1} attempt(s): the call's "
                                    f"deadline of {2 * self.timeout:g} s would pass)",
                                    endpoint=err.endpoint, status=err.status)
            time.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    def _out_of_time(self, deadline: float | None, own: float, when: str) -> ProviderError:
        if deadline is not None and deadline <= own:
            return DeadlineError(f"{self.chat_url}: the query's deadline passed {when}",
                                 endpoint=self.chat_url)
        return ProviderError(f"{self.chat_url}: no complete reply within the call's deadline of "
                             f"{2 * self.timeout:g} s (it passed {when})", endpoint=self.chat_url)

    def _fetch(self, url: str, payload: dict[str, Any], timeout: float, until: float) -> httpx.Response:
        """The whole reply, read before ``until``: a server that trickles its body is cut off
        there (the socket is shut down under the read), and a body over MAX_REPLY_BYTES is
        refused."""
        req = self._client.build_request("POST", url, json=payload, timeout=httpx.Timeout(timeout))
        resp = self._send_by(req, until)
        cut = threading.Event()

        def stop() -> None:
            cut.set()
            stream = resp.extensions.get("network_stream")
            sock = stream.get_extra_info("socket") if stream is not None else None
            try:
                if sock is not None:
                    sock.shutdown(socket.SHUT_RDWR)
                else:
                    resp.close()
            except OSError:
                pass
        timer = threading.Timer(max(until - time.monotonic(), 0.0), stop)
        timer.daemon = True
        timer.start()
        try:
            body = bytearray()
            for chunk in resp.iter_bytes():
                body += chunk
                if len(body) > MAX_REPLY_BYTES:
                    raise ProviderError(f"{url} sent a reply over {MAX_REPLY_BYTES:,} bytes; refused",
                                        endpoint=url, status=resp.status_code)
        except (httpx.HTTPError, OSError):
            if cut.is_set():
                raise _Cut() from None
            raise
        finally:
            timer.cancel()
            resp.close()
        if cut.is_set():
            raise _Cut()
        # iter_bytes() has already undone any gzip or chunking: the rebuilt reply must not say
        # it is still encoded, or reading it would decode it a second time (and fail).
        headers = [(k, v) for k, v in resp.headers.items()
                   if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
        return httpx.Response(resp.status_code, headers=headers, content=bytes(body), request=req)

    def _send_by(self, req: httpx.Request, until: float) -> httpx.Response:
        """Send ``req`` and return once its headers are in, or raise :class:`_Cut` at ``until``.

        Each read has its own timeout, so a server that trickles its headers a line at a time
        would hold the call past any deadline; the send runs on a thread of its own, and one
        still waiting at ``until`` is left to finish (its reply is closed unread)."""
        lock = threading.Lock()
        ready = threading.Event()
        box: dict[str, Any] = {}

        def send() -> None:
            try:
                got = self._client.send(req, stream=True)
            except BaseException as exc:  # handed to the caller, who sorts it
                with lock:
                    box["exc"] = exc
                    ready.set()
                return
            with lock:
                if box.get("gone"):
                    got.close()
                    return
                box["resp"] = got
                ready.set()

        threading.Thread(target=send, name="suffice-http-send", daemon=True).start()
        try:
            # A moment's grace: a socket timeout due at the same instant says more (which wait ran out)
            ready.wait(max(until - time.monotonic(), 0.0) + 0.25)
        except BaseException:  # Ctrl-C while waiting: the reply, now or later, goes unread
            with lock:
                box["gone"] = True
                if "resp" in box:
                    box["resp"].close()
            raise
        with lock:
            if not ready.is_set():
                box["gone"] = True
                raise _Cut()
        if "exc" in box:
            raise box["exc"]
        resp: httpx.Response = box["resp"]
        return resp

    def _decode(self, resp: httpx.Response) -> dict[str, Any]:
        url = self.chat_url
        try:
            data = resp.json()
        except (ValueError, RecursionError) as exc:  # not JSON, undecodable, or nested too deep
            raise ProviderError(
                f"{url} returned HTTP {resp.status_code} with a body that is not JSON: "
                f"{resp.text[:200]!r}",
                endpoint=url,
                status=resp.status_code,
            ) from exc
        if not isinstance(data, dict):
            raise ProviderError(
                f"{url} returned JSON that is not an object: {str(data)[:200]}",
                endpoint=url,
                status=resp.status_code,
            )
        return data

    def _first_choice(self, data: dict[str, Any]) -> dict[str, Any]:
        """The first choice of a decoded reply. Checked after the body is in hand, so a failed
        call can still be billed from the body's usage."""
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ProviderError(f"{self.chat_url} returned no choices: {str(data)[:200]}",
                                endpoint=self.chat_url, status=200)
        choice: dict[str, Any] = choices[0]
        return choice

    # -- bookkeeping ----------------------------------------------------------------------

    def _usage(
        self, data: dict[str, Any], messages: Sequence[Message], text: str
    ) -> tuple[int, int, bool]:
        usage = data.get("usage")
        local_in, local_out = count_message_tokens(messages), _count(text)
        if isinstance(usage, dict):
            n_in = _int(usage.get("prompt_tokens"))
            n_out = _int(usage.get("completion_tokens"))
            # Usage far beyond what was sent and received is not believed (a broken or hostile
            # server must not inflate the bill): the tokens are counted here instead.
            if (n_in is not None and n_out is not None and n_in <= _plausible(local_in)
                    and n_out <= _plausible(local_out)):
                return n_in, n_out, False
        return local_in, local_out, True

    def _billed(self, exc: ProviderError, data: dict[str, Any],
                messages: Sequence[Message]) -> tuple[int, int, bool]:
        """Tokens of a failed call: none unless the server answered 2xx, which it bills.

        A 2xx reply we could not use still cost its prompt: take the server's usage when the
        body had one, else count the prompt here (the output is unknown and counted as 0).
        """
        if exc.status is None or not 200 <= exc.status < 300:
            return 0, 0, False
        return self._usage(data, messages, "")

    def _record(
        self,
        ledger: Ledger | None,
        stage: str,
        t0: float,
        tokens: tuple[int, int, bool] = (0, 0, False),
        error: ProviderError | None = None,
        t1: float | None = None,
    ) -> CallRecord:
        n_in, n_out, counted = tokens
        return record_call(ledger, model=self.model, price=self.price, stage=stage, n_in=n_in,
                           n_out=n_out, latency_ms=((t1 or time.perf_counter()) - t0) * 1000.0,
                           error=None if error is None else str(error), usage_counted=counted)

    # -- the LLM protocol -----------------------------------------------------------------

    def chat(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        stop: Sequence[str] | None = None,
        stage: str = "answer",
        ledger: Ledger | None = None,
        deadline: float | None = None,
    ) -> Completion:
        t0 = time.perf_counter()
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": [dict(m) for m in messages],
            "max_tokens": max_tokens,
            "temperature": temperature,
        }
        if stop:
            payload["stop"] = list(stop)
        data: dict[str, Any] = {}
        try:
            data = self._post(payload, deadline)
            choice = self._first_choice(data)
            message = choice.get("message")
            if isinstance(message, dict):
                text = message.get("content")
                if text is None or (isinstance(text, str) and not text.strip()):
                    raise ProviderError(
                        f"{self.chat_url} returned a message with no text (content "
                        f"{text!r}, finish_reason {choice.get('finish_reason')!r})",
                        endpoint=self.chat_url, status=200)
            elif isinstance(choice.get("text"), str):  # completions-style servers
                text = choice["text"]
            else:
                raise ProviderError(
                    f"{self.chat_url} returned a choice without a message: {str(choice)[:200]}",
                    endpoint=self.chat_url,
                    status=200,
                )
            if not isinstance(text, str):
                raise ProviderError(
                    f"{self.chat_url} returned non-text content: {str(text)[:200]}",
                    endpoint=self.chat_url,
                    status=200,
                )
        except ProviderError as exc:
            self._record(ledger, stage, t0, self._billed(exc, data, messages), error=exc)
            raise
        t1 = time.perf_counter()
        rec = self._record(ledger, stage, t0, self._usage(data, messages, text), t1=t1)
        return Completion(text=text, record=rec, finish_reason=str(choice.get("finish_reason") or ""))

    def choice_probs(
        self,
        messages: Sequence[Message],
        choices: Mapping[str, Sequence[str]],
        *,
        stage: str = "router",
        ledger: Ledger | None = None,
        deadline: float | None = None,
    ) -> dict[str, float]:
        """Group probabilities from the top next-token logprobs of a one-token completion.

        Variants match a returned token case-insensitively after stripping whitespace, so
        "Yes", " yes" and "YES" all count for a group listing "yes". Fails when none appears.
        """
        t0 = time.perf_counter()
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": [dict(m) for m in messages],
            "max_tokens": 1,
            "temperature": 0.0,
            "logprobs": True,
            "top_logprobs": TOP_LOGPROBS,
        }
        data: dict[str, Any] = {}
        try:
            data = self._post(payload, deadline)
            top = self._top_logprobs(self._first_choice(data))
            probs = _group_probs(top, choices)
            if probs is None:
                seen = ", ".join(repr(t) for t, _ in top[:8])
                raise ProviderError(
                    f"{self.chat_url}: none of the variants of {sorted(choices)} is among the "
                    f"top {len(top)} next tokens (saw {seen})",
                    endpoint=self.chat_url,
                    status=200,
                )
        except ProviderError as exc:
            self._record(ledger, stage, t0, self._billed(exc, data, messages), error=exc)
            raise
        t1 = time.perf_counter()
        text = top[0][0] if top else ""
        self._record(ledger, stage, t0, self._usage(data, messages, text), t1=t1)
        return probs

    def _top_logprobs(self, choice: dict[str, Any]) -> list[tuple[str, float]]:
        """(token, logprob) pairs at the first generated position, in either API shape."""
        lp = choice.get("logprobs")
        out: list[tuple[str, float]] = []
        if isinstance(lp, dict):
            content = lp.get("content")
            if isinstance(content, list) and content and isinstance(content[0], dict):
                first = content[0]
                for alt in first.get("top_logprobs") or []:
                    if isinstance(alt, dict) and isinstance(alt.get("token"), str):
                        out.append((alt["token"], _logprob(alt.get("logprob"))))
                if not out and isinstance(first.get("token"), str):
                    out.append((first["token"], _logprob(first.get("logprob"))))
            elif isinstance(lp.get("top_logprobs"), list) and lp["top_logprobs"]:
                head = lp["top_logprobs"][0]  # legacy completions: [{token: logprob}, ...]
                if isinstance(head, dict):
                    out = [(str(t), _logprob(v)) for t, v in head.items()]
        if not out:
            raise ProviderError(
                f"{self.chat_url} returned no logprobs; the server may not support "
                "logprobs=True/top_logprobs (a llama.cpp server needs logits_all)",
                endpoint=self.chat_url,
                status=200,
            )
        return out


def _group_probs(
    top: Sequence[tuple[str, float]], choices: Mapping[str, Sequence[str]]
) -> dict[str, float] | None:
    """Sum each group's matching token probabilities and normalise; None if nothing matched."""
    keys = {label: {v.strip().casefold() for v in variants if v.strip()}
            for label, variants in choices.items()}
    mass = dict.fromkeys(choices, 0.0)
    seen: set[str] = set()
    for token, logprob in top:
        if token in seen:
            continue
        seen.add(token)
        key = token.strip().casefold()
        for label, wanted in keys.items():
            if key in wanted:
                mass[label] += math.exp(logprob)
                break
    total = sum(mass.values())
    if total <= 0:
        return None
    return {label: m / total for label, m in mass.items()}


__all__ = ["ENV_API_KEY", "ENV_BASE_URL", "ENV_MODEL", "OpenAIHTTP"]


def _logprob(value: Any) -> float:
    """A logprob from a response; a missing, null or non-numeric one counts as impossible."""
    try:
        return float(value) if value is not None else -math.inf
    except (TypeError, ValueError):
        return -math.inf
