"""A scripted stand-in for the model runner: each request's output is chosen by its prompt.

Protocol tests need exact model output (reasoning, tool-call XML, stop strings) through the REAL
engine (scheduler, commit, stop handling), tokenizer, output decoder and server. This runner
replaces the engine's `ModelRunner`: for every sequence that samples this step it decodes the
prompt, takes the first script whose trigger occurs in it, and returns the script's next token
(the script's text is tokenized as the model would emit it: `<think>`, `<tool_call>` are special
ids), then `<|im_end|>`. Test-only: nothing in `src/` can reach it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import lru_cache

from ninfer.engine.plan import Completed, Row, StepPlan, outcome_of
from ninfer.tokenizer import Tokenizer

IM_END = "<|im_end|>"
Script = Callable[[str], str]  # prompt text -> output text


class ScriptedRunner:
    def __init__(
        self,
        tokenizer: Tokenizer,
        scripts: list[tuple[str, Script]],
        *,
        step_delay_s: float = 0.0,
        first_token_delay_s: float = 0.0,
    ) -> None:
        self.tokenizer = tokenizer
        self.scripts = scripts
        self.step_delay_s = step_delay_s
        self.first_token_delay_s = first_token_delay_s
        self._output_ids = lru_cache(maxsize=256)(self._script_ids)

    def _script_ids(self, prompt_ids: tuple[int, ...]) -> tuple[int, ...]:
        prompt = self.tokenizer.decode(prompt_ids)
        text = "no script matched"
        for trigger, script in self.scripts:
            if trigger in prompt:
                text = script(prompt)
                break
        return tuple(self.tokenizer.encode_template(text + IM_END))

    def _next(self, row: Row) -> int:
        out = self._output_ids(tuple(row.seq.token_ids[: row.seq.num_prompt]))
        return out[min(row.sample_index, len(out) - 1)]

    def launch(self, plan: StepPlan) -> Completed:
        if self.first_token_delay_s and any(r.samples for r in plan.prefill):
            time.sleep(self.first_token_delay_s)
        tokens = [self._next(r) for r in plan.rows if r.samples]
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        return Completed(plan, outcome_of(plan, tokens))
