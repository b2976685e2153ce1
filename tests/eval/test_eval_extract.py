"""Answer extraction on known model outputs."""

import pytest

from v4serve.eval.extract import extract_choice, extract_number, last_boxed, normalize_number, numbers_equal


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ("5 * 2 = 10\n10 + 2 = 12\n#### 18", "18"),
        ("She started with $1,234.50 in total.\n#### $1,234.50", "1234.5"),
        ("First 3, then 4.\nSo the answer is \\boxed{42}.", "42"),
        ("\\boxed{\\frac{a}{b}} no wait, \\boxed{1{,}000}", "1000"),
        ("The answer is: 7 apples, not 9.", "7"),
        ("Final answer: -3.0", "-3"),
        ("we get 3 then 5 then 11", "11"),  # fallback: the last number
        ("<think>maybe #### 2</think>After checking, #### 3", "3"),
        ("#### 1\nrevised: #### 2", "2"),  # the last marker wins
        ("no numbers here", None),
    ],
)
def test_extract_number(output, expected):
    assert extract_number(output) == expected


def test_number_normalisation_and_equality():
    assert (
        normalize_number("18.00") == "18"
        and normalize_number("$5") == "5"
        and normalize_number("50%") == "50"
    )
    assert normalize_number("12.") == "12" and normalize_number("abc") is None
    assert numbers_equal("18.0", "18") and numbers_equal("1,000", "1000") and not numbers_equal("17", "18")
    assert not numbers_equal(None, "18")
    assert last_boxed("a \\boxed{x^{2}} b") == "x^{2}" and last_boxed("none") is None


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ("Reasoning...\nAnswer: B", "B"),
        ("Answer: (C)", "C"),
        ("**Answer:** **D**", "D"),
        ("So the answer is (A).", "A"),
        ("The correct choice is \\boxed{C}", "C"),
        ("Answer: \\boxed{\\text{B}}", "B"),
        ("Option D is correct because ...", "D"),
        ("Thinking it over.\n(B)", "B"),
        ("<think>Answer: A</think>\nAnswer: C", "C"),
        ("Answer: a detailed derivation follows", None),  # a lowercase word is not an option letter
        ("Answer: E", None),  # out of range for four options
        ("I am not sure.", None),
    ],
)
def test_extract_choice(output, expected):
    assert extract_choice(output) == expected


def test_extract_choice_with_ten_options():
    assert extract_choice("Answer: H", num_choices=10) == "H"
    assert extract_choice("Answer: H", num_choices=4) is None
