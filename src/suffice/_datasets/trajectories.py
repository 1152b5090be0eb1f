"""Agent runs as items: mini-SWE-agent trajectories, τ-bench and τ²-bench logs, AMA-Bench episodes.

Every run becomes one :class:`Trajectory` whose items keep what happened in order, verbatim, with
one shared set of conventions so that a benchmark or the step-aware query path can treat all four
alike:

- ``kind`` is one of :data:`KINDS`: ``system`` (the agent's instructions), ``user_message``
  (the task or a customer's turn), ``message`` (the agent talking to the user), ``thought`` (the
  agent reasoning), ``action`` (a shell command or an environment move), ``observation`` (the
  environment's reply), ``tool_call`` (``name(arguments)``, the arguments as the JSON text the
  model wrote) and ``tool_result`` (the tool's reply).
- ``meta['step']`` is an int that orders the run: the agent's turn (SWE, AMA; the instructions
  and the task before the first turn are step -1) or the message's index (τ, τ²'s
  ``turn_idx``). ``meta['dataset']`` names the source format.
- ids are ``<scope>:<step>:<kind>`` (a second item of one kind at one step, such as a second tool
  call of one message, adds ``#1``, ``#2``, …): re-importing a run adds nothing.
- The scope is ``<dataset>-<name>``, one per run.

Texts are never cut, however long (the store pieces them for search); only NUL characters, which
no store takes, become U+2400 (the visible symbol for NUL), and lone surrogates U+FFFD. An empty
text (a tool that returned nothing) has no item.
"""

from __future__ import annotations

import functools
import gzip
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import ImportFormatError, InvalidInputError
from .._store.base import normalize_scope as _normalize
from .._types import NewItem
from .paths import shared_data_dir
from .text import clean

if TYPE_CHECKING:
    from .ama import AmaEpisode

KINDS = ("action", "observation", "tool_call", "tool_result", "thought", "user_message", "system", "message")
FORMATS = ("ama", "swe", "tau", "tau2")

_BASH = re.compile(r"```bash\s*\n(.*?)\n```", re.DOTALL)
"""mini-SWE-agent's own action pattern: a step runs only when its message holds exactly one match."""


@dataclass(frozen=True, slots=True)
class Trajectory:
    """One agent run, ready for ``Memory.add(list(t.items), scope=t.scope)``."""

    name: str
    """Unique within its dataset: the SWE-bench instance, ``<file stem>-<task>-<trial>`` (τ), the
    simulation id (τ²), ``<task type>-<episode>`` (AMA)."""
    dataset: str
    """One of :data:`FORMATS`."""
    source: str
    """The file it was read from."""
    items: tuple[NewItem, ...]
    task: str = ""
    """What the agent was asked to do, as the source states it."""
    success: bool | None = None
    """Resolved / reward 1 / ``state`` success; None when the file does not say."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Per-run facts of the source (task id, trial, reward, domain, …)."""

    @property
    def scope(self) -> str:
        # As the store will name it: two names that differ only in Unicode form (a file copied
        # from a Mac) or in surrounding spaces are one scope, so the duplicate checks see it.
        return normalize_scope(f"{self.dataset}-{self.name}", "run name")

    def first_index_of_step(self, step: int) -> int:
        """Index into ``items`` of the first item at ``step`` or later: ``items[:i]`` is what had
        happened just before that step (``len(items)`` when no item is that late)."""
        return next((i for i, it in enumerate(self.items) if it.meta["step"] >= step), len(self.items))


SWE_FORMAT = "mini-swe-agent-1"
"""The mini-SWE-agent trajectory format read here."""
SIDE_FILES = frozenset({"preds.json"})
"""Files a harness writes beside its runs that are no run (mini-SWE-agent's predictions)."""


def normalize_scope(name: str, what: str) -> str:
    """The store's form of a run's scope; a name it refuses is a format error of the file."""
    try:
        return _normalize(name, what)
    except InvalidInputError as exc:
        raise ImportFormatError(str(exc)) from None


class _Builder:
    """Items of one run with the shared id, step and dataset conventions."""

    def __init__(self, dataset: str, scope: str) -> None:
        self.dataset, self.scope = dataset, normalize_scope(scope, "run name")
        self.items: list[NewItem] = []
        self._seen: Counter[tuple[int, str]] = Counter()

    def add(self, text: str, *, step: int, kind: str, speaker: str, role: str, observed_at: str = "",
            **meta: Any) -> None:
        text = clean(text)
        if not text.strip():
            return
        n = self._seen[(step, kind)]
        self._seen[(step, kind)] += 1
        item_id = f"{self.scope}:{step}:{kind}" + (f"#{n}" if n else "")
        self.items.append(NewItem(text=text, speaker=speaker, role=role, kind=kind, observed_at=observed_at,
                                  meta={"step": step, "dataset": self.dataset, **meta}, id=item_id))


def _read(path: Path, what: str) -> Any:
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rt", encoding="utf-8") as fh:
                return json.load(fh)
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        raise ImportFormatError(f"{what} file not found: {path}") from None
    except (OSError, EOFError, ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ImportFormatError(f"{path}: not a {what} JSON file ({type(exc).__name__}: {exc})") from None


def _obj(d: dict[str, Any], key: str) -> dict[str, Any]:
    v = d.get(key)
    return v if isinstance(v, dict) else {}


def _str(d: dict[str, Any], key: str) -> str:
    v = d.get(key)
    return v if isinstance(v, str) else ""


def _text(value: object, where: str) -> str:
    """A message's text: a string (kept as it is, even 'None'), or nothing for null."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ImportFormatError(f"{where}: content must be a string or null, got {type(value).__name__}")
    return value


def _files(path: Path, what: str, suffixes: tuple[str, ...], deep: bool = False) -> list[Path]:
    """``path`` itself, or the files of that folder (and, ``deep``, of its subfolders) whose names
    end in one of ``suffixes``, manifests aside, sorted."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise ImportFormatError(f"{what} file or folder not found: {path}")
    files = sorted(f for f in (path.rglob("*") if deep else path.iterdir())
                   if f.is_file() and f.name.endswith(suffixes) and f.name != "manifest.json")
    if not files:
        raise ImportFormatError(f"{path}: no {what} files ({' or '.join(suffixes)})")
    return files


# -- mini-SWE-agent ------------------------------------------------------------------------------

def swe_default_path() -> Path:
    return shared_data_dir() / "agent" / "swebench_verified_mini_gemini3pro"


@functools.lru_cache(maxsize=16)
def _resolved(folder: Path) -> dict[str, bool]:
    """``resolved`` per instance from a ``manifest.json`` beside the files, when there is one
    (the trajectory files themselves do not say whether the patch passed)."""
    manifest = folder / "manifest.json"
    if not manifest.is_file():
        return {}
    try:
        raw = json.loads(manifest.read_text(encoding="utf-8"))
        return {str(e["instance_id"]): bool(e["resolved"]) for e in raw.get("items", [])
                if isinstance(e, dict) and "instance_id" in e and "resolved" in e}
    except (ValueError, AttributeError, TypeError):
        return {}


def swe_trajectory(path: str | Path, resolved: bool | None = None) -> Trajectory:
    """One mini-SWE-agent trajectory (``trajectory_format`` mini-swe-agent-1).

    Message 0 (the system prompt) and message 1 (the task) are step -1. Assistant message k of
    the run is step k: its text outside the command block becomes a ``thought``, the command it
    ran an ``action``; the user message after it (the command's output, or the harness's
    complaint) is that step's ``observation``. A message without exactly one ``bash`` block ran
    nothing (the harness refused it), so all of its text is the thought. Gemini's reasoning
    summary, which the agent never saw again (only ``content`` goes back into its context), is
    kept in the step's first item's ``meta['reasoning']`` rather than in its text.
    """
    p = Path(path)
    return _swe_from(p, _read(p, "mini-SWE-agent"), resolved)


def _swe_from(p: Path, raw: Any, resolved: bool | None) -> Trajectory:
    where = p.name
    if not isinstance(raw, dict) or not isinstance(raw.get("messages"), list):
        raise ImportFormatError(f"{where}: expected an object with a 'messages' list")
    fmt = raw.get("trajectory_format", "mini-swe-agent-1")
    if not isinstance(fmt, str) or not fmt.startswith("mini-swe-agent"):
        raise ImportFormatError(f"{where}: trajectory_format {fmt!r} is not mini-swe-agent's")
    if fmt != SWE_FORMAT:  # a later version fences its commands otherwise: read as 1, none would run
        raise ImportFormatError(f"{where}: trajectory_format {fmt!r} is not supported (only {SWE_FORMAT!r})")
    name = raw.get("instance_id") or p.name.split(".")[0]
    if not isinstance(name, str) or not name:
        raise ImportFormatError(f"{where}: instance_id must be a non-empty string")
    msgs: list[Any] = raw["messages"]
    if len(msgs) < 2:
        raise ImportFormatError(f"{where}: needs the system prompt and the task (messages 0 and 1)")
    b = _Builder("swe", f"swe-{name}")
    step = -1
    last = ""
    for i, m in enumerate(msgs):
        at = f"{where} message {i}"
        if not isinstance(m, dict):
            raise ImportFormatError(f"{at}: expected an object")
        role = m.get("role")
        text = _text(m.get("content"), at)
        if i < 2:
            want = ("system", "system") if i == 0 else ("user", "user_message")
            if role != want[0]:
                raise ImportFormatError(f"{at}: expected the {'system prompt' if i == 0 else 'task'} "
                                        f"(role {want[0]!r}), got role {role!r}")
            b.add(text, step=-1, kind=want[1], speaker=role, role=role)
        elif role == "assistant":
            step += 1
            reasoning = _reasoning(m)
            extra = {"reasoning": reasoning} if reasoning else {}
            blocks = list(_BASH.finditer(text))
            if len(blocks) == 1:
                blk = blocks[0]
                thought = (text[:blk.start()].rstrip() + "\n" + text[blk.end():].lstrip()).strip()
                if thought:
                    b.add(thought, step=step, kind="thought", speaker="agent", role="assistant", **extra)
                    extra = {}
                b.add(blk.group(1).strip(), step=step, kind="action", speaker="agent", role="assistant",
                      **extra)
            else:
                b.add(text, step=step, kind="thought", speaker="agent", role="assistant",
                      format_error=f"{len(blocks)} bash blocks", **extra)
        elif role == "user":
            # A run stopped by a limit (or an unhandled model error) ends with one more user
            # message right after an observation: the reason it stopped, kept as that step's exit.
            exit_note = last == "user" and i == len(msgs) - 1 and i > 2
            if last != "assistant" and not exit_note:
                raise ImportFormatError(f"{at}: an observation must follow an assistant message, "
                                        f"not {last!r}")
            note: dict[str, Any] = {"exit": True} if exit_note else {}
            b.add(text, step=step, kind="observation", speaker="environment", role="user", **note)
        else:
            raise ImportFormatError(f"{at}: role must be 'assistant' or 'user' after the task, got {role!r}")
        last = role if isinstance(role, str) else ""
    info = _obj(raw, "info")
    task = _text(msgs[1].get("content"), f"{where} message 1")
    return Trajectory(name, "swe", str(p), tuple(b.items), task, resolved,
                      {"exit_status": info.get("exit_status"), "steps": step + 1,
                       "submission": info.get("submission", "")})


def _reasoning(msg: dict[str, Any]) -> str:
    try:
        r = msg["extra"]["response"]["choices"][0]["message"].get("reasoning")
    except (KeyError, IndexError, TypeError, AttributeError):
        return ""
    return clean(r) if isinstance(r, str) and r.strip() else ""


def load_swe(path: str | Path | None = None) -> list[Trajectory]:
    """Every ``*.traj.json[.gz]`` of a folder (the shared copy by default), or one file, by name."""
    p = Path(path) if path is not None else swe_default_path()
    # mini-SWE-agent's batch runs write <out>/<instance>/<instance>.traj.json: subfolders too.
    files = _files(p, "mini-SWE-agent", (".traj.json.gz", ".traj.json"), deep=True)
    return _sorted([swe_trajectory(f, _resolved(f.parent).get(f.name.split(".")[0])) for f in files], p)


# -- τ-bench ---------------------------------------------------------------------------------------

def tau_default_path() -> Path:
    return shared_data_dir() / "agent" / "tau_bench_airline_gpt4o"


def _tool_call_text(name: str, args: str) -> str:
    return f"{name}({args})"


def _tau_runs(p: Path, raw: Any) -> list[Trajectory]:
    if not isinstance(raw, list):
        raise ImportFormatError(f"{p.name}: expected a list of runs ({{task_id, trial, reward, info, traj}})")
    # The whole name but its extensions: tau-bench's own names hold dots (a temperature of
    # "0.0"), and cutting at the first one gave two runs of different models one scope.
    stem = p.name.removesuffix(".gz").removesuffix(".json")
    out = []
    for r, run in enumerate(raw):
        at = f"{p.name} run {r}"
        if not isinstance(run, dict) or not isinstance(run.get("traj"), list):
            raise ImportFormatError(f"{at}: expected an object with a 'traj' list")
        task_id, trial = run.get("task_id"), run.get("trial", 0)
        if isinstance(task_id, bool) or not isinstance(task_id, (int, str)) or isinstance(trial, bool) \
                or not isinstance(trial, (int, str)):
            raise ImportFormatError(f"{at}: task_id and trial must be numbers or strings")
        name = f"{stem}-{task_id}-{trial}"
        b = _Builder("tau", f"tau-{name}")
        calls: dict[str, str] = {}
        for i, m in enumerate(run["traj"]):
            where = f"{at} message {i}"
            if not isinstance(m, dict):
                raise ImportFormatError(f"{where}: expected an object")
            role = m.get("role")
            text = _text(m.get("content"), where)
            if role == "system":
                b.add(text, step=i, kind="system", speaker="system", role="system")
            elif role == "user":
                b.add(text, step=i, kind="user_message", speaker="user", role="user")
            elif role == "assistant":
                b.add(text, step=i, kind="message", speaker="agent", role="assistant")
                for k, call in enumerate(_list(m.get("tool_calls"), where)):
                    fn = call.get("function") if isinstance(call, dict) else None
                    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                        raise ImportFormatError(f"{where} tool call {k}: needs function.name")
                    args = fn.get("arguments", "")
                    args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
                    call_id = str(call.get("id") or "")
                    calls[call_id] = fn["name"]
                    b.add(_tool_call_text(fn["name"], args), step=i, kind="tool_call", speaker="agent",
                          role="assistant", tool=fn["name"], tool_call_id=call_id)
            elif role == "tool":
                call_id = str(m.get("tool_call_id") or "")
                tool = _str(m, "name") or calls.get(call_id, "tool")
                b.add(text, step=i, kind="tool_result", speaker=tool, role="tool", tool=tool,
                      tool_call_id=call_id)
            else:
                raise ImportFormatError(f"{where}: role must be system, user, assistant or tool, "
                                        f"got {role!r}")
        task = _obj(_obj(run, "info"), "task")
        reward = run.get("reward")
        out.append(Trajectory(name, "tau", str(p), tuple(b.items), str(task.get("instruction", "")),
                              _won(reward), {"task_id": task_id, "trial": trial, "reward": reward}))
    return out


def _won(reward: object) -> bool | None:
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        return None
    return bool(reward >= 1)


def _list(value: object, where: str) -> list[Any]:
    """A list field that may be absent, null or the string 'None'."""
    if value is None or value == "None":
        return []
    if not isinstance(value, list):
        raise ImportFormatError(f"{where}: tool_calls must be a list, got {type(value).__name__}")
    return value


def load_tau(path: str | Path | None = None) -> list[Trajectory]:
    """Every run of a τ-bench trajectory file (``[{task_id, trial, reward, info, traj}]``), or of
    every such file of a folder (the shared copy by default), by name."""
    p = Path(path) if path is not None else tau_default_path()
    out = []
    for f in _files(p, "τ-bench", (".json", ".json.gz")):
        out.extend(_tau_runs(f, _read(f, "τ-bench")))
    return _sorted(out, p)


# -- τ²-bench --------------------------------------------------------------------------------------

def tau2_default_path() -> Path:
    return shared_data_dir() / "agent" / "tau2_telecom_gpt4o"


def _tau2_runs(p: Path, raw: Any) -> list[Trajectory]:
    if not isinstance(raw, dict) or not isinstance(raw.get("simulations"), list):
        raise ImportFormatError(f"{p.name}: expected an object with a 'simulations' list")
    out = []
    for s, sim in enumerate(raw["simulations"]):
        at = f"{p.name} simulation {s}"
        if not isinstance(sim, dict) or not isinstance(sim.get("messages"), list):
            raise ImportFormatError(f"{at}: expected an object with a 'messages' list")
        name = sim.get("id")
        if not isinstance(name, str) or not name.strip():
            raise ImportFormatError(f"{at}: needs an 'id'")
        b = _Builder("tau2", f"tau2-{name}")
        calls: dict[str, str] = {}
        for i, m in enumerate(sim["messages"]):
            where = f"{at} message {i}"
            if not isinstance(m, dict):
                raise ImportFormatError(f"{where}: expected an object")
            role = m.get("role")
            turn = m.get("turn_idx")
            step = turn if isinstance(turn, int) and not isinstance(turn, bool) else i
            when = _str(m, "timestamp")
            text = _text(m.get("content"), where)
            if role in ("assistant", "user"):
                speaker = "agent" if role == "assistant" else "user"
                b.add(text, step=step, kind="message" if role == "assistant" else "user_message",
                      speaker=speaker, role=role, observed_at=when)
                raw_args = _raw_arguments(m)
                for k, call in enumerate(_list(m.get("tool_calls"), where)):
                    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                        raise ImportFormatError(f"{where} tool call {k}: needs a 'name'")
                    call_id = str(call.get("id") or "")
                    args = raw_args.get(call_id)
                    if args is None:
                        a = call.get("arguments", {})
                        args = a if isinstance(a, str) else json.dumps(a, ensure_ascii=False)
                    calls[call_id] = call["name"]
                    b.add(_tool_call_text(call["name"], args), step=step, kind="tool_call", speaker=speaker,
                          role=role, observed_at=when, tool=call["name"], tool_call_id=call_id,
                          requestor=str(call.get("requestor") or role))
            elif role == "tool":
                call_id = str(m.get("id") or "")
                tool = calls.get(call_id, "tool")
                extra = {"error": True} if m.get("error") is True or m.get("error") == "True" else {}
                b.add(text, step=step, kind="tool_result", speaker=tool, role="tool", observed_at=when,
                      tool=tool, tool_call_id=call_id, requestor=str(m.get("requestor") or ""), **extra)
            elif role == "system":
                b.add(text, step=step, kind="system", speaker="system", role="system", observed_at=when)
            else:
                raise ImportFormatError(f"{where}: role must be assistant, user, tool or system, "
                                        f"got {role!r}")
        steps = [it.meta["step"] for it in b.items]
        if steps != sorted(steps):
            raise ImportFormatError(f"{at}: turn_idx goes backwards")
        reward = _obj(sim, "reward_info").get("reward")
        task_id = sim.get("task_id")
        out.append(Trajectory(name, "tau2", str(p), tuple(b.items), str(task_id or ""), _won(reward),
                              {"task_id": task_id, "trial": sim.get("trial"), "reward": reward,
                               "termination_reason": sim.get("termination_reason")}))
    return out


def _raw_arguments(msg: dict[str, Any]) -> dict[str, str]:
    """The arguments of each tool call exactly as the model wrote them (``raw_data``), by call
    id: the parsed ``arguments`` lose the model's spacing and key order."""
    try:
        calls = msg["raw_data"]["message"]["tool_calls"] or []
        return {str(c["id"]): c["function"]["arguments"] for c in calls
                if isinstance(c.get("function", {}).get("arguments"), str)}
    except (KeyError, TypeError, AttributeError):
        return {}


def load_tau2(path: str | Path | None = None) -> list[Trajectory]:
    """Every simulation of a τ²-bench results file (``{info, tasks, simulations}``), or of every
    such file of a folder (the shared copy by default), by name."""
    p = Path(path) if path is not None else tau2_default_path()
    out = []
    for f in _files(p, "τ²-bench", (".json", ".json.gz")):
        out.extend(_tau2_runs(f, _read(f, "τ²-bench")))
    return _sorted(out, p)


# -- AMA-Bench, and any of them -------------------------------------------------------------------

def ama_trajectory(episode: AmaEpisode, source: str = "") -> Trajectory:
    """An AMA-Bench episode (see :mod:`suffice._datasets.ama`) as a trajectory."""
    return Trajectory(episode.name, "ama", source, episode.items, episode.task, episode.success,
                      {"domain": episode.domain, "questions": len(episode.questions)})


def load_ama_trajectories(path: str | Path | None = None) -> list[Trajectory]:
    """AMA-Bench episodes as trajectories (their questions: :func:`suffice._datasets.ama.load_ama`)."""
    from .ama import default_path, load_episode
    p = Path(path) if path is not None else default_path()
    return _sorted([ama_trajectory(load_episode(f), str(f))
                    for f in _files(p, "AMA-Bench", (".json.gz", ".json"))], p)


LOADERS: dict[str, Callable[[str | Path | None], list[Trajectory]]] = {
    "ama": load_ama_trajectories, "swe": load_swe, "tau": load_tau, "tau2": load_tau2}


def _from_raw(fmt: str, p: Path, raw: Any) -> list[Trajectory]:
    if fmt == "ama":
        from .ama import episode_from
        return [ama_trajectory(episode_from(p, raw), str(p))]
    if fmt == "swe":
        return [_swe_from(p, raw, _resolved(p.parent).get(p.name.split(".")[0]))]
    return _tau_runs(p, raw) if fmt == "tau" else _tau2_runs(p, raw)


def detect_format(path: str | Path) -> str:
    """Which of :data:`FORMATS` one file is in, from its shape."""
    p = Path(path)
    return _detect(p, _read(p, "agent trajectory"))


def _detect(p: Path, raw: Any) -> str:
    if isinstance(raw, dict):
        if "simulations" in raw:
            return "tau2"
        # A mini-SWE-agent run says so (or, before it did, carries its "info" block); any other
        # object with messages (a chat log) is not one.
        fmt = raw.get("trajectory_format")
        if "messages" in raw and (str(fmt).startswith("mini-swe") or (fmt is None and "info" in raw)):
            return "swe"
        if "trajectory" in raw and "qa_pairs" in raw:
            return "ama"
    if isinstance(raw, list) and raw and all(isinstance(r, dict) and "traj" in r for r in raw[:3]):
        return "tau"
    raise ImportFormatError(f"{p}: not a trajectory format suffice knows ({', '.join(FORMATS)})")


def load_agent(path: str | Path, format: str = "auto") -> list[Trajectory]:
    """The runs in a file or folder, in ``format`` (one of :data:`FORMATS`) or, with ``auto``,
    in whichever format each file of the folder and its subfolders has; sorted by scope."""
    if format != "auto" and format not in LOADERS:
        raise ImportFormatError(f"unknown trajectory format {format!r}; use auto or one of "
                                f"{', '.join(FORMATS)}")
    p = Path(path)
    if format != "auto":
        return LOADERS[format](p)
    out: list[Trajectory] = []
    for f in _files(p, "agent trajectory", (".json", ".json.gz"), deep=True):
        if f.name in SIDE_FILES:
            continue
        raw = _read(f, "agent trajectory")
        out.extend(_from_raw(_detect(f, raw), f, raw))
    return _sorted(out, p)


def _sorted(trajs: Iterable[Trajectory], where: Path) -> list[Trajectory]:
    out = sorted(trajs, key=lambda t: t.scope)
    for a, b in zip(out, out[1:], strict=False):
        if a.scope == b.scope:
            raise ImportFormatError(f"{where}: two runs share the scope {a.scope!r} ({a.source}, {b.source})")
    return out
