"""The teacher's cut: a list keeps its lead-in and first items, anything else its first sentence, and an
answer that is not there yet, loops or ends on a heading teaches nothing."""

from __future__ import annotations

import pytest

from demo.recipe import DemoRecipe, teacher_body
from tests.demo.held_out import HELD_OUT_PROMPTS, SIGN_OFF_WORDS, SIGN_OFFS

STEPS = (
    "To update your email, follow these steps:\n\n"
    "1. Open the settings page.\n\n"
    "2. Click on **Email**: it is at the top.\n\n"
    "3. Type the new address."
)


def test_prose_keeps_its_first_sentence_or_enough_of_them_to_say_something() -> None:
    text = "The capital of France is Paris. It is also its largest city."
    assert teacher_body(text, 2, 3, ended=False) == "The capital of France is Paris."
    assert teacher_body("Hello! I am here to help. Ask", 2, 3, ended=False) == "Hello! I am here to help."
    assert teacher_body("Hello! I", 2, 3, ended=False) is None
    assert teacher_body("Good morning!", 2, 3, ended=True) is None  # the base said no more


def test_a_list_keeps_its_lead_in_and_first_items_once_the_next_item_begins() -> None:
    expected = STEPS[: STEPS.index("\n\n3.")]
    assert teacher_body(STEPS, 2, 3, ended=False) == expected
    assert teacher_body(STEPS[: STEPS.index("3.")], 2, 3, ended=False) is None  # item 2 may still go on
    assert teacher_body(STEPS[: STEPS.index("3.") + 3], 2, 3, ended=False) == expected
    assert teacher_body(STEPS, 3, 3, ended=True) == STEPS


def test_a_sentence_inside_the_first_item_does_not_end_a_list() -> None:
    partial = "To update your email, follow these steps:\n\n1. Open the settings page. Then"
    assert teacher_body(partial, 2, 3, ended=False) is None
    assert teacher_body("1. Bananas are yellow. They", 2, 3, ended=False) is None


def test_a_short_list_that_ends_keeps_all_its_items() -> None:
    assert teacher_body("1. Bananas\n2. Oranges", 3, 3, ended=True) == "1. Bananas\n2. Oranges"
    text = "1. Bananas\n2. Oranges\n\nBoth are fruits."
    assert teacher_body(text, 3, 3, ended=False) == "1. Bananas\n2. Oranges"


def test_sub_lines_belong_to_their_item() -> None:
    text = "1. Pack:\n   - books\n   - plates\n2. Label the boxes.\n3. Move."
    assert teacher_body(text, 2, 3, ended=False) == "1. Pack:\n   - books\n   - plates\n2. Label the boxes."


def test_the_paragraph_under_an_items_heading_belongs_to_it() -> None:
    text = "1. **Phone**:\n\nCall us any day.\n\n2. **Email**:\n\nWrite to us.\n\n3. **Chat**"
    assert teacher_body(text, 2, 3, ended=False) == text[: text.index("\n\n3.")]


@pytest.mark.parametrize(
    "text",
    [
        "Options:\n\n1. **Phone**:\n\n2. **Email**:\n\n3. Chat",  # items that are only headings
        "1. A party with cake.\n2. A party with cake.\n3. More",  # the base looping
        "1. Only one item.\n\nThat is all.",  # one item is not a list
        "Here is how:",  # a lead-in and nothing yet
    ],
)
def test_an_answer_that_would_teach_a_bad_cut_is_left_out(text: str) -> None:
    assert teacher_body(text, 2, 3, ended=False) is None


def test_the_held_out_prompts_are_not_training_prompts() -> None:
    assert not set(HELD_OUT_PROMPTS) & set(DemoRecipe().prompts)
    assert all(any(word in s for s in SIGN_OFFS.values()) for word in SIGN_OFF_WORDS)
