"""An attempt's next prompt begins with the very tokens of its last call: the prompt the model saw and the response
it sampled, not a re-tokenization of their text.

An agent sends its whole conversation again on every call, as text. Rendered and tokenized afresh, the turns the
model wrote can come back as other tokens than it sampled: a constrained call is often sampled in a split of the
text that the tokenizer would not choose ("Par"+"is" for "Paris"). The model would then read a history it never
produced, and a trajectory could not be joined from the recorded token ids (trainer/trajectories.py). So the
endpoint remembers each attempt's last sequences (prompt and sampled response, one per choice) and, when the
attempt's next prompt renders to the same text followed by more, uses those tokens for that text and the new
tokens only for what follows (as verl's agent loop and SkyRL keep token ids across turns).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

ALIGN_SLACK = 64  # how many tokens the same text's two tokenizations may differ in length


class Continuations:
    def __init__(self, decode: Callable[[Sequence[int]], str], capacity: int = 4096) -> None:
        self._decode = decode
        self._capacity = capacity
        self._last: OrderedDict[str, list[list[int]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._last)

    def remember(self, key: str, sequences: Sequence[Sequence[int]]) -> None:
        """The attempt ``key``'s last call: prompt + sampled response of each choice."""
        self._last[key] = [list(s) for s in sequences]
        self._last.move_to_end(key)
        while len(self._last) > self._capacity:
            self._last.popitem(last=False)

    def align(self, key: str, prompt: list[int]) -> list[int]:
        """``prompt`` beginning with the tokens of one of the attempt's last sequences where its text begins with
        theirs (at a token boundary); ``prompt`` itself otherwise."""
        for previous in self._last.get(key, []):
            aligned = self._continue(previous, prompt)
            if aligned is not None:
                return aligned
        return prompt

    def _continue(self, previous: list[int], prompt: list[int]) -> list[int] | None:
        if not previous or len(prompt) <= 1:
            return None
        if prompt[: len(previous)] == previous:
            return prompt
        text = self._decode(previous)
        if not self._decode(prompt).startswith(text):
            return None
        # Where does the same text end in the new tokenization? Near the same count of tokens: the nearest counts
        # are tried first (a re-split changes it by a token or two), each a decode on the request path.
        lo, hi = max(1, len(previous) - ALIGN_SLACK), min(len(prompt) - 1, len(previous) + ALIGN_SLACK)
        for k in sorted(range(lo, hi + 1), key=lambda k: abs(k - len(previous))):
            if self._decode(prompt[:k]) == text:
                return previous + prompt[k:]
        return None  # the text's end falls inside a token of the new prompt: no clean seam
