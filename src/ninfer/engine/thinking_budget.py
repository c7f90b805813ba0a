"""The thinking-token cap: Qwen's early-close control suffix, its capacity rule, per-request state.

Imports the standard library, the tokenizer and `engine.errors` only (no torch, no chat/). When a
request that starts inside `<think>` has produced `budget` model tokens with thinking still open,
the engine commits the control suffix (guidance + close marker) without sampling; the suffix is
tokenized once from text, so its ids are whatever this artifact's tokenizer makes of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ninfer.engine.errors import ThinkingBudgetCapacityInsufficient
from ninfer.tokenizer import Tokenizer

# Qwen's canonical early-stop text for thinking budgets (QwenLM/Qwen3,
# docs/source/getting_started/thinking_budget.md): the reasoning is followed by
# "\n\nConsidering the limited time by the user, I have to give the solution based on the thinking
# directly now." and then the closed think block "\n</think>\n\n" of the chat format.
GUIDANCE = (
    "\n\nConsidering the limited time by the user, I have to give the solution based on the "
    "thinking directly now."
)
CLOSE_MARKER = "\n</think>\n\n"
THINK_END = "</think>"


@dataclass(frozen=True)
class ThinkingControl:
    """The tokenizer-derived control suffix and the id of a natural close."""

    suffix_ids: tuple[int, ...]
    think_end_id: int

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer) -> ThinkingControl | None:
        """None when the vocabulary has no `</think>` (then no budget can be honoured)."""
        think_end_id = tokenizer.special_tokens.get(THINK_END)
        if think_end_id is None:
            return None
        suffix = tokenizer.encode_template(GUIDANCE + CLOSE_MARKER)
        return cls(tuple(suffix), think_end_id)

    def check_capacity(self, budget: int, num_capacity: int) -> None:
        """Reject a request whose output capacity passes the cap but cannot hold the suffix.

        `num_capacity` is the effective output capacity (max_tokens and the context left). At or
        below the cap the output limit ends the request first, so nothing is inserted.
        """
        num_needed = budget + len(self.suffix_ids) + 1  # the suffix plus one post-close token
        if budget < num_capacity < num_needed:
            raise ThinkingBudgetCapacityInsufficient(budget, num_capacity, num_needed)


class ThinkingBudget:
    """One request's cap. The output starts inside an open think block."""

    def __init__(self, budget: int, control: ThinkingControl) -> None:
        if budget < 1:
            raise ValueError(f"thinking budget must be positive, got {budget}")
        self.budget = budget
        self.control = control
        self.is_open = True
        self.num_applied = 0  # 1 once the suffix was inserted

    def after_commit(self, token_id: int, num_output: int) -> tuple[int, ...]:
        """The control ids to commit now (empty: none), after model token `token_id` committed.

        A natural `</think>` closes thinking for good; the caller has already honoured stops and
        limits (it only asks when the commit did not finish the request).
        """
        if not self.is_open:
            return ()
        if token_id == self.control.think_end_id:
            self.is_open = False
            return ()
        if num_output < self.budget:
            return ()
        self.is_open = False
        self.num_applied += 1
        return self.control.suffix_ids
