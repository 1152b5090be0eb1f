"""Every prompt suffice sends to a model, in one place.

Keeping them together makes the wording reviewable and versionable as one thing: a benchmark
number is only meaningful next to the prompts that produced it (``PROMPTS_VERSION``). Each
function returns a list of chat messages; none of them calls a model.

Phrases the metrics rely on are constants here: an answer that says the memory does not hold
the fact uses ``NOT_MENTIONED``, which the LoCoMo adversarial scoring recognises.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from ._types import Message

PROMPTS_VERSION = "5"
"""Bump when the wording of any prompt changes, so results can say which prompts they used."""


def _source_digest() -> str:
    """sha256 of this module's source: the prompts and the rules that pick among them."""
    try:
        return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
    except OSError:  # no source file (a frozen build): the version alone must do
        return "nosource"


PROMPTS_FINGERPRINT = f"{PROMPTS_VERSION}-{_source_digest()}"
"""What a recorded answer's reuse is keyed on: the version *and* a digest of this module, so a
change to a style rule (:func:`is_request`, :func:`style_for_evidence`) or a prompt's wording
invalidates recorded answers even when nobody bumped the version. Invalidating is cheap: every
benchmark model call is cached by (model, prompt), so an unchanged prompt replays at no cost."""

Style = Literal["conversation", "documents", "dated", "trajectory", "request"]
STYLES: tuple[Style, ...] = ("conversation", "documents", "dated", "trajectory", "request")

AGENT_KINDS = frozenset({"action", "observation", "thought", "tool_call", "tool_result"})
"""Item kinds of an agent's own run (not of a dialogue): evidence mostly of these kinds is read
with the 'trajectory' style."""

NOT_MENTIONED = "Not mentioned in the conversation"
"""The fixed reply for a fact the memory does not hold (LoCoMo scores this phrase)."""

SUFFICIENCY_CHOICES: dict[str, list[str]] = {
    "yes": ["Yes", "yes", "YES"],
    "no": ["No", "no", "NO"],
}
"""Next-token groups for :func:`sufficiency_messages`, to pass to ``LLM.choice_probs``."""

# Dataset names whose questions are about documents rather than a dialogue history.
_DOCUMENT_DATASETS = ("hotpot", "musique", "2wiki", "wiki", "nq", "narrative", "qasper", "docs")

_MONTHS = (
    "jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|jun(?:e)?|jul(?:y)?|aug(?:ust)?"
    "|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?"
)
_DATE_PATTERNS = [
    # 2023-05-08, 2023/05/08, 2023.05.08 (optionally followed by a weekday or a time)
    re.compile(r"\b\d{4}[-/.]\d{1,2}[-/.]\d{1,2}\b"),
    # 08/05/2023, 5-8-23
    re.compile(r"\b\d{1,2}[-/.]\d{1,2}[-/.](?:\d{4}|\d{2})\b"),
    # 8 May 2023, 8th of May, 2023
    re.compile(rf"\b\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?(?:{_MONTHS})\.?,?\s+\d{{4}}\b", re.I),
    # May 8, 2023 / May 8th 2023 / May 2023
    re.compile(rf"\b(?:{_MONTHS})\.?\s+(?:\d{{1,2}}(?:st|nd|rd|th)?,?\s+)?\d{{4}}\b", re.I),
]


_RECALL = r"(?!\s+(?:tell|remind)\s+me\b|\s+(?:recall|remember)\b|\s+(?:know|say)\b)"
"""After "can you", "please", "I want": the phrasings that still ask for a remembered fact."""
_REQUEST = re.compile(
    rf"^\s*(?:(?:can|could|would|will) you{_RECALL}\b|please{_RECALL}\b|help me\b|"
    r"i(?:'m| am) (?:planning|looking|trying|thinking|working)\b|i(?:'d| would) like\b(?! to know)|"
    r"i (?:want|need)\b(?! to know)|how (?:can|should|do|could|would) i\b|"
    r"what (?:steps|approach|should i)\b|what (?:would|do) you (?:suggest|recommend|advise)\b|"
    r"(?:suggest|recommend|give|explain|write|list|summari[sz]e|outline)\b)", re.I)


def is_request(question: str) -> bool:
    """True when the message asks the assistant to do something (help, advise, plan, list,
    summarise) rather than to recall a fact: "Can you help me set up caching?", "How should I
    track my deployments?". A short-phrase reply ("Yes") fails such a message. None of LoCoMo's
    1,586 questions reads as one."""
    return bool(_REQUEST.search(question))


def find_date(question: str) -> str | None:
    """The first explicit calendar date written in ``question``, as written, or None.

    Only absolute dates count ("8 May 2023", "2023/05/08"); relative ones ("last week") do not,
    because they carry no reference point of their own.
    """
    hits = [(m.start(), m.group(0)) for p in _DATE_PATTERNS for m in p.finditer(question)]
    if not hits:
        return None
    return min(hits)[1].strip()


def choose_style(question: str, dataset_hint: str | None = None) -> Style:
    """Pick the answer style: 'dated' for a question pinned to a date, else by the dataset.

    Without a hint the default is 'conversation', the common case for an agent's memory, or
    'request' for a message that asks for help rather than a fact (:func:`is_request`).
    """
    if find_date(question):
        return "dated"
    if dataset_hint:
        hint = dataset_hint.lower()
        for style in STYLES:
            if hint == style:
                return style
        if any(name in hint for name in _DOCUMENT_DATASETS):
            return "documents"
    return "request" if is_request(question) else "conversation"


def style_for_evidence(question: str, kinds: Sequence[str], dataset_hint: str | None = None) -> Style:
    """:func:`choose_style`, except that evidence made mostly of an agent's steps (actions,
    observations, tool calls and results, thoughts) is read as a trajectory, not a chat."""
    if not find_date(question) and kinds and sum(k in AGENT_KINDS for k in kinds) * 2 >= len(kinds):
        return "trajectory"
    return choose_style(question, dataset_hint)


def _msg(role: Literal["system", "user", "assistant"], content: str) -> Message:
    return {"role": role, "content": content}


_CONVERSATION_SYSTEM = (
    "You answer questions about a user's earlier conversations, using only the memory excerpts "
    "you are given. Reply with a short phrase rather than a full sentence: a name, a date, a "
    "place, a number or a few words. Reuse the words the memory itself uses where you can. When "
    "the memory uses a relative date such as 'yesterday' or 'last week', work out the calendar "
    "date from the date of that message and give the calendar date. If the memory does not "
    f"contain the answer, reply exactly: {NOT_MENTIONED}."
)

_TRAJECTORY_SYSTEM = (
    "You answer questions about an earlier run of an AI agent, using only the excerpts of its "
    "history you are given: the actions it took, what it observed, the tools it called and what "
    "they returned, each marked with its step. Answer in one or two short sentences that name "
    "the steps, values, files or actions the question is about, in the words of the history. "
    "The excerpts are chosen for this question: when they do not state the answer outright, "
    "give the answer they best support rather than saying it is missing."
)

_REQUEST_SYSTEM = (
    "You are an assistant with a memory of the user's earlier conversations, given as excerpts. "
    "The user now asks you to do something: help, advise, plan, list or sum up. Do it in a few "
    "sentences or a short list. Ground what you say about the user in the memory: keep to the "
    "preferences, constraints, tools and decisions it records, and when two excerpts say "
    "opposite things, point that out instead of picking one."
)

_DOCUMENTS_SYSTEM = (
    "You answer questions from the passages you are given. The answer may need several facts "
    "that sit in different passages: find the first fact, use it to locate the next, and "
    "combine them. Reply with the final answer only, as a short phrase (an entity, a date, a "
    "number, or yes/no), without explanation. If the passages do not settle it, give your best "
    "short guess."
)


def _dated_system(as_of: str | None) -> str:
    when = (
        f"The question is asked as of {as_of}. Treat anything dated after that as not yet known, "
        "and when a fact changed over time, give the value it had on that date. "
        if as_of
        else "When a fact changed over time, give its most recent value. "
    )
    return (
        "You answer questions from a user's memory, paying attention to time. Each excerpt "
        "carries the date it was written. "
        + when
        + "Relative dates in an excerpt ('yesterday', 'next month') count from that excerpt's "
        "date. Reply with a short phrase, not a sentence. If the memory does not contain the "
        f"answer, reply exactly: {NOT_MENTIONED}."
    )


def answer_messages(
    question: str,
    context: str,
    style: Style = "conversation",
    *,
    as_of: str | None = None,
    hint: str = "",
) -> list[Message]:
    """Messages that ask for a short answer to ``question`` from the memory ``context``.

    For ``style='dated'`` without ``as_of``, the date written in the question is used.
    ``hint``: a remark put after the question (the engine's ``updates`` lever); none by default,
    so the prompt is byte for byte the one without it.
    """
    if style == "conversation":
        system = _CONVERSATION_SYSTEM
        label = "Memory"
        q_line = f"Question: {question}"
    elif style == "documents":
        system = _DOCUMENTS_SYSTEM
        label = "Passages"
        q_line = f"Question: {question}"
    elif style == "trajectory":
        system = _TRAJECTORY_SYSTEM
        label = "Agent history"
        q_line = f"Question: {question}"
    elif style == "request":
        system = _REQUEST_SYSTEM
        label = "Memory"
        q_line = f"Request: {question}"
    elif style == "dated":
        as_of = as_of or find_date(question)
        system = _dated_system(as_of)
        label = "Memory"
        q_line = f"Question (as of {as_of}): {question}" if as_of else f"Question: {question}"
    else:
        raise ValueError(f"unknown answer style {style!r}; expected one of {', '.join(STYLES)}")
    ask = {"trajectory": "Answer:", "request": "Reply:"}.get(style, "Short answer:")
    if hint:
        q_line = f"{q_line} {hint}"
    user = f"{label}:\n{context.strip()}\n\n{q_line}\n{ask}"
    return [_msg("system", system), _msg("user", user)]


def no_memory_messages(question: str) -> list[Message]:
    """The no-memory baseline: the same short-answer request with no context at all."""
    system = (
        "Answer the question with a short phrase. You cannot see any earlier conversation; if "
        f"the answer depends on one you do not know, reply exactly: {NOT_MENTIONED}."
    )
    return [_msg("system", system), _msg("user", f"Question: {question}\nShort answer:")]


def sufficiency_messages(question: str, evidence: str) -> list[Message]:
    """A yes/no check: is ``evidence`` enough to answer ``question``? Read with choice_probs.

    The prompt ends on the Yes/No request so the very next token carries the decision.
    """
    system = (
        "You decide whether retrieved evidence is enough to answer a question. You do not "
        "answer the question itself."
    )
    user = (
        f"Evidence:\n{evidence.strip()}\n\nQuestion: {question}\n\n"
        "Does the evidence above contain all the information needed to answer the question? "
        "Answer Yes or No."
    )
    return [_msg("system", system), _msg("user", user)]


def rationale_messages(question: str, context: str, annotation: str, sufficient: bool) -> list[Message]:
    """Training only: ask a model to explain, in its own words, why ``context`` does or does
    not hold what ``question`` needs. It is told the verdict and the annotated evidence, so it
    explains rather than judges; the router's teacher reads the explanation."""
    system = (
        "You explain whether a memory context is enough to answer a question. You are told the "
        "verdict and which evidence the question needs; write two short sentences: what the "
        "context shows that matters, and what decisive information is missing, if anything."
    )
    verdict = "enough" if sufficient else "not enough"
    user = (
        f"Context:\n{context.strip()}\n\nQuestion: {question}\n\nAnnotated evidence: {annotation}\n"
        f"Verdict: the context is {verdict}.\n\nExplanation:"
    )
    return [_msg("system", system), _msg("user", user)]


BLOCK_NONE = "NONE"
"""What a memory agent writes when its block holds nothing relevant."""


def block_agent_messages(question: str, block_text: str) -> list[Message]:
    """A memory agent reading one block of history on the deep path.

    The task is extractive on purpose: copying the lines that matter, with their dates, is
    something even a small local model does reliably, and the copies can be checked against
    the block. Lines the prefix retrieved are marked with ``*``.
    """
    system = (
        "You help answer a question about a long history by reading one excerpt of it. Copy "
        "every line of the excerpt that helps answer the question, exactly as written, one per "
        "line, keeping its date. Copy nothing else and add no comments. If no line helps, write "
        f"{BLOCK_NONE}."
    )
    user = (
        f"Excerpt:\n{block_text.strip()}\n\nQuestion: {question}\n\n"
        "Lines that help answer the question:"
    )
    return [_msg("system", system), _msg("user", user)]


def deep_context(notes: str, evidence: str) -> str:
    """The reader's context on the deep path: the turns agents picked first, then the fast
    path's memory in the room left."""
    parts = []
    if notes.strip():
        parts.append("Turns that memory readers picked from the history, oldest first "
                     "(a later turn replaces an earlier one when they disagree):\n" + notes.strip())
    if evidence.strip():
        parts.append("Retrieved turns:\n" + evidence.strip())
    return "\n\n".join(parts)


def aggregate_messages(question: str, notes: Sequence[str] | str) -> list[Message]:
    """Merge per-block notes (given in time order) into one answer; later evidence wins.

    Conflicts are named on their own line so a receipt can show what was overridden.
    """
    if isinstance(notes, str):
        body = notes.strip()
    else:
        body = "\n\n".join(f"[Block {i}]\n{n.strip()}" for i, n in enumerate(notes, 1))
    system = (
        "You combine notes that several readers took from different blocks of one long history. "
        "The blocks are listed in time order. Merge the facts. When two notes disagree, the later "
        "one wins because newer information replaces older; name each such conflict in one short "
        "line. Then answer the question with a short phrase. If no note answers it, answer "
        f"exactly: {NOT_MENTIONED}."
    )
    user = (
        f"Notes:\n{body}\n\nQuestion: {question}\n\n"
        "Reply in exactly this format:\n"
        "CONFLICTS: none, or one line per conflict\n"
        "<answer>short answer</answer>"
    )
    return [_msg("system", system), _msg("user", user)]


# -- tiered memory pipeline (BudgetMem's modules) --------------------------------------------

TIER_PROMPTS_VERSION = "t1"
"""Changes whenever a tier prompt below changes: module outputs are cached under it."""

TierModule = Literal["filter", "entity", "temporal", "topic", "summary"]
Reasoning = Literal["direct", "step", "plan"]

_TIER_TASKS: dict[str, str] = {
    "filter": (
        "You pick which numbered excerpts of a long history help answer a question."),
    "entity": (
        "You pull out the relationships between people, places, things and events in the "
        "excerpts that matter for the question, each as a short line 'A - relation - B (date)'. "
        "Leave out everything the question does not need."),
    "temporal": (
        "You pull out the time facts in the excerpts that matter for the question: what happened "
        "when, stated with a calendar date where the excerpt's own date lets you work it out "
        "(a turn dated 8 May 2023 that says 'yesterday' means 7 May 2023)."),
    "topic": (
        "You pull out the topics the excerpts discuss that matter for the question, and how "
        "they connect, each as a short line naming who talked about what and when."),
    "summary": (
        "You write a short briefing for someone who must answer a question from the excerpts "
        "below. Say which facts bear on the question, which dates matter and what is missing. "
        "Do not answer the question yourself."),
}

_TIER_OUTPUT: dict[str, str] = {
    "filter": "the numbers of the helpful excerpts, most helpful first, e.g. [4, 1]",
    "entity": 'a JSON list of short strings, e.g. ["Ann - adopted - a dog (May 2023)"]; [] if none',
    "temporal": 'a JSON list of short strings, e.g. ["Ann ran a marathon on 6 May 2023"]; [] if none',
    "topic": 'a JSON list of short strings, e.g. ["Ann and Bo discussed pottery (June 2023)"]; [] if none',
    "summary": "at most four plain sentences",
}

_REASONING: dict[str, str] = {
    "direct": "Reply with {out} inside <answer></answer> and nothing else.",
    "step": ("First think it through step by step in a few short lines. Then give {out} "
             "inside <answer></answer>."),
    "plan": ("Work in three short stages. PLAN: say what you need to find. ACT: go through "
             "the material and note what you find. CHECK: make sure each item is supported by "
             "the material and fix anything that is not. Then give {out} inside "
             "<answer></answer>."),
}

REASONING_MAX_TOKENS: dict[str, int] = {"direct": 100, "step": 200, "plan": 280}
"""Room for each reasoning style's output: the longer styles write their reasoning first."""


def tier_messages(module: TierModule, reasoning: Reasoning, question: str,
                  material: str) -> list[Message]:
    """One tier-pipeline module as an LLM call: the module's task, in the given reasoning style.

    The three styles are the reasoning tiers (direct, step by step, plan-act-check); the
    implementation strategy's High tier uses the direct style.
    """
    system = _TIER_TASKS[module] + " " + _REASONING[reasoning].format(out=_TIER_OUTPUT[module])
    user = f"Excerpts:\n{material.strip()}\n\nQuestion: {question}"
    return [_msg("system", system), _msg("user", user)]


def judge_messages(question: str, gold: str, prediction: str) -> list[Message]:
    """The LLM judge: compare a prediction with the reference and reply with a JSON score."""
    system = (
        "You grade answers to questions about a user's memory by comparing a candidate answer "
        "with a reference answer. Give 1 when the candidate means the same as the reference; "
        "different wording, a different date or number format, or extra detail that does not "
        "contradict it are fine. Give 0.5 when it is partly right, for example some items of a "
        "list, or the right event with a wrong detail. Give 0 when it is wrong, contradicts the "
        "reference, or does not answer. Reply with only a JSON object of the form "
        '{"score": 0 or 0.5 or 1, "reason": "one short sentence"}.'
    )
    user = (
        f"Question: {question}\nReference answer: {gold}\nCandidate answer: {prediction}\n\nJSON:"
    )
    return [_msg("system", system), _msg("user", user)]


JUDGE_FORMAT = (
    'Reply with only a JSON object like {"score": 1, "reason": "one short sentence"}, where '
    "score is 0, 0.5 or 1."
)
"""Shape reminder sent with the judge's one re-ask."""

DEFAULT_FORMAT = "Give the answer in the format asked for above."
"""Shape reminder for a re-ask when the caller names no specific format."""


def reask_message(expected: str = DEFAULT_FORMAT) -> Message:
    """The one corrective turn sent after an unreadable reply; ``expected`` names the shape."""
    return _msg(
        "user",
        f"I could not read your last reply. {expected.strip()} Reply again with only that.",
    )


__all__ = [
    "AGENT_KINDS",
    "BLOCK_NONE",
    "DEFAULT_FORMAT",
    "JUDGE_FORMAT",
    "NOT_MENTIONED",
    "PROMPTS_FINGERPRINT",
    "PROMPTS_VERSION",
    "REASONING_MAX_TOKENS",
    "TIER_PROMPTS_VERSION",
    "Reasoning",
    "STYLES",
    "SUFFICIENCY_CHOICES",
    "Style",
    "aggregate_messages",
    "answer_messages",
    "block_agent_messages",
    "deep_context",
    "choose_style",
    "find_date",
    "is_request",
    "judge_messages",
    "no_memory_messages",
    "rationale_messages",
    "reask_message",
    "style_for_evidence",
    "sufficiency_messages",
    "TierModule",
    "tier_messages",
]
