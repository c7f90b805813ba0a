"""EngineCore + Scheduler with a fake runner: admission, capacity, cancellation, finish reasons.

The fake runner "samples" a deterministic token per (request, step) without a model, so these
tests exercise the real scheduler, page pool, slot pool, output side and worker thread quickly.
"""

from __future__ import annotations

import threading
import time

import pytest

from ninfer.engine.core import EngineCore
from ninfer.engine.errors import ContextLengthExceeded, QueueTimeout, ServerOverloaded
from ninfer.engine.handles import RequestHandle
from ninfer.engine.kv_pool import PagePool
from ninfer.engine.plan import Completed, StepPlan, outcome_of
from ninfer.engine.request import EngineEvent, EventKind, FinishReason, GenerationRequest
from ninfer.engine.sampling import SamplingParams
from ninfer.engine.scheduler import Scheduler, SchedulerConfig
from ninfer.engine.state_slots import SlotPool
from ninfer.tokenizer import Tokenizer

EOS = 248046


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.qwen3_5()


class FakeRunner:
    """Token = f(prompt, output index); emits EOS when the request's `eos_at` index is drawn."""

    def __init__(self, delay: float = 0.0, gate: threading.Event | None = None) -> None:
        self.delay = delay
        self.gate = gate
        self.max_batch = 0
        self.prefill_chunks: list[int] = []

    @staticmethod
    def token(seq, index: int) -> int:
        eos_at = seq.request.sampling.get("eos_at")
        if eos_at is not None and index == eos_at:
            return EOS
        return 1000 + (sum(seq.token_ids[: seq.num_prompt]) * 31 + index) % 5000

    def launch(self, plan: StepPlan) -> Completed:
        if self.gate is not None:
            self.gate.wait()
        if self.delay:
            time.sleep(self.delay)
        self.prefill_chunks += [r.num_new_tokens for r in plan.prefill]
        self.max_batch = max(self.max_batch, len(plan.decode))
        for row in plan.rows:  # a row's pages cover every position it writes
            assert len(row.pages) * 4 >= row.start + row.num_new_tokens
        tokens = [self.token(r.seq, r.sample_index) for r in plan.rows if r.samples]
        return Completed(plan, outcome_of(plan, tokens))


def make_core(
    tokenizer, runner, *, lanes=2, pending=4, pages=64, chunk=8, max_context=64, timeout=30.0
):
    sched = Scheduler(
        SchedulerConfig(
            max_concurrency=lanes,
            max_pending=pending,
            pending_timeout_s=timeout,
            prefill_chunk=chunk,
            max_context=max_context,
        ),
        PagePool(pages, 4),
        SlotPool(lanes * 2),
    )

    def resolve(req: GenerationRequest) -> SamplingParams:
        return SamplingParams(greedy=True)

    core = EngineCore(
        sched,
        runner,
        tokenizer,
        eos_token_ids=frozenset({EOS}),
        resolve_sampling=resolve,
    )
    return core, sched


def _req(n: int, max_tokens: int, **kw) -> GenerationRequest:
    sampling = {"eos_at": kw.pop("eos_at")} if "eos_at" in kw else {}
    return GenerationRequest(tuple(range(10, 10 + n)), max_tokens, sampling=sampling, **kw)


def _run(core, req) -> list[EngineEvent]:
    return list(RequestHandle(core, req))


def _wait_idle(core, sched) -> None:
    for _ in range(500):
        if core._num_live == 0 and not sched.running and not sched.waiting:
            return
        time.sleep(0.01)
    raise AssertionError("engine did not go idle")


def test_finish_reasons_and_usage(tokenizer) -> None:
    core, sched = make_core(tokenizer, FakeRunner())
    try:
        ev = _run(core, _req(5, 7))
        assert ev[-1].finish_reason == FinishReason.LENGTH
        assert ev[-1].usage.completion_tokens == 7 and ev[-1].usage.prompt_tokens == 5
        assert sum(len(e.token_ids) for e in ev) == 7
        ev = _run(core, _req(5, 50, eos_at=3))
        assert ev[-1].finish_reason == FinishReason.STOP
        assert ev[-1].usage.completion_tokens == 4  # the stop token is counted
        ev = _run(core, _req(60, 50))  # 60 prompt + 4 output reaches max_context 64
        assert ev[-1].finish_reason == FinishReason.CONTEXT
        assert ev[-1].usage.completion_tokens == 4
        _wait_idle(core, sched)
        sched.check_integrity()
    finally:
        core.close()


def test_max_tokens_zero_processes_prompt_only(tokenizer) -> None:
    runner = FakeRunner()
    core, sched = make_core(tokenizer, runner, chunk=8)
    try:
        ev = _run(core, _req(21, 0))
        assert ev[0].kind == EventKind.ADMITTED and ev[0].num_prompt == 21
        progress = [e.num_processed for e in ev if e.kind == EventKind.PROGRESS]
        assert progress == [8, 16, 21]
        assert runner.prefill_chunks == [8, 8, 5]
        assert ev[-1].finish_reason == FinishReason.LENGTH
        assert ev[-1].usage.completion_tokens == 0
        assert not [e for e in ev if e.kind == EventKind.TOKENS]
    finally:
        core.close()


def test_typed_capacity_errors(tokenizer) -> None:
    gate = threading.Event()
    core, sched = make_core(tokenizer, FakeRunner(gate=gate), lanes=1, pending=1, pages=8)
    try:
        with pytest.raises(ContextLengthExceeded, match="64"):
            core.submit(_req(64, 1), lambda e: None)
        with pytest.raises(ContextLengthExceeded, match="kv_capacity"):
            core.submit(_req(40, 1), lambda e: None)  # 8 pages x 4 tokens = 32
        events: list[EngineEvent] = []
        core.submit(_req(4, 3), events.append)
        core.submit(_req(4, 3), events.append)
        with pytest.raises(ServerOverloaded):
            core.submit(_req(4, 3), events.append)
        gate.set()
        _wait_idle(core, sched)
        assert sum(e.kind == EventKind.FINISHED for e in events) == 2
        core.submit(_req(4, 3), events.append)  # capacity is back
    finally:
        gate.set()
        core.close()


def test_queue_timeout_for_waiting_request(tokenizer) -> None:
    core, sched = make_core(tokenizer, FakeRunner(delay=0.01), lanes=1)
    try:
        first = RequestHandle(core, _req(4, 40))
        late = list(RequestHandle(core, _req(4, 3, pending_timeout_s=0.05)))
        assert late[-1].kind == EventKind.ERROR and isinstance(late[-1].error, QueueTimeout)
        assert list(first)[-1].finish_reason == FinishReason.LENGTH
        _wait_idle(core, sched)
        sched.check_integrity()
    finally:
        core.close()


def test_decode_batch_is_compact_and_shared(tokenizer) -> None:
    runner = FakeRunner(delay=0.002)
    core, sched = make_core(tokenizer, runner, lanes=4, pending=8, pages=128)
    try:
        handles = [RequestHandle(core, _req(3 + i, 10)) for i in range(6)]
        results = [list(h) for h in handles]
        assert all(r[-1].finish_reason == FinishReason.LENGTH for r in results)
        assert runner.max_batch >= 2  # requests decoded together
        assert runner.max_batch <= 4  # never more rows than lanes
        # each request saw exactly its own deterministic tokens
        for i, r in enumerate(results):
            toks = [t for e in r for t in e.token_ids]
            prompt_sum = sum(range(10, 13 + i))
            assert toks == [1000 + (prompt_sum * 31 + k) % 5000 for k in range(10)]
    finally:
        core.close()


def test_fifo_bypass_is_bounded() -> None:
    pages, slots = PagePool(4, 4), SlotPool(8)
    sched = Scheduler(
        SchedulerConfig(max_concurrency=8, prefill_chunk=16, max_bypass=2, max_context=64),
        pages,
        slots,
    )
    from ninfer.engine.scheduler import Sequence

    def seq(n: int, name: str) -> Sequence:
        return Sequence(name, _req(n, 1), SamplingParams(), list(range(n)), n, 0.0, 1e9)

    hog = pages.allocate(3)  # only one page left: the 16-token head cannot start
    head = seq(16, "head")
    small = [seq(2, f"s{i}") for i in range(4)]
    for s in [head, *small]:
        sched.waiting.append(s)
    sched._admit()
    admitted = [s.request_id for s in sched.running]
    assert admitted == ["s0", "s1"]  # two bypasses, then the head blocks the queue
    assert [s.request_id for s in sched.waiting] == ["head", "s2", "s3"]
    pages.release(hog)
    sched._admit()
    assert [s.request_id for s in sched.running][2] == "head"


def test_a_failing_consumer_is_cancelled_not_the_engine(tokenizer) -> None:
    core, sched = make_core(tokenizer, FakeRunner(), lanes=2)
    try:

        def broken(event: EngineEvent) -> None:
            if event.kind == EventKind.TOKENS:
                raise RuntimeError("Event loop is closed")

        core.submit(_req(4, 50), broken)
        ev = _run(core, _req(5, 6))
        assert ev[-1].finish_reason == FinishReason.LENGTH
        _wait_idle(core, sched)
        assert core.healthy and core.failure is None
        sched.check_integrity()
    finally:
        core.close()


def test_detokenizer_table_is_built_with_the_core_not_by_the_first_submit() -> None:
    # submit() runs on the caller's event loop and inside the request's pending deadline; the
    # ~0.5 s vocabulary table once cost the first request of a busy server its 1 s budget.
    fresh = Tokenizer.from_json(Tokenizer.qwen3_5().to_json())
    assert "byte_table" not in vars(fresh)
    core, _ = make_core(fresh, FakeRunner())
    try:
        assert vars(fresh)["byte_table"] is not None
    finally:
        core.close()
