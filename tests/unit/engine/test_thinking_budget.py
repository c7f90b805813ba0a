"""The thinking budget: control suffix, capacity rule, and insertion through the real EngineCore.

A recording fake runner shows which token each decode row was fed, so the tests see that the
inserted suffix enters the model sequence one token per step without being sampled; the tiny real
model shows the resulting continuation equals a prefill of the same tokens.
"""

from __future__ import annotations

import pytest

from ninfer.engine.core import EngineCore
from ninfer.engine.errors import ThinkingBudgetCapacityInsufficient
from ninfer.engine.handles import RequestHandle
from ninfer.engine.kv_pool import PagePool
from ninfer.engine.plan import FROM_DEVICE, Completed, StepPlan, outcome_of
from ninfer.engine.request import EventKind, FinishReason, GenerationRequest
from ninfer.engine.sampling import SamplingParams
from ninfer.engine.scheduler import Scheduler, SchedulerConfig
from ninfer.engine.state_slots import SlotPool
from ninfer.engine.thinking_budget import (
    CLOSE_MARKER,
    GUIDANCE,
    ThinkingBudget,
    ThinkingControl,
)
from ninfer.tokenizer import Tokenizer

EOS = 248046
THINK_END = 248069  # FACTS.md: `</think>`
PROMPT = tuple(range(10, 16))


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.qwen3_5()


@pytest.fixture(scope="module")
def control(tokenizer: Tokenizer) -> ThinkingControl:
    control = ThinkingControl.from_tokenizer(tokenizer)
    assert control is not None
    return control


class ScriptRunner:
    """Samples script[output index] (then 7) and records the token each decode row was fed
    (a row fed FROM_DEVICE gets the runner's own last sample for that sequence, as on a GPU)."""

    def __init__(self, script: list[int]) -> None:
        self.script = script
        self.fed: list[int] = []
        self._last: dict[int, int] = {}

    def _sample(self, index: int) -> int:
        return self.script[index] if index < len(self.script) else 7

    def launch(self, plan: StepPlan) -> Completed:
        tokens = []
        for row in plan.rows:
            if row.is_decode:
                token = row.token_ids[0]
                self.fed.append(self._last[id(row.seq)] if token == FROM_DEVICE else token)
            if row.samples:
                tokens.append(self._sample(row.sample_index))
                self._last[id(row.seq)] = tokens[-1]
        return Completed(plan, outcome_of(plan, tokens))


def _core(tokenizer: Tokenizer, runner, max_context: int = 256) -> EngineCore:
    sched = Scheduler(
        SchedulerConfig(max_concurrency=1, prefill_chunk=64, max_context=max_context),
        PagePool(128, 4),
        SlotPool(2),
    )
    return EngineCore(
        sched,
        runner,
        tokenizer,
        eos_token_ids=frozenset({EOS}),
        resolve_sampling=lambda req: SamplingParams(greedy=True),
    )


def _run(tokenizer, script, **kw):
    runner = ScriptRunner(script)
    core = _core(tokenizer, runner, kw.pop("max_context", 256))
    try:
        events = list(RequestHandle(core, GenerationRequest(PROMPT, **kw)))
    finally:
        core.close()
    return events, runner


def _ids(events) -> list[int]:
    return [t for e in events if e.kind == EventKind.TOKENS for t in e.token_ids]


def test_suffix_is_qwens_guidance_and_close_marker(tokenizer, control) -> None:
    assert control.think_end_id == THINK_END
    assert tokenizer.decode(control.suffix_ids) == GUIDANCE + CLOSE_MARKER
    assert control.suffix_ids.count(THINK_END) == 1
    assert GUIDANCE.startswith("\n\nConsidering the limited time by the user")


def test_capacity_rule_boundaries(control) -> None:
    n, num_suffix = 10, len(control.suffix_ids)
    for capacity in (1, n):  # the output limit ends the request at or before the cap
        control.check_capacity(n, capacity)
    for capacity in (n + 1, n + num_suffix):  # past the cap, short of suffix + one token
        with pytest.raises(ThinkingBudgetCapacityInsufficient) as info:
            control.check_capacity(n, capacity)
        assert info.value.code == "thinking_budget_capacity_insufficient"
    control.check_capacity(n, n + num_suffix + 1)


def test_budget_state_counts_from_output_start(control) -> None:
    budget = ThinkingBudget(3, control)
    assert budget.after_commit(5, 1) == () and budget.after_commit(6, 2) == ()
    assert budget.after_commit(7, 3) == control.suffix_ids
    assert budget.after_commit(8, 4) == ()  # applied once
    natural = ThinkingBudget(3, control)
    assert natural.after_commit(THINK_END, 3) == ()  # a natural close at the cap wins
    assert natural.after_commit(9, 4) == () and natural.num_applied == 0


def test_cap_inserts_suffix_at_exactly_n_and_feeds_it_unsampled(tokenizer, control) -> None:
    n, num_suffix = 5, len(control.suffix_ids)
    script = list(range(500, 600))  # thinking never closes
    max_tokens = n + num_suffix + 4
    events, runner = _run(tokenizer, script, max_tokens=max_tokens, thinking_budget=n)
    ids = _ids(events)
    assert ids[:n] == script[:n]
    assert tuple(ids[n : n + num_suffix]) == control.suffix_ids
    # after the suffix, sampling resumes at the output position the suffix moved it to
    assert ids[n + num_suffix :] == script[n + num_suffix : max_tokens]
    control_events = [e for e in events if e.kind == EventKind.TOKENS and e.num_control]
    assert len(control_events) == 1 and control_events[0].num_output == n + num_suffix
    assert control_events[0].text == GUIDANCE + CLOSE_MARKER
    # every committed token was fed to the model once, in order (the last is never fed)
    assert runner.fed == ids[:-1]
    done = events[-1]
    assert done.finish_reason == FinishReason.LENGTH
    assert done.usage.completion_tokens == max_tokens  # inserted tokens count


@pytest.mark.parametrize("close_at", [2, 5])
def test_natural_close_at_or_before_the_cap_inserts_nothing(tokenizer, close_at) -> None:
    script = list(range(500, 600))
    script[close_at - 1] = THINK_END
    events, _ = _run(tokenizer, script, max_tokens=40, thinking_budget=5)
    assert _ids(events) == script[:40]
    assert all(e.num_control == 0 for e in events)


def test_stop_and_limits_at_the_cap_win(tokenizer) -> None:
    script = list(range(500, 600))
    script[4] = EOS  # the 5th token stops the request
    events, _ = _run(tokenizer, script, max_tokens=40, thinking_budget=5)
    assert _ids(events) == script[:5] and events[-1].finish_reason == FinishReason.STOP
    events, _ = _run(tokenizer, list(range(500, 600)), max_tokens=5, thinking_budget=5)
    assert len(_ids(events)) == 5 and events[-1].finish_reason == FinishReason.LENGTH
    # context-limited capacity equal to the cap: a context finish, no rejection
    events, _ = _run(
        tokenizer, list(range(500, 600)), max_tokens=90, thinking_budget=5, max_context=11
    )
    assert len(_ids(events)) == 5 and events[-1].finish_reason == FinishReason.CONTEXT


def test_capacity_rejection_at_submission(tokenizer, control) -> None:
    n, num_suffix = 5, len(control.suffix_ids)
    core = _core(tokenizer, ScriptRunner(list(range(500, 600))))
    try:
        for max_tokens in (n + 1, n + num_suffix):
            with pytest.raises(ThinkingBudgetCapacityInsufficient):
                core.submit(GenerationRequest(PROMPT, max_tokens, thinking_budget=n), print)
        # the context can also be what cuts the capacity short of the suffix
        small = _core(tokenizer, ScriptRunner([]), max_context=len(PROMPT) + n + num_suffix)
        try:
            with pytest.raises(ThinkingBudgetCapacityInsufficient):
                small.submit(GenerationRequest(PROMPT, 500, thinking_budget=n), print)
        finally:
            small.close()
    finally:
        core.close()
    events, _ = _run(tokenizer, list(range(500, 600)), max_tokens=n + num_suffix + 1,
                     thinking_budget=n)  # fmt: skip
    assert len(_ids(events)) == n + num_suffix + 1


def test_stop_strings_do_not_cut_the_suffix(tokenizer, control) -> None:
    events, _ = _run(
        tokenizer, list(range(500, 600)), max_tokens=40, thinking_budget=3, stop=("limited time",)
    )
    assert events[-1].finish_reason == FinishReason.LENGTH
    assert "limited time" in "".join(e.text for e in events)


@pytest.fixture(scope="module")
def demo_engine():
    from ninfer import Engine
    from ninfer.artifact.demo import ensure_demo

    engine = Engine.load(ensure_demo(), dtype="fp32", max_context=256, prefill_chunk=512)
    yield engine
    engine.close()


def test_tiny_model_continuation_equals_prefill_of_the_inserted_tokens(demo_engine, control):
    """Greedy output after the suffix equals greedy output of a prompt that already holds it."""
    engine = demo_engine
    prompt = engine.tokenizer.encode_template(
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    n, num_suffix, num_after = 4, len(control.suffix_ids), 6
    max_tokens = n + num_suffix + num_after
    capped = _ids(engine.generate(prompt, max_tokens=max_tokens, thinking_budget=n, greedy=True))
    assert tuple(capped[n : n + num_suffix]) == control.suffix_ids
    reference = _ids(
        engine.generate(prompt + capped[: n + num_suffix], max_tokens=num_after, greedy=True)
    )
    assert capped[n + num_suffix :] == reference


def test_chat_budget_precedence_and_reasoning_accounting(demo_engine, control) -> None:
    engine = demo_engine
    hello = [{"role": "user", "content": "hi"}]
    num_suffix = len(control.suffix_ids)

    def chat(**kw):
        events = list(engine.chat(hello, max_tokens=num_suffix + 12, greedy=True, **kw))
        reasoning = "".join(e.text for e in events if e.kind == "reasoning")
        return reasoning, events[-1].usage

    engine.default_thinking_budget = 3
    try:
        reasoning, usage = chat()
        assert reasoning.endswith(GUIDANCE.strip())
        own, _ = chat(thinking_budget=5)  # the request's budget overrides the default
        assert own.endswith(GUIDANCE.strip()) and own != reasoning
        capped_ids = _ids(engine.generate(_chat_prompt(engine, hello), max_tokens=5, greedy=True))
        assert own.startswith(engine.tokenizer.decode(capped_ids).strip("\n"))
        # the guidance and close marker are reasoning tokens; the answer after them is not
        assert usage.reasoning_tokens == 3 + num_suffix
        assert usage.completion_tokens == num_suffix + 12
        off, _ = chat(enable_thinking=False)  # no cap without thinking
        assert off == ""
    finally:
        engine.default_thinking_budget = None


def _chat_prompt(engine, messages) -> list[int]:
    return engine.render(messages, enable_thinking=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_cuda_graph_decode_feeds_the_suffix_like_a_prefill(control, dtype) -> None:
    """CUDA-graph decode replays the catch-up steps; fp32 output still equals a prefill's."""
    from ninfer import Engine
    from ninfer.artifact.demo import ensure_demo

    with Engine.load(ensure_demo(), dtype=dtype, device="cuda:0", max_context=256) as engine:
        assert engine.graph_status == "on"
        prompt = engine.tokenizer.encode_template(
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
        )
        n, num_suffix, num_after = 6, len(control.suffix_ids), 8
        capped = _ids(
            engine.generate(
                prompt, max_tokens=n + num_suffix + num_after, thinking_budget=n, greedy=True
            )
        )
        assert tuple(capped[n : n + num_suffix]) == control.suffix_ids
        reference = _ids(
            engine.generate(prompt + capped[: n + num_suffix], max_tokens=num_after, greedy=True)
        )
        assert len(capped) == n + num_suffix + num_after
        if dtype == "fp32":  # bf16 prefill and decode kernels round differently
            assert capped[n + num_suffix :] == reference
