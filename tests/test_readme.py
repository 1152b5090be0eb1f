"""Every Python snippet of the README runs as written, in order, in a fresh directory."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_the_readme_has_snippets_for_each_promise():
    text = "\n".join(snippets())
    for call in ("mem.add(", "mem.search(", "mem.ask(", "mem.render(", "m.items(", "m.forget(",
                 "StoreConfig"):
        assert call in text, call


@pytest.mark.llm
def test_every_readme_snippet_runs(tmp_path, monkeypatch, capsys):
    pytest.importorskip("llama_cpp")  # the snippets answer with the shipped local model
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "readme"}
    for i, code in enumerate(snippets()):
        try:
            exec(compile(code, f"README.md snippet {i + 1}", "exec"), namespace)  # noqa: S102
        except Exception as exc:  # name the snippet that broke
            pytest.fail(f"README snippet {i + 1} failed: {type(exc).__name__}: {exc}\n{code}")
    out = capsys.readouterr().out
    assert "Lisbon" in out  # the search printed the turn it found
    assert "step 2 action python -m pytest" in out  # the agent snippet: the named step came first
    from suffice import Memory
    with Memory(tmp_path / "memory.db", embedder=None) as mem:
        assert mem.items(user_id="ana")[0].text.startswith("I moved to Lisbon")
    with Memory(tmp_path / "mem0_quickstart.db", embedder=None) as m:
        assert m.items(user_id="alice") == [] and len(m.audit()) == 2  # both forgets ran
