"""The engine with penalties on the per-slot counts the decode step keeps on the device: every
sampler call sees exactly count_output_ids of its rows, and whole request streams, with the
overlapped loop on, equal those of a runner that rebuilds the counts from scratch before each
step (overlap off). A fake model keeps it fast; the real scheduler, core, runner, decode step and
sampler run, with slot reuse, cancellations and thinking-budget control suffixes in the mix."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
import torch

from ninfer.engine.core import EngineCore
from ninfer.engine.graphs import DecodeStep
from ninfer.engine.kv_pool import PagePool
from ninfer.engine.plan import StepPlan
from ninfer.engine.request import EngineEvent, EventKind, GenerationRequest
from ninfer.engine.runner import ModelRunner
from ninfer.engine.sampling import SamplingParams, count_output_ids
from ninfer.engine.scheduler import Scheduler, SchedulerConfig
from ninfer.engine.state_slots import SlotPool
from ninfer.model.batch import ForwardBatch
from ninfer.tokenizer import Tokenizer

VOCAB = 248_320  # the control suffix's ids must be in range
EOS = 248046
NUM_TABLE_ROWS = 8  # few distinct logit rows: tokens recur, so penalties change the draws


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.qwen3_5()


@pytest.fixture(scope="module")
def table() -> torch.Tensor:
    return 2.0 * torch.randn(NUM_TABLE_ROWS, VOCAB, generator=torch.Generator().manual_seed(8))


class FakeModel:
    """Logits depend only on each sequence's last input token and its position."""

    device = torch.device("cpu")

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table

    def forward(self, batch: ForwardBatch, cache: object) -> torch.Tensor:
        last = batch.cu_seqlens[1:].long() - 1
        keys = (batch.input_ids[last] * 31 + batch.positions[last]) % NUM_TABLE_ROWS
        return self.table[keys]  # [B, V]

    def forward_hidden(self, batch: ForwardBatch, cache: object) -> None:
        return None


class FakeCache:
    page_size = 4
    num_pages = 256

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots

    def reset_slot(self, slot: int) -> None:
        assert 0 <= slot < self.num_slots


class CheckingRunner(ModelRunner):
    """Records, per decode row, whether the counts it samples with equal the definition (valid
    with the overlap off: every earlier sample of the row's sequence has been committed)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.checks: list[bool] = []

    def launch(self, plan: StepPlan):
        self.decode.adjust_counts(plan.uncount_slots, plan.count_tokens)
        for row in plan.decode:
            want = count_output_ids([row.seq.output_ids], VOCAB)[0]
            self.checks.append(torch.equal(self.decode.counts[row.slot], want))
        return super().launch(replace(plan, uncount_slots=(), count_tokens=()))


class FromScratchRunner(ModelRunner):
    """The reference: rebuild each decode row's counts from its committed outputs every step."""

    def launch(self, plan: StepPlan):
        for row in plan.decode:
            self.decode.counts[row.slot] = count_output_ids([row.seq.output_ids], VOCAB)[0]
        return super().launch(replace(plan, uncount_slots=(), count_tokens=()))


def _run(runner_cls: type[ModelRunner], tokenizer, table, penalties: bool, overlap: bool):
    lanes = 3
    slots = SlotPool(lanes + 1)
    sched = Scheduler(
        SchedulerConfig(max_concurrency=lanes, max_pending=32, prefill_chunk=8, max_context=256),
        PagePool(256, 4),
        slots,
    )
    model, cache = FakeModel(table), FakeCache(slots.num_slots)
    decode = DecodeStep(
        model, cache, max_batch=lanes, max_pages=64, num_sampleable=VOCAB, use_graphs=False
    )
    runner = runner_cls(model, cache, decode)

    def resolve(req: GenerationRequest) -> SamplingParams:
        return SamplingParams(
            temperature=0.8,
            top_p=0.95,
            presence_penalty=1.5 if penalties else 0.0,
            frequency_penalty=0.5 if penalties else 0.0,
            seed=int(req.request_id[1:]) * 7919,
        )

    core = EngineCore(
        sched,
        runner,
        tokenizer,
        eos_token_ids=frozenset({EOS}),
        resolve_sampling=resolve,
        overlap=overlap,
    )
    events: dict[str, list[EngineEvent]] = {}
    done = threading.Semaphore(0)
    gen = torch.Generator().manual_seed(5)
    num_requests = 12
    try:
        for i in range(num_requests):
            rid = f"r{i}"
            events[rid] = []
            cancel_at = 9 if i % 4 == 1 else None

            def sink(e: EngineEvent, rid=rid, cancel_at=cancel_at) -> None:
                events[rid].append(e)
                if (
                    cancel_at is not None
                    and e.kind == EventKind.TOKENS
                    and e.num_output >= cancel_at
                ):
                    core.cancel(rid)
                if e.is_terminal:
                    done.release()

            prompt = tuple(
                torch.randint(
                    0, 5000, (int(torch.randint(3, 20, (1,), generator=gen)),), generator=gen
                ).tolist()
            )
            core.submit(
                GenerationRequest(
                    prompt,
                    max_tokens=45,
                    request_id=rid,
                    ignore_eos=True,
                    thinking_budget=4 if i % 3 == 0 else None,
                ),
                sink,
            )
        for _ in range(num_requests):
            assert done.acquire(timeout=120), "the engine stalled"
    finally:
        core.close()
    streams = {
        rid: [t for e in ev if e.kind == EventKind.TOKENS for t in e.token_ids]
        for rid, ev in events.items()
    }
    assert all(ev[-1].kind == EventKind.FINISHED for ev in events.values())
    return streams, runner


def test_device_counts_equal_rebuilt_counts_in_a_running_engine(tokenizer, table) -> None:
    streams, runner = _run(CheckingRunner, tokenizer, table, penalties=True, overlap=False)
    assert len(runner.checks) > 50 and all(runner.checks)
    assert sum(len(s) for s in streams.values()) > 300
    reference, _ = _run(FromScratchRunner, tokenizer, table, penalties=True, overlap=False)
    assert streams == reference
    # the overlapped loop (samples fed on the device, counts corrected one step late) agrees
    overlapped, _ = _run(ModelRunner, tokenizer, table, penalties=True, overlap=True)
    assert overlapped == reference
    # power: the penalties really steer these streams, so equal streams mean equal counts
    unpenalised, _ = _run(FromScratchRunner, tokenizer, table, penalties=False, overlap=False)
    assert sum(streams[r] != unpenalised[r] for r in streams) >= len(streams) // 2
