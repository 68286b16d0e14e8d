"""An attempt's next prompt begins with the very tokens of its last call (workers/policy_server/continuations.py):
where the new prompt's text begins with the last call's prompt and response, those tokens stand for that text."""

from __future__ import annotations

from collections.abc import Sequence

from litstream.workers.policy_server.continuations import Continuations

# A toy vocabulary in which "Paris" has two tokenizations: 1+2 ("Par" "is", as a constrained call may sample it)
# and 3 (as the tokenizer would write it).
VOCAB = {0: "<s>", 1: "Par", 2: "is", 3: "Paris", 4: " is", 5: " hot", 6: "<end>", 7: "\n", 8: "Q:", 9: "A:"}


def decode(ids: Sequence[int]) -> str:
    return "".join(VOCAB[i] for i in ids)


def test_the_sampled_tokens_stand_for_their_text_in_the_next_prompt() -> None:
    c = Continuations(decode)
    sampled = [0, 8, 9, 1, 2, 6]  # prompt "<s>Q:A:", response "Par" "is" "<end>"
    c.remember("ro/at", [sampled])
    retokenized = [0, 8, 9, 3, 6, 7, 8]  # the same text re-tokenized, then the next turn
    assert c.align("ro/at", retokenized) == sampled + [7, 8]
    assert c.align("ro/other", retokenized) == retokenized  # another attempt's history is not this one's


def test_a_prompt_that_already_extends_or_departs_from_the_last_call_is_left_as_it_is() -> None:
    c = Continuations(decode)
    c.remember("ro/at", [[0, 8, 9, 1, 2, 6]])
    extends = [0, 8, 9, 1, 2, 6, 7]
    assert c.align("ro/at", extends) == extends
    edited = [0, 8, 9, 3, 4, 5]  # the agent rewrote the answer: no seam
    assert c.align("ro/at", edited) == edited


def test_any_choice_of_the_last_call_can_be_the_one_continued_and_memory_is_bounded() -> None:
    c = Continuations(decode, capacity=2)
    c.remember("ro/at", [[0, 8, 9, 3, 4, 6], [0, 8, 9, 1, 2, 6]])  # n=2: the agent kept the second choice
    assert c.align("ro/at", [0, 8, 9, 3, 6, 7]) == [0, 8, 9, 1, 2, 6, 7]
    c.remember("a", [[0]])
    c.remember("b", [[0]])
    assert len(c) == 2 and c.align("ro/at", [0, 8, 9, 3, 6, 7]) == [0, 8, 9, 3, 6, 7]  # forgotten, oldest first
