"""LoCoMo scoring, spelled out with hand-computed examples."""

from __future__ import annotations

import pytest

from suffice._bench.metrics import (
    answer_tokens,
    exact_match,
    multi_answer_f1,
    normalize_answer,
    novel_f1,
    score_locomo,
    token_f1,
)


def test_normalisation() -> None:
    # lower-case; commas and punctuation dropped; a/an/the/and removed; whitespace collapsed
    assert normalize_answer("The Cat, and a Dog!") == "cat dog"
    assert normalize_answer("  Mount   Everest. ") == "mount everest"
    assert normalize_answer("an apple") == "apple"
    # article words only go as whole words
    assert normalize_answer("Theo and Andy") == "theo andy"
    assert normalize_answer(2022) == "2022"


def test_stemming() -> None:
    assert answer_tokens("running dogs") == ["run", "dog"]
    assert answer_tokens("She painted sunsets") == ["she", "paint", "sunset"]


def test_token_f1_worked_examples() -> None:
    # "cat sat" vs "cat sat down": overlap 2, precision 2/2, recall 2/3 -> F1 = 0.8
    assert token_f1("The cat sat", "a cat sat down") == pytest.approx(0.8)
    # same stems in another order -> 1
    assert token_f1("dogs running", "the dog runs") == 1.0
    # nothing in common -> 0
    assert token_f1("Paris", "London") == 0.0
    # empty prediction -> 0
    assert token_f1("", "London") == 0.0
    # repeated tokens count as a multiset: "go go" vs "go": overlap 1, P=1/2, R=1 -> 2/3
    assert token_f1("go go", "go") == pytest.approx(2 / 3)


def test_category_1_scores_each_gold_part() -> None:
    # gold parts: painting (best 1), swimming (best 0), hiking (best 1) -> mean 2/3
    assert score_locomo("hiking, painting", "painting, swimming, hiking", 1) == pytest.approx(2 / 3)
    # one predicted part covering two gold parts only matches each partially:
    # "painting hiking" vs "painting": P=1/2 R=1 -> 2/3, same for "hiking" -> mean 2/3
    assert multi_answer_f1("painting and hiking", "painting, hiking") == pytest.approx(2 / 3)


def test_categories_2_and_4_are_plain_f1() -> None:
    assert score_locomo("7 May 2023", "7 May 2023", 2) == 1.0
    # "may 2023" vs "7 may 2023": P=1, R=2/3 -> 0.8
    assert score_locomo("May 2023", "7 May 2023", 2) == pytest.approx(0.8)
    assert score_locomo("salt and pepper", "pepper, salt", 4) == 1.0


def test_category_3_cuts_gold_at_semicolon() -> None:
    # gold becomes "Likely yes": "yes" vs "likely yes" -> P=1, R=1/2 -> 2/3
    assert score_locomo("yes", "Likely yes; she likes dogs", 3) == pytest.approx(2 / 3)
    assert score_locomo("likely yes", "Likely yes; because she said so", 3) == 1.0


def test_category_5_rewards_abstaining() -> None:
    assert score_locomo("Not mentioned in the conversation", "anything", 5) == 1.0
    assert score_locomo("No information available.", "anything", 5) == 1.0
    assert score_locomo("Paris", "anything", 5) == 0.0


def test_numeric_gold_and_bad_category() -> None:
    assert score_locomo("2022", 2022, 2) == 1.0
    with pytest.raises(ValueError, match="1-5"):
        score_locomo("x", "x", 6)


def test_exact_match() -> None:
    assert exact_match("The Dogs!", "dog") == 1.0
    assert exact_match("two dogs", "dog") == 0.0


def test_novel_f1_gives_no_credit_for_restating_the_question() -> None:
    q = "What did the agent do between step 45 and step 47?"
    gold = "Between step 45 and step 47 the agent opened drawer 2 and took the key."
    echo = "Between step 45 and step 47 the agent did something."
    assert novel_f1(echo, gold, q) == 0.0                 # plain F1 would give it credit
    assert novel_f1("Opened drawer 2, took the key.", gold, q) == pytest.approx(1.0)
    assert 0.0 < novel_f1("opened drawer 3", gold, q) < 1.0  # type: ignore[operator]


def test_novel_f1_is_none_when_the_question_holds_the_whole_answer() -> None:
    assert novel_f1("yes", "step 45", "Was it step 45?") is None
