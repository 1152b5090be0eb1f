"""The prompt module: shapes, styles, and the phrases other modules depend on."""

from __future__ import annotations

import pytest

from suffice import _prompts as p
from suffice._bench.metrics import says_not_in_memory


@pytest.mark.parametrize(
    ("question", "date"),
    [
        ("What did I eat on 2023-05-08?", "2023-05-08"),
        ("Where was I on 2023/05/08 (Mon)?", "2023/05/08"),
        ("Who called on 8 May 2023?", "8 May 2023"),
        ("Who called on the 8th of May, 2023?", "8th of May, 2023"),
        ("What happened on May 8, 2023?", "May 8, 2023"),
        ("What was planned for Sept 2023?", "Sept 2023"),
        ("As of 08/05/2023, who had the cat?", "08/05/2023"),
    ],
)
def test_find_date_spots_explicit_dates(question: str, date: str) -> None:
    assert p.find_date(question) == date
    assert p.choose_style(question) == "dated"


@pytest.mark.parametrize(
    "question",
    ["What did I eat last week?", "When did Caroline go hiking?", "What did she paint in 2022?",
     "Which may be the better option?"],
)
def test_no_explicit_date(question: str) -> None:
    assert p.find_date(question) is None
    assert p.choose_style(question) == "conversation"


def test_choose_style_by_dataset() -> None:
    assert p.choose_style("Who directed it?", "hotpotqa") == "documents"
    assert p.choose_style("Who directed it?", "MuSiQue") == "documents"
    assert p.choose_style("Who directed it?", "locomo") == "conversation"
    assert p.choose_style("Who directed it?", "documents") == "documents"
    # a date in the question wins over the dataset
    assert p.choose_style("Who won on 3 June 2021?", "hotpotqa") == "dated"


@pytest.mark.parametrize("style", p.STYLES)
def test_answer_messages_shape(style: p.Style) -> None:
    msgs = p.answer_messages("Who has the cat?", "Tom: I took Miso home.", style)
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert "Who has the cat?" in msgs[1]["content"]
    assert "Tom: I took Miso home." in msgs[1]["content"]
    ask = {"trajectory": "Answer:", "request": "Reply:"}.get(style, "Short answer:")
    assert msgs[1]["content"].endswith(ask)


def test_conversation_style_says_how_to_abstain() -> None:
    msgs = p.answer_messages("q", "ctx", "conversation")
    assert p.NOT_MENTIONED in msgs[0]["content"]
    assert says_not_in_memory(p.NOT_MENTIONED)  # the scorer recognises the phrase we ask for


def test_evidence_of_an_agents_run_is_read_as_a_trajectory_not_a_chat() -> None:
    run = ["action", "observation", "message"]
    assert p.style_for_evidence("What did step 4 return?", run) == "trajectory"
    assert p.style_for_evidence("What did Ana say?", ["message", "message", "tool_result"]) == "conversation"
    assert p.style_for_evidence("What did step 4 return?", []) == "conversation"
    assert p.style_for_evidence("What ran on 3 June 2021?", ["action"]) == "dated"  # a date still wins
    system = p.answer_messages("q", "ctx", "trajectory")[0]["content"]
    # An agent's run holds the answer to a question asked about it: no fixed refusal phrase.
    assert p.NOT_MENTIONED not in system and "step" in system


@pytest.mark.parametrize("message", [
    "Can you help me set up a caching system for my app's API responses?",
    "How can I track the status and results of each step in my deployment workflow?",
    "I'm planning to add user login and some basic analytics to my Flask app. Any advice?",
    "What steps would you suggest I take to improve security?",
    "Summarize how my budget tracker project evolved.",
    "Could you show me how to implement a login feature?",
])
def test_a_request_for_help_gets_a_reply_not_a_short_phrase(message: str) -> None:
    assert p.choose_style(message) == "request"
    system = p.answer_messages(message, "ctx", "request")[0]["content"]
    assert "short phrase" not in system and "opposite" in system  # contradictions are named


@pytest.mark.parametrize("question", [
    "What did Caroline paint?", "Would Melanie go on another roadtrip soon?", "How long has Ana lived here?",
    "Have I integrated Flask-Login for session management?", "Did you see my cat?",
    "Can you tell me when I moved to Lisbon?", "Could you remind me what my cat is called?",
    "Please tell me where I parked.", "I want to know when the exam is.", "Can you recall my budget?",
    "What do you know about my sister?", "I'm wondering when we last met.",
])
def test_a_question_about_a_fact_is_not_a_request(question: str) -> None:
    assert p.choose_style(question) == "conversation"


def test_documents_style_asks_for_multi_hop() -> None:
    system = p.answer_messages("q", "ctx", "documents")[0]["content"]
    assert "different passages" in system and "short phrase" in system


def test_dated_style_uses_explicit_or_question_date() -> None:
    msgs = p.answer_messages("Where did I live?", "ctx", "dated", as_of="2023-05-08")
    assert "as of 2023-05-08" in msgs[0]["content"]
    assert "Question (as of 2023-05-08)" in msgs[1]["content"]
    from_q = p.answer_messages("Where did I live on 8 May 2023?", "ctx", "dated")
    assert "as of 8 May 2023" in from_q[0]["content"]
    undated = p.answer_messages("Where do I live?", "ctx", "dated")
    assert "most recent value" in undated[0]["content"]


def test_unknown_style() -> None:
    with pytest.raises(ValueError, match="unknown answer style"):
        p.answer_messages("q", "c", "poetry")  # type: ignore[arg-type]


def test_sufficiency_ends_with_yes_or_no() -> None:
    msgs = p.sufficiency_messages("Who has the cat?", "Tom took Miso home.")
    assert msgs[-1]["content"].endswith("Answer Yes or No.")
    assert "Tom took Miso home." in msgs[-1]["content"]
    assert set(p.SUFFICIENCY_CHOICES) == {"yes", "no"}


def test_block_agent_and_aggregate() -> None:
    block = p.block_agent_messages("Who has the cat?", "[2023-05-01] Tom: I took Miso.")
    assert p.BLOCK_NONE in block[0]["content"] and "Tom: I took Miso." in block[1]["content"]
    agg = p.aggregate_messages("Who has the cat?", ["- [May 1] Tom has Miso", "- [June 2] Ana has Miso"])
    user = agg[1]["content"]
    assert user.index("[Block 1]") < user.index("[Block 2]")
    assert "later one wins" in agg[0]["content"] and "<answer>" in user
    assert "CONFLICTS:" in user
    assert p.aggregate_messages("q", "merged notes")[1]["content"].startswith("Notes:\nmerged notes")


def test_judge_and_no_memory() -> None:
    j = p.judge_messages("When?", "7 May 2023", "May 7th")
    assert '"score"' in j[0]["content"] and "7 May 2023" in j[1]["content"]
    assert "May 7th" in j[1]["content"]
    nm = p.no_memory_messages("What is my dog's name?")
    assert "What is my dog's name?" in nm[-1]["content"] and p.NOT_MENTIONED in nm[0]["content"]


def test_reask_message() -> None:
    msg = p.reask_message("Reply with JSON.")
    assert msg["role"] == "user" and "Reply with JSON." in msg["content"]
