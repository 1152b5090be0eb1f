"""Shipped models (assembly, checksums, lookup) and the in-process llama.cpp backend."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from llm_server import have_llama_cpp, smollm2_path

from suffice._errors import MissingExtraError, ModelFileError
from suffice._llm import Ledger, LocalLlama, Message, make_llm
from suffice._llm import models as m

# -- assembly and checksums (no model needed) ---------------------------------------------------


def _parts(tmp_path: Path, chunks: list[bytes]) -> list[Path]:
    paths = []
    for i, chunk in enumerate(chunks, 1):
        p = tmp_path / f"part{i:02d}.bin"
        p.write_bytes(chunk)
        paths.append(p)
    return paths


def test_assemble_joins_parts_in_order_and_checks_hash(tmp_path: Path) -> None:
    chunks = [b"GGUF-first-", b"second-", b"third"]
    whole = b"".join(chunks)
    dest = tmp_path / "cache" / "model.gguf"
    out = m.assemble(_parts(tmp_path, chunks), dest, hashlib.sha256(whole).hexdigest(), len(whole))
    assert out == dest and dest.read_bytes() == whole
    assert [p.name for p in dest.parent.iterdir()] == ["model.gguf"]  # no temp file left


def test_assemble_rejects_wrong_hash_and_leaves_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "cache" / "model.gguf"
    with pytest.raises(ModelFileError, match="sha256"):
        m.assemble(_parts(tmp_path, [b"abc", b"def"]), dest, "0" * 64, 6)
    assert not dest.exists()
    assert list(dest.parent.iterdir()) == []


def test_assemble_rejects_wrong_size(tmp_path: Path) -> None:
    data = b"abcdef"
    with pytest.raises(ModelFileError, match="6 bytes, expected 7"):
        m.assemble(_parts(tmp_path, [data]), tmp_path / "x.gguf", hashlib.sha256(data).hexdigest(), 7)


def test_verify_rejects_a_corrupted_copy(tmp_path: Path) -> None:
    good = b"GGUF" + bytes(range(200))
    pinned = hashlib.sha256(good).hexdigest()
    f = tmp_path / "model.gguf"
    f.write_bytes(good)
    m.verify_sha256(f, pinned)
    f.write_bytes(good + b"\x00")  # damaged (one byte longer)
    with pytest.raises(ModelFileError, match="corrupted or not the pinned model"):
        m.verify_sha256(f, pinned)


def test_shipped_model_is_assembled_once_into_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fake two-part shipped model, found as installed packages; a damaged cache self-heals."""
    site = tmp_path / "site"
    chunks = [b"GGUF" + b"a" * 100, b"b" * 50]
    for i, chunk in enumerate(chunks, 1):
        pkg = site / f"fake_model_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(chunk)
    monkeypatch.syspath_prepend(str(site))
    whole = b"".join(chunks)
    fake = m.ShippedModel(
        name="fake", description="", filename="fake.gguf",
        parts=(("fake_model_part1", "data/part01.bin"), ("fake_model_part2", "data/part02.bin")),
        sha256=hashlib.sha256(whole).hexdigest(), size=len(whole), install="pip install fake",
    )
    monkeypatch.setenv("SUFFICE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setitem(m.MODELS, "fake", fake)
    path = m.resolve_model("fake")
    assert path == tmp_path / "cache" / "models" / "fake.gguf"
    assert path.read_bytes() == whole
    path.write_bytes(b"GGUF" + b"x" * (len(whole) - 4))  # same size, wrong content
    os.utime(path, ns=(1, 1))  # a distinct mtime even on a coarse-clock filesystem
    assert m.resolve_model("fake").read_bytes() == whole


def test_missing_parts_name_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = m.ShippedModel(
        name="absent", description="", filename="absent.gguf",
        parts=(("no_such_package_xyz", "data/part01.bin"),), sha256="0" * 64, size=1,
        install="pip install no-such-package-xyz",
    )
    monkeypatch.setitem(m.MODELS, "absent", fake)
    with pytest.raises(ModelFileError, match="pip install no-such-package-xyz"):
        m.resolve_model("absent")


def test_user_paths_must_exist_and_be_gguf(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="no model file"):
        m.resolve_model(tmp_path / "missing.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model")
    with pytest.raises(ModelFileError, match="not a GGUF"):
        m.resolve_model(str(bad))
    ok = tmp_path / "mine.gguf"
    ok.write_bytes(b"GGUF\x03\x00\x00\x00")
    assert m.resolve_model(str(ok)) == ok
    assert m.model_name(str(ok)) == "mine"


def test_pinned_hashes() -> None:
    assert m.QWEN.sha256.startswith("1d961463") and m.QWEN.sha256.endswith("4ff32")
    assert m.QWEN.size == 491_400_064
    assert m.DEFAULT_MODEL == "qwen2.5-0.5b"
    assert m.model_name(None) == "qwen2.5-0.5b"
    assert m.model_name("SmolLM2") == "smollm2-135m"


def test_missing_llama_cpp_is_a_missing_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # makes `import llama_cpp` fail
    with pytest.raises(MissingExtraError, match=r"suffice\[local\]"):
        LocalLlama("smollm2-135m")


# -- the real thing with SmolLM2 ---------------------------------------------------------------


@pytest.fixture(scope="module")
def smol() -> Iterator[LocalLlama]:
    path = smollm2_path()
    yield LocalLlama(path, n_ctx=2048, n_threads=2)


@pytest.mark.llm
def test_local_chat_answers(smol: LocalLlama) -> None:
    ledger = Ledger()
    out = smol.chat(
        [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
        max_tokens=8,
        stage="answer",
        ledger=ledger,
    )
    assert "paris" in out.text.lower()
    rec = ledger.records[0]
    assert rec.ok and rec.input_tokens > 5 and 0 < rec.output_tokens <= 8
    assert rec.cost_usd == 0.0 and rec.model == "SmolLM2-135M-Instruct.Q4_1"


@pytest.mark.llm
def test_a_prompt_longer_than_the_window_widens_it_up_to_what_the_model_was_trained_on() -> None:
    from suffice import ProviderError

    small = LocalLlama(smollm2_path(), n_ctx=512, n_threads=2)
    notes = " ".join(f"Gauge {i} read {i % 7}.{i % 10} metres on day {i}." for i in range(120))
    ask = [{"role": "user", "content": notes + " What did gauge 3 read? Answer briefly."}]
    need = len(small.prompt_tokens(ask)) + 8
    assert need > 512
    out = small.chat(ask, max_tokens=8)  # a 512-token window would refuse it
    assert out.text and need <= small.n_ctx <= small._llm._model.n_ctx_train()
    # Past the model's own context length nothing is loaded: the call fails with a clear error.
    trained = small._llm._model.n_ctx_train()
    huge = [{"role": "user", "content": "word " * (trained + 100)}]
    window, model = small.n_ctx, small._llm
    with pytest.raises(ProviderError, match="context window"):
        small.chat(huge, max_tokens=4)
    assert small.n_ctx == window and small._llm is model  # not loaded again for nothing


@pytest.mark.llm
def test_the_first_call_under_a_deadline_is_judged_by_a_probe_not_run_blind() -> None:
    import time

    from suffice import DeadlineError

    fresh = LocalLlama(smollm2_path(), n_ctx=4096, n_threads=2)  # no call yet: no measured rate
    real, read = fresh._llm, []

    class Spy:  # what llama.cpp was asked to read (a timed check would fail on a busy machine)
        def __getattr__(self, name: str) -> object:
            got = getattr(real, name)
            if not name.startswith("create_"):
                return got
            return lambda *a, **kw: read.append(str(a[0] if a else kw)) or got(*a, **kw)

    fresh._llm = Spy()
    long: list[Message] = [{"role": "user", "content": "zebra " * 3000}]
    with pytest.raises(DeadlineError, match="not started"):
        fresh.chat(long, max_tokens=4, deadline=time.monotonic() + 0.2)
    assert len(read) == 1 and "zebra" not in read[0]  # the short probe only, never the 3,000 tokens
    probed = fresh._s_per_token
    fresh.chat([{"role": "user", "content": "Say yes."}], max_tokens=2)
    assert fresh._s_per_token != probed and not fresh._probed  # the first real call's rate replaces it


@pytest.mark.llm
def test_local_choice_probs_sum_to_one(smol: LocalLlama) -> None:
    messages: list[Message] = [
        {"role": "user", "content": "Is the sky blue on a clear day? Answer Yes or No."}
    ]
    ledger = Ledger()
    probs = smol.choice_probs(messages, {"yes": ["Yes", " yes"], "no": ["No", " no"]},
                              ledger=ledger)
    assert set(probs) == {"yes", "no"}
    assert sum(probs.values()) == pytest.approx(1.0)
    assert ledger.records[0].stage == "router" and ledger.records[0].output_tokens == 0
    # the probe leaves the model usable for ordinary chat
    assert smol.chat(messages, max_tokens=4).text


@pytest.mark.llm
def test_local_prompt_uses_the_chat_template(smol: LocalLlama) -> None:
    toks = smol.prompt_tokens([{"role": "user", "content": "hi"}])
    text = smol._llm.detokenize(toks, special=True).decode()
    assert text.endswith("<|im_start|>assistant\n")


@pytest.mark.llm
def test_make_llm_local_by_name() -> None:
    smollm2_path()
    llm = make_llm("local", model_path="smollm2-135m", n_ctx=512)
    assert llm.model == "smollm2-135m"


@pytest.mark.llm
@pytest.mark.skipif(not have_llama_cpp(), reason="llama-cpp-python is not installed")
def test_default_model_loads_when_installed() -> None:
    try:
        path = m.resolve_model()
    except ModelFileError as exc:
        pytest.skip(f"default model not installed: {exc}")
    llm = LocalLlama(path, n_ctx=512)
    probs = llm.choice_probs([{"role": "user", "content": "Is 2 bigger than 1? Answer Yes or No."}],
                             {"yes": ["Yes"], "no": ["No"]})
    assert sum(probs.values()) == pytest.approx(1.0)


def test_a_call_cut_by_the_deadline_bills_the_prompt_it_read() -> None:
    """llama.cpp reads the whole prompt before the deadline can stop it: that reading is
    on the ledger (here 900 prompt tokens), not a zero-token failure."""
    import threading
    import time

    import numpy as np

    from suffice._errors import DeadlineError
    from suffice._llm import Price

    class Stand:  # a stand-in for llama_cpp.Llama: no model is loaded
        def token_eos(self) -> int:
            return 0

        def create_chat_completion(self, messages, max_tokens, temperature, stop,  # type: ignore[no-untyped-def]
                                   logits_processor):
            time.sleep(0.3)  # the prompt, read whole
            n = 0
            for _ in range(max_tokens):
                scores = np.zeros(4)
                n += 1
                logits_processor[0](None, scores)
                if scores[1] == -np.inf:
                    break
            return {"choices": [{"message": {"content": "x"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 900, "completion_tokens": n}}

    class Cpp:
        LogitsProcessorList = list

    llm = LocalLlama.__new__(LocalLlama)
    llm.model, llm.endpoint, llm.price = "stand", "local:stand", Price(1.0, 1.0)
    llm._lock, llm._llm, llm._llama_cpp = threading.Lock(), Stand(), Cpp()
    llm._s_per_token, llm._probed, llm.n_ctx = 1e-9, False, 4096
    ledger = Ledger()
    with pytest.raises(DeadlineError, match="during generation"):
        llm.chat([{"role": "user", "content": "hi"}], max_tokens=50, ledger=ledger,
                 deadline=time.monotonic() + 0.1)
    rec = ledger.records[0]
    assert not rec.ok and rec.input_tokens == 900 and rec.cost_usd > 0


def test_a_cache_dir_that_is_a_file_or_a_provider_that_is_no_name_is_a_config_error(tmp_path, monkeypatch):
    from suffice import ConfigError, make_llm
    from suffice._llm.models import cache_dir

    f = tmp_path / "not-a-folder"
    f.write_text("x")
    monkeypatch.setenv("SUFFICE_CACHE_DIR", str(f))
    with pytest.raises(ConfigError, match="is a file"):
        cache_dir()
    with pytest.raises(ConfigError, match="provider must be a name"):
        make_llm(None)  # type: ignore[arg-type]


def test_own_model_files_of_one_name_and_size_have_different_identities(tmp_path: Path) -> None:
    """A replaced GGUF (another fine-tune or quantisation of the same size) must not replay the
    first one's cached answers: its identity reads the content, not just the name and size."""
    first, second, copy = (tmp_path / d / "model.gguf" for d in ("a", "b", "c"))
    body = os.urandom(3 << 20)
    for path, data in ((first, body), (second, body[:-10] + b"0123456789"), (copy, body)):
        path.parent.mkdir()
        path.write_bytes(m.GGUF_MAGIC + data)
    assert m.weights_identity(first, first) != m.weights_identity(second, second)
    assert m.weights_identity(first, first) == m.weights_identity(copy, copy)
    assert m.weights_identity(first, first).startswith("model.gguf ")


def test_shipped_models_are_known_by_name_and_size(tmp_path: Path) -> None:
    """Their pinned sha256 vouches for the content, and caches keyed so far stay valid."""
    path = tmp_path / "smollm2.gguf"
    path.write_bytes(m.GGUF_MAGIC + b"x" * 100)
    assert m.weights_identity("smollm2-135m", path) == f"smollm2.gguf {path.stat().st_size}"


@pytest.mark.llm
def test_a_loaded_model_is_cached_under_its_weights_identity(smol: LocalLlama) -> None:
    assert smol.identity == m.weights_identity(smollm2_path(), smollm2_path())
    assert len(smol.identity.split()) == 3  # loaded by path: name, size and content digest


def test_an_own_file_named_like_a_shipped_model_is_known_by_its_content(tmp_path: Path) -> None:
    """Its sha256 is never checked against the pin, whatever its name."""
    a, b = tmp_path / "a" / "qwen2.5-0.5b.gguf", tmp_path / "b" / "qwen2.5-0.5b.gguf"
    for path, tail in ((a, b"1"), (b, b"2")):
        path.parent.mkdir()
        path.write_bytes(m.GGUF_MAGIC + b"x" * 1000 + tail)
    assert m.weights_identity(a, a) != m.weights_identity(b, b)
    assert m.weights_identity(str(a), a) != m.weights_identity(str(b), b)
