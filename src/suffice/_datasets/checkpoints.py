"""Checkpoint questions on agent runs: moments where the agent needs something it saw earlier.

A checkpoint sits just before step ``j`` of a run: what happened before it (``items[:at_item]``)
is the history a memory holds, and the question asks for something the agent met at an earlier
step ``i``, whose item ids are the evidence. A benchmark renders memory for the question at a
budget and checks whether the evidence items are in it. The builders follow the recipes of the
agent data's README, deterministically (no model, no randomness):

- SWE-bench, **re-views** (:func:`swe_re_views`): the command of step ``j`` shows a file (``cat``,
  ``sed -n``, ``nl``, ``head``, ``tail``) that an earlier step showed; the evidence is the
  output of the latest earlier step that showed the same file (the whole file, the same
  expression, or at least half of the same lines).
- SWE-bench, **discovered values** (:func:`swe_discovered_values`): a file path, or a line number
  of a file, that the command of step ``j`` uses and that first appeared in the output of an
  earlier step (``grep -n``, ``find``, a traceback), not in the task or anything the agent wrote
  before.
- τ / τ²-bench, **value reuse** (:func:`tau_value_reuses`): an argument value (at least 5
  characters) of an agent tool call that first appeared in an earlier tool result the agent
  got and that the user never typed.
- AMA-Bench: the questions the dataset ships, with the items of the steps they cite as
  evidence (:func:`ama_checkpoints`, :func:`ama_evidence_ids`, :func:`is_step_range_question`).

By default a value counts once, at its first use: later uses could be copied from the agent's own
earlier call rather than recalled from the evidence.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._types import NewItem
from .ama import AmaEpisode, AmaQuestion, cited_steps
from .trajectories import Trajectory

CHECKPOINT_KINDS = ("re_view", "discovered_path", "discovered_line", "value_reuse", "ama")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A question asked just before step ``at_step`` of the run in scope ``trajectory``."""

    trajectory: str
    """The run's scope (:attr:`Trajectory.scope`)."""
    at_step: int
    """Items with ``meta['step'] < at_step`` have happened; the step itself has not."""
    question: str
    answer: str
    evidence_ids: tuple[str, ...]
    """Ids the importer gave the items that hold the answer, all before the checkpoint."""
    kind: str
    """One of :data:`CHECKPOINT_KINDS`."""
    at_item: int = 0
    """Index into the trajectory's items of the first item at ``at_step``: ``items[:at_item]``
    is the history."""
    evidence_step: int = 0
    """The latest step among the evidence items."""
    detail: dict[str, Any] = field(default_factory=dict)
    """What the builder matched (file and lines, value, tool, …), for reports."""

    @property
    def gap(self) -> int:
        """Steps (SWE, AMA) or messages (τ) between the evidence and the checkpoint."""
        return self.at_step - self.evidence_step


def _checkpoint(traj: Trajectory, at_step: int, question: str, answer: str, evidence: Sequence[NewItem],
                kind: str, **detail: Any) -> Checkpoint:
    ids = tuple(str(it.id) for it in evidence)
    return Checkpoint(traj.scope, at_step, question, answer, ids, kind, traj.first_index_of_step(at_step),
                      max(int(it.meta["step"]) for it in evidence), detail)


# -- reading shell commands -----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class View:
    """What one pipeline of a command prints of a file: lines ``lo``..``hi`` (``hi`` None: to the
    end), or, when the lines cannot be told (``tail -n 20``, ``sed -n '/def f/,/return/p'``), the
    expression that selects them in ``key``."""

    path: str
    lo: int = 1
    hi: int | None = None
    key: str = ""

    @property
    def whole(self) -> bool:
        return self.lo == 1 and self.hi is None and not self.key

    def label(self) -> str:
        if self.whole:
            return self.path
        if self.key:
            return f"{self.path} ({self.key})"
        if self.lo == self.hi:
            return f"{self.path} (line {self.lo})"
        return f"{self.path} (lines {self.lo}–{self.hi if self.hi is not None else 'end'})"

    def shown_by(self, earlier: View) -> bool:
        """Whether ``earlier`` printed what this view prints: the whole file, the same
        expression, or at least half of these lines."""
        if self.path != earlier.path:
            return False
        if earlier.whole:
            return True
        if self.key or earlier.key:
            return self.key == earlier.key and self.lo == earlier.lo and self.hi == earlier.hi
        if self.hi is None:
            return earlier.hi is None and earlier.lo <= self.lo
        top = self.hi if earlier.hi is None else min(self.hi, earlier.hi)
        overlap = top - max(self.lo, earlier.lo) + 1
        return overlap * 2 >= self.hi - self.lo + 1


_SED_RANGE = re.compile(r"^(\d+)(?:,(\d+|\$))?p$")
_NUM_OPT = re.compile(r"^-(?:n)?(\d+)$")
_OPS = {"&&", "||", ";", "&", "\n"}
_ROOT = "/testbed"
"""Where mini-SWE-agent runs every command (each in a fresh shell: ``cd`` lasts one command)."""


def _tokens(command: str) -> list[str]:
    """Shell tokens with ``|``, ``&&``, ``;``, redirections as their own tokens; [] when the
    command is not plain shell (a here-document, an unbalanced quote)."""
    if "<<" in command:
        command = command[:command.index("<<")]
        command = command[:max(command.rfind("&&"), command.rfind(";"), 0)]
    lex = shlex.shlex(command.replace("\n", " ; "), posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    try:
        return list(lex)
    except ValueError:
        return []


def _pipelines(command: str) -> Iterator[list[list[str]]]:
    """Each pipeline of ``command`` as its stages' argument lists (``cd DIR`` included)."""
    stages: list[list[str]] = [[]]
    for tok in _tokens(command):
        if tok in _OPS:
            if any(stages):
                yield stages
            stages = [[]]
        elif tok == "|":
            stages.append([])
        else:
            stages[-1].append(tok)
    if any(stages):
        yield stages


def _norm(path: str, cwd: str) -> str:
    full = posixpath.normpath(posixpath.join(cwd, path))
    return full[len(_ROOT) + 1:] if full.startswith(_ROOT + "/") else full


def _count(args: list[str], default: int) -> tuple[int | None, bool, list[str]]:
    """(N, from-line-N, files) of ``head``/``tail`` arguments (``-n N``, ``-N``, ``-n +N``)."""
    n: int | None = default
    plus = False
    files: list[str] = []
    k = 0
    while k < len(args):
        a = args[k]
        if a in ("-n", "--lines") and k + 1 < len(args):
            v = args[k + 1]
            plus = v.startswith("+")
            n = int(v.lstrip("+")) if v.lstrip("+").isdigit() else None
            k += 2
            continue
        m = _NUM_OPT.match(a)
        if m:
            n = int(m.group(1))
        elif a.startswith("-"):
            n = None if a.startswith("-c") else n
        else:
            files.append(a)
        k += 1
    return n, plus, files


def _sed_print(args: list[str]) -> tuple[str, list[str]] | None:
    """(expression, files) of ``sed -n EXPR [FILE...]``; None for any other sed."""
    if "-n" not in args and "--quiet" not in args:
        return None
    rest = [a for a in args if a not in ("-n", "--quiet")]
    if any(a.startswith("-i") for a in rest):
        return None
    if rest and rest[0] == "-e" and len(rest) > 1:
        rest = rest[1:]
    if not rest or rest[0].startswith("-"):
        return None
    return rest[0], rest[1:]


def _lines(expr: str) -> tuple[int, int | None, str]:
    m = _SED_RANGE.match(expr.strip())
    if not m:
        return 1, None, f"sed -n '{expr}'"
    lo = int(m.group(1))
    hi = None if m.group(2) == "$" else int(m.group(2) or lo)
    return lo, hi, ""


def file_views(command: str) -> list[View]:
    """The files (and lines) a shell command prints, as far as a plain reading tells: a pipeline
    that starts with ``cat``, ``nl``, ``sed -n``, ``head`` or ``tail`` on files and goes on (if at
    all) through ``sed -n``, ``head``, ``tail`` or ``cat`` only, and writes to no file."""
    out: list[View] = []
    cwd = _ROOT
    for stages in _pipelines(command):
        first = stages[0]
        if first and first[0] == "cd" and len(stages) == 1:
            cwd = posixpath.normpath(posixpath.join(cwd, first[1])) if len(first) > 1 else _ROOT
            continue
        stripped = [_redirects(st) for st in stages]
        if any(writes for _, writes in stripped):
            continue
        views = _source(stripped[0][0], cwd)
        for st, _ in stripped[1:]:
            views = [v for v in (_narrow(v, st) for v in views) if v is not None]
        out.extend(views)
    return out


def _redirects(args: list[str]) -> tuple[list[str], bool]:
    """(the stage's arguments without its redirections, whether it sends its output elsewhere
    than the screen); error output sent anywhere is no matter."""
    out: list[str] = []
    writes = False
    k = 0
    while k < len(args):
        tok = args[k]
        if tok in (">", ">>", ">|", "&>", ">&", "<"):
            if out and out[-1] == "2" and tok != "<":
                out.pop()
            elif tok != "<" and not (tok == ">&" and k + 1 < len(args) and args[k + 1] == "1"):
                writes = True
            k += 2
            continue
        out.append(tok)
        k += 1
    return out, writes


def _source(args: list[str], cwd: str) -> list[View]:
    if not args:
        return []
    cmd, clean = posixpath.basename(args[0]), args[1:]
    if cmd == "cat":
        return [View(_norm(a, cwd)) for a in clean if not a.startswith("-")]
    if cmd == "nl":
        files, k = [], 0
        while k < len(clean):
            if clean[k] in ("-b", "-n", "-w", "-s", "-v", "-i"):
                k += 2
                continue
            if not clean[k].startswith("-"):
                files.append(clean[k])
            k += 1
        return [View(_norm(a, cwd)) for a in files]
    if cmd == "sed":
        got = _sed_print(clean)
        if got is None:
            return []
        lo, hi, key = _lines(got[0])
        return [View(_norm(a, cwd), lo, hi, key) for a in got[1]]
    if cmd in ("head", "tail"):
        n, plus, files = _count(clean, 10)
        if n is None:
            return []
        if cmd == "head":
            return [View(_norm(a, cwd), 1, n) for a in files]
        if plus:
            return [View(_norm(a, cwd), n, None) for a in files]
        return [View(_norm(a, cwd), 1, None, f"tail -n {n}") for a in files]
    return []


def _narrow(v: View, args: list[str]) -> View | None:
    """``v`` after one more pipeline stage, or None when the stage filters (``grep``, ``awk``)."""
    if not args:
        return None
    cmd, rest = posixpath.basename(args[0]), args[1:]
    if cmd in ("cat", "less", "more") and all(a.startswith("-") for a in rest):
        return v
    if v.key:
        return None
    if cmd == "sed":
        got = _sed_print(rest)
        if got is None or got[1]:
            return None
        lo, hi, key = _lines(got[0])
        if key:
            return None
        new_lo = v.lo + lo - 1
        new_hi = None if hi is None else v.lo + hi - 1
        if v.hi is not None:
            new_hi = v.hi if new_hi is None else min(new_hi, v.hi)
        return View(v.path, new_lo, new_hi)
    if cmd == "head":
        n, _, files = _count(rest, 10)
        if n is None or files:
            return None
        top = v.lo + n - 1
        return View(v.path, v.lo, top if v.hi is None else min(top, v.hi))
    if cmd == "tail":
        n, plus, files = _count(rest, 10)
        if n is None or files:
            return None
        if plus:
            return View(v.path, v.lo + n - 1, v.hi)
        if v.hi is not None:
            return View(v.path, max(v.lo, v.hi - n + 1), v.hi)
        return View(v.path, 1, None, f"tail -n {n}") if v.lo == 1 else None
    return None


_RC = re.compile(r"<returncode>(-?\d+)</returncode>")


def _succeeded(observation: str) -> bool:
    m = _RC.search(observation[:200])
    if not m or m.group(1) != "0":
        return False
    body = observation[m.end():]
    body = re.sub(r"</?output(?:_head|_tail)?>|<warning>.*?</warning>|<elided_chars>.*?</elided_chars>", "",
                  body, flags=re.DOTALL)
    return bool(body.strip())


def _steps(traj: Trajectory) -> dict[int, dict[str, NewItem]]:
    out: dict[int, dict[str, NewItem]] = {}
    for it in traj.items:
        out.setdefault(int(it.meta["step"]), {}).setdefault(it.kind, it)
    return out


# -- SWE-bench: re-views --------------------------------------------------------------------------

def swe_re_views(traj: Trajectory, min_gap: int = 1, same_lines: bool = True) -> list[Checkpoint]:
    """Re-views of one mini-SWE-agent run whose evidence is at least ``min_gap`` steps back;
    one per (step, file view). ``same_lines=False`` takes the latest earlier view of the same
    file whatever lines it showed (the README's rough scan), so the evidence may not hold the
    lines asked about."""
    steps = _steps(traj)
    shown: list[tuple[int, View]] = []  # views whose output was real, in step order
    out: list[Checkpoint] = []
    for j in sorted(s for s in steps if s >= 0):
        action = steps[j].get("action")
        if action is None:
            continue
        views = list(dict.fromkeys(file_views(action.text)))
        for v in views:
            i = next((s for s, w in reversed(shown)
                      if (v.shown_by(w) if same_lines else v.path == w.path)), None)
            if i is None or j - i < min_gap:
                continue
            ev = steps[i]["observation"]
            out.append(_checkpoint(traj, j, f"What did {v.label()} contain when it was last shown?",
                                   ev.text, [ev], "re_view", path=v.path, lines=[v.lo, v.hi], key=v.key))
        obs = steps[j].get("observation")
        if obs is not None and _succeeded(obs.text):
            shown.extend((j, v) for v in views)
    return out


# -- SWE-bench: discovered paths and line numbers -------------------------------------------------

_PATH = re.compile(r"(?<![\w.\-/])(?:\./|/testbed/)?"
                   r"((?:[\w\-.]+/)+[\w\-]+(?:\.[\w\-]+)*\.[A-Za-z]\w*)(?![\w\-/])")
"""A relative file path with a directory and an extension, as commands and outputs write it."""
_SED_EDIT = re.compile(r"sed\s+-i\S*\s+['\"]?(\d+)(?:,(\d+))?\s*[acdis]")


def _mentions(text: str, path: str) -> bool:
    if path not in text:
        return False
    pat = re.compile(r"(?:(?<=/testbed/)|(?<=\./)|(?<= a/)|(?<= b/)|(?<![\w.\-/]))" + re.escape(path)
                     + r"(?![\w\-/]|\.\w)")
    return pat.search(text) is not None


def _paths(command: str) -> list[str]:
    out = []
    for m in _PATH.finditer(command):
        p = m.group(1)
        if p.startswith("/") or "//" in p or p in out:
            continue
        out.append(p)
    return out


def _line_uses(command: str) -> list[tuple[str, int]]:
    """(file, line number) pairs a command addresses: ``sed -n 'A,Bp' F`` (and through ``nl``),
    ``sed -i 'N…' F``."""
    uses: list[tuple[str, int]] = []
    for v in file_views(command):
        if not v.key and not v.whole:
            uses.extend((v.path, n) for n in (v.lo, v.hi) if n is not None and n > 1)
    for m in _SED_EDIT.finditer(command):
        tail = _paths(command[m.end():])
        if tail:
            uses.extend((tail[0], int(n)) for n in m.groups() if n)
    return list(dict.fromkeys(uses))


def _locates(observation: str, action: str, path: str, n: int) -> str | None:
    """The text of the line ``observation`` reports as line ``n`` of ``path`` (a ``grep -n`` hit,
    a ``file:line`` reference, a traceback frame), or None when it does not."""
    name = posixpath.basename(path)
    base = r"(?<![\w.\-])" + re.escape(name)
    if f"{name}:{n}" in observation:
        m = re.search(rf"(?m){base}:{n}(?::(.*)$|\b(.*)$)", observation)
        if m:
            return (m.group(1) if m.group(1) is not None else m.group(2)).strip()
    if f'{name}", line {n}' in observation:
        m = re.search(rf"(?m){base}\", line {n}\b.*\n\s*(.*)$", observation)
        if m:
            return m.group(1).strip()
    if (observation.find(f"\n{n}:") >= 0 or observation.find(f"\n{n}-") >= 0) \
            and re.search(r"\bgrep\b[^|]*\s-\w*n", action) and len(_paths(action)) == 1 \
            and _mentions(action, path):
        m = re.search(rf"(?m)^{n}[:-](.*)$", observation)
        if m:
            return m.group(1).strip()
    return None


def swe_discovered_values(traj: Trajectory, min_gap: int = 1, first_use: bool = True) -> list[Checkpoint]:
    """Paths and line numbers of one mini-SWE-agent run that a command uses after an earlier
    output revealed them (see the module's notes); evidence at least ``min_gap`` steps back."""
    steps = _steps(traj)
    first_of: dict[str, NewItem | None] = {}
    located: dict[tuple[str, int], tuple[int, NewItem, str] | None] = {}
    out: list[Checkpoint] = []
    used_path: set[str] = set()
    used_line: set[tuple[str, int]] = set()
    for j in sorted(s for s in steps if s >= 0):
        action = steps[j].get("action")
        if action is None:
            continue
        for path in _paths(action.text):
            if path not in first_of:  # the first item of the whole run that names it
                first_of[path] = next((it for it in traj.items if _mentions(it.text, path)), None)
            first = first_of[path]
            if first is None or int(first.meta["step"]) >= j or first.kind != "observation" \
                    or (first_use and path in used_path):
                continue
            used_path.add(path)
            i = int(first.meta["step"])
            if j - i >= min_gap:
                out.append(_checkpoint(traj, j, f"What is the full path of {_short(path, first.text)}?",
                                       path, [first], "discovered_path", path=path))
        for path, n in _line_uses(action.text):
            if (path, n) not in located:
                located[(path, n)] = _first_location(traj, steps, path, n)
            found = located[(path, n)]
            if found is None or found[0] >= j or (first_use and (path, n) in used_line):
                continue
            used_line.add((path, n))
            i, obs, line = found
            if j - i >= min_gap:
                what = f"`{line[:100]}`" if line else "what an earlier output pointed to"
                out.append(_checkpoint(traj, j, f"At which line of {path} is {what}?", str(n), [obs],
                                       "discovered_line", path=path, line=n))
    return out


def _short(path: str, evidence: str) -> str:
    """The name a question gives a file: its base name, or with its folder when the evidence
    shows another file of that name (``__init__.py``, ``models.py``)."""
    name = posixpath.basename(path)
    if name == "__init__.py" or any(p != path and posixpath.basename(p) == name for p in _paths(evidence)):
        return "/".join(path.split("/")[-2:])
    return name


def _first_location(traj: Trajectory, steps: dict[int, dict[str, NewItem]], path: str,
                    n: int) -> tuple[int, NewItem, str] | None:
    """(step, observation, line text) of the first output that located line ``n`` of ``path``;
    None when none did, or when the task already names the number."""
    if re.search(rf"(?<![\w.]){n}(?![\w.])", traj.task):
        return None
    for s in sorted(k for k in steps if k >= 0):
        obs, act = steps[s].get("observation"), steps[s].get("action")
        if obs is not None and act is not None and str(n) in obs.text:
            line = _locates(obs.text, act.text, path, n)
            if line is not None:
                return s, obs, line
    return None


def swe_checkpoints(trajs: Iterable[Trajectory], min_gap: int = 1, first_use: bool = True,
                    same_lines: bool = True) -> list[Checkpoint]:
    """Re-views and discovered values of every run, in run and step order."""
    out: list[Checkpoint] = []
    for t in trajs:
        cps = swe_re_views(t, min_gap, same_lines) + swe_discovered_values(t, min_gap, first_use)
        out.extend(sorted(cps, key=lambda c: (c.at_step, c.kind)))
    return out


# -- τ / τ²-bench: value reuse --------------------------------------------------------------------

def _leaves(value: Any, key: str = "") -> Iterator[tuple[str, str]]:
    """(innermost key, text) of each string or number inside a JSON value."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, str(k))
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v, key)
    elif isinstance(value, str):
        yield key, value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield key, str(value)


def _arguments(item: NewItem) -> Any:
    tool = str(item.meta.get("tool", ""))
    text = item.text
    if not (text.startswith(tool + "(") and text.endswith(")")):
        return None
    try:
        return json.loads(text[len(tool) + 1:-1] or "{}")
    except ValueError:
        return None


def _agent_side(item: NewItem) -> bool:
    """Made by (or returned to) the agent: τ² says so in ``requestor``; in τ only the agent calls
    tools."""
    if "requestor" in item.meta:
        return bool(item.meta["requestor"] == "assistant")
    return item.kind == "tool_result" or item.speaker == "agent"


def tau_value_reuses(traj: Trajectory, min_chars: int = 5, min_gap: int = 1,
                     first_use: bool = True) -> list[Checkpoint]:
    """Argument values of the agent's tool calls in one τ / τ² run that first appeared in a tool
    result of the agent's and that no user message before the call holds; one per (call,
    value). ``min_gap`` counts messages."""
    items = traj.items
    out: list[Checkpoint] = []
    used: set[str] = set()
    for c, call in enumerate(items):
        if call.kind != "tool_call" or not _agent_side(call):
            continue
        j = int(call.meta["step"])
        args = _arguments(call)
        done: set[str] = set()
        for key, value in _leaves(args):
            if len(value) < min_chars or value in done or (first_use and value in used):
                continue
            done.add(value)
            pat = re.compile(r"(?<!\w)" + re.escape(value) + r"(?!\w)")
            before = [it for it in items[:c] if int(it.meta["step"]) < j]
            first = next((it for it in before if pat.search(it.text)), None)
            if first is None or first.kind != "tool_result" or not _agent_side(first):
                continue
            if any(it.kind == "user_message" and pat.search(it.text) for it in before):
                continue
            used.add(value)
            i = int(first.meta["step"])
            if j - i < min_gap:
                continue
            tool = str(call.meta.get("tool", ""))
            what = key.replace("_", " ") if key else "value"
            out.append(_checkpoint(traj, j, f"Which {what} should the {tool} call use?", value, [first],
                                   "value_reuse", tool=tool, key=key, value=value,
                                   source_tool=first.meta.get("tool")))
    return out


def tau_checkpoints(trajs: Iterable[Trajectory], min_chars: int = 5, min_gap: int = 1,
                    first_use: bool = True) -> list[Checkpoint]:
    out: list[Checkpoint] = []
    for t in trajs:
        out.extend(tau_value_reuses(t, min_chars, min_gap, first_use))
    return out


# -- AMA-Bench ------------------------------------------------------------------------------------

def ama_evidence_ids(episode: AmaEpisode, question: AmaQuestion) -> tuple[str, ...]:
    """Ids of the items (action or thought, and observation) of the steps ``question`` cites."""
    cited = set(question.steps)
    return tuple(str(it.id) for it in episode.items if it.meta["step"] in cited)


def is_step_range_question(question: AmaQuestion) -> bool:
    """A recall question (type A) whose own text names the steps it is about ("at step 78",
    "between step 73 and 76"): a step-aware memory can fetch those items directly."""
    return question.type == "A" and bool(question.steps) and bool(cited_steps(question.question, 1 << 30))


def ama_checkpoints(episode: AmaEpisode) -> list[Checkpoint]:
    """The episode's questions that cite steps, asked after the run as AMA-Bench asks them, the
    cited steps' items as evidence; ``detail`` has the type, the question's index and whether it
    is a step-range question."""
    from .trajectories import ama_trajectory
    traj = ama_trajectory(episode)
    end = max((int(it.meta["step"]) for it in episode.items), default=-1) + 1
    by_id = {it.id: it for it in episode.items}
    out = []
    for qi, q in enumerate(episode.questions):
        ids = ama_evidence_ids(episode, q)
        if not ids:
            continue
        out.append(_checkpoint(traj, end, q.question, q.answer, [by_id[i] for i in ids], "ama", type=q.type,
                               index=qi, step_range=is_step_range_question(q), steps=list(q.steps)))
    return out
