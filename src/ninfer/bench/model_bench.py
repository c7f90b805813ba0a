"""Prefill and decode timings of a synthetic real-shape model on one GPU.

Imports torch, model/, engine.graphs and bench siblings. It drives the model the way the engine's
runner does (prefill chunks through `Qwen3_5Model.forward`, decode through the engine's
`DecodeStep`: forward and greedy sampling in one CUDA graph, or eagerly; the sampled ids reach the
host every step), without the scheduler or the overlapped loop: there is no
artifact or tokenizer. Decode contexts are set by position, over KV pages and states filled with
random values, so a 32k-context step costs what it would after a real 32k prefill.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch

from ninfer.bench.profile import ShapeRow, profile_steps, summarize
from ninfer.bench.results import DecodeResult, PrefillResult, StepProfile
from ninfer.engine.graphs import DecodeInput, DecodeStep, GraphError, unsupported_reason
from ninfer.kernels import dispatch
from ninfer.kernels.kv_quant.formats import QuantPages
from ninfer.model.batch import ForwardBatch
from ninfer.model.cache import ModelCache
from ninfer.model.qwen3_5 import Qwen3_5Model

PAGE_SIZE = 64


class ModelBench:
    """A model, a cache sized for the requested matrix, and (when capturable) decode graphs."""

    def __init__(
        self,
        model: Qwen3_5Model,
        *,
        max_batch: int,
        max_seq_tokens: int,
        max_total_tokens: int,
        seed: int = 0,
        kv_dtype: str = "bf16",
    ) -> None:
        """max_seq_tokens: longest sequence (prefill or decode, steps included); max_total_tokens:
        the most tokens all rows of one decode call hold together (rows own disjoint pages)."""
        self.model = model
        self.device = model.device
        self.max_batch = max_batch
        pages_per_seq = -(-max_seq_tokens // PAGE_SIZE)
        total = max(pages_per_seq, -(-max_total_tokens // PAGE_SIZE) + max_batch)
        self.num_pages = total + 1  # + the graphs' dummy page
        self.prefill_slot = max_batch
        self.dummy_slot = max_batch + 1
        self.cache = ModelCache.allocate(
            model.config,
            num_pages=self.num_pages,
            num_slots=max_batch + 2,
            page_size=PAGE_SIZE,
            dtype=model.dtype,
            device=self.device,
            kv_dtype=kv_dtype,
        )
        gen = torch.Generator(self.device).manual_seed(seed)
        for pages in (*self.cache.k_pages, *self.cache.v_pages):
            fill_normal(pages, gen)
        for t in self.cache.conv_state:
            t.normal_(0.0, 1.0, generator=gen)
        for t in self.cache.ssm_state:
            t.normal_(0.0, 0.05, generator=gen)
        self.graphs_reason = unsupported_reason(model, max_batch)
        self.graphs: DecodeStep | None = None
        if self.graphs_reason is None:
            self.graphs = self._decode_step(pages_per_seq, use_graphs=True)
        self.eager = self._decode_step(pages_per_seq, use_graphs=False)
        self._pages_per_seq = pages_per_seq
        self._gen = torch.Generator().manual_seed(seed)

    def recapture(self) -> None:
        """Drop the captured decode graphs (and the eager step's state) so the next decode calls
        launch and capture afresh, under the switches set now (bench/ab.py)."""
        if self.graphs is not None:
            self.graphs = self._decode_step(self._pages_per_seq, use_graphs=True)
        self.eager = self._decode_step(self._pages_per_seq, use_graphs=False)

    def _decode_step(self, max_pages: int, *, use_graphs: bool) -> DecodeStep:
        """The engine's decode step (forward + greedy sampling + device feed of the next id)."""
        return DecodeStep(
            self.model,
            self.cache,
            max_batch=self.max_batch,
            max_pages=max_pages,
            num_sampleable=self.model.config.vocab_size,
            use_graphs=use_graphs,
            dummy_slot=self.dummy_slot,
            dummy_page=self.num_pages - 1,
        )

    def _token_ids(self, n: int) -> list[int]:
        return torch.randint(0, self.model.config.vocab_size, (n,), generator=self._gen).tolist()

    # -- prefill -------------------------------------------------------------------------------
    def prefill(self, num_tokens: int, *, chunk: int, repeats: int) -> PrefillResult:
        """Best of `repeats` timed prefills of a fresh random prompt into the prefill slot, and
        the first one's time (`first_ttft_ms`)."""
        page_ids = list(range(-(-num_tokens // PAGE_SIZE)))
        if len(page_ids) > self.num_pages - 1:
            raise ValueError(f"{num_tokens} tokens need more than the {self.num_pages - 1} pages")
        times = []
        for _ in range(repeats):
            ids = self._token_ids(num_tokens)
            self.cache.reset_slot(self.prefill_slot)
            torch.cuda.synchronize(self.device)
            start = time.perf_counter()
            logits = None
            for begin in range(0, num_tokens, chunk):
                batch = ForwardBatch.prefill(
                    ids[begin : begin + chunk],
                    num_computed=begin,
                    page_ids=page_ids,
                    state_slot=self.prefill_slot,
                    device=self.device,
                )
                logits = self.model.forward(batch, self.cache)
            assert logits is not None
            int(logits.argmax(-1).item())  # the first token reaches the host
            times.append(time.perf_counter() - start)
        best = min(times)
        return PrefillResult(
            num_tokens, chunk, best, num_tokens / best, best * 1000.0, first_ttft_ms=times[0] * 1e3
        )

    # -- decode --------------------------------------------------------------------------------
    def decode(
        self, batch: int, context: int, *, steps: int, use_graphs: bool, warmup: int = 3
    ) -> DecodeResult:
        """Median step time of `steps` greedy decode steps of `batch` rows starting at `context`."""
        if use_graphs and self.graphs is None:
            raise ValueError(f"CUDA graphs are unavailable: {self.graphs_reason}")
        num_pages = -(-(context + warmup + steps + 1) // PAGE_SIZE)
        if (
            batch > self.max_batch
            or num_pages > self._pages_per_seq
            or batch * num_pages > self.num_pages - 1
        ):
            raise ValueError(f"batch {batch} at context {context} does not fit the bench cache")
        page_tables = [list(range(b * num_pages, (b + 1) * num_pages)) for b in range(batch)]
        slots = list(range(batch))
        if use_graphs:
            try:  # capture (or find) this cell's graph before timing anything
                self.graphs.capture(batch, num_pages)  # type: ignore[union-attr]
            except GraphError as e:
                self.graphs, self.graphs_reason, use_graphs = None, str(e), False
        step = self._graph_step if use_graphs else self._eager_step
        ids = self._token_ids(batch)
        times = []
        for i in range(warmup + steps):
            start = time.perf_counter()
            ids = step(ids, [context + i] * batch, page_tables, slots)
            if i >= warmup:
                times.append(time.perf_counter() - start)
        step_s = statistics.median(times)
        return DecodeResult(batch, context, use_graphs, step_s * 1000.0, batch / step_s)

    def profile_decode(self, batch: int, context: int, *, steps: int = 3) -> StepProfile:
        """Kernel time of eager decode steps (same position each step: a profile, not a run)."""
        num_pages = -(-(context + 1) // PAGE_SIZE)
        page_tables = [list(range(b * num_pages, (b + 1) * num_pages)) for b in range(batch)]
        ids = self._token_ids(batch)
        slots = list(range(batch))
        positions = [context] * batch

        def step() -> object:
            return self._eager_step(ids, positions, page_tables, slots)

        shapes: list[ShapeRow] = []
        events = profile_steps(step, steps, self.device.type, shapes=shapes)
        return summarize(events, steps, batch=batch, context=context, shapes=shapes)

    def profile_prefill(self, num_tokens: int) -> StepProfile:
        """Kernel time of one eager prefill of `num_tokens` fresh tokens (one forward)."""
        page_ids = list(range(-(-num_tokens // PAGE_SIZE)))
        ids = self._token_ids(num_tokens)

        def step() -> object:
            self.cache.reset_slot(self.prefill_slot)
            batch = ForwardBatch.prefill(
                ids,
                num_computed=0,
                page_ids=page_ids,
                state_slot=self.prefill_slot,
                device=self.device,
            )
            return self.model.forward(batch, self.cache)

        shapes: list[ShapeRow] = []
        events = profile_steps(step, 1, self.device.type, shapes=shapes)
        return summarize(events, 1, batch=1, context=num_tokens, kind="prefill", shapes=shapes)

    def _graph_step(
        self,
        ids: list[int],
        positions: list[int],
        page_tables: Sequence[Sequence[int]],
        slots: list[int],
    ) -> list[int]:
        assert self.graphs is not None
        return _step(self.graphs, ids, positions, page_tables, slots)

    def _eager_step(
        self,
        ids: list[int],
        positions: list[int],
        page_tables: Sequence[Sequence[int]],
        slots: list[int],
    ) -> list[int]:
        return _step(self.eager, ids, positions, page_tables, slots)


def fill_normal(pages: torch.Tensor | QuantPages, gen: torch.Generator) -> None:
    """Every KV row drawn from N(0, 1), stored as the pages' format stores it (quantized pages
    go through the store op, so their bytes and scales are what a real prefill leaves)."""
    if not isinstance(pages, QuantPages):
        pages.normal_(0.0, 1.0, generator=gen)
        return
    num_pages, page_size, num_heads, head_dim = pages.shape
    slots_per_chunk = 1 << 16  # rows drawn at a time: 64k tokens x Hk x D fp32
    total = num_pages * page_size
    for start in range(0, total, slots_per_chunk):
        slots = torch.arange(start, min(total, start + slots_per_chunk), device=pages.device)
        rows = torch.empty(
            (len(slots), num_heads, head_dim), dtype=torch.float32, device=pages.device
        ).normal_(0.0, 1.0, generator=gen)
        dispatch.store_kv(rows, pages, slots)


def _step(
    step: DecodeStep,
    ids: list[int],
    positions: list[int],
    page_tables: Sequence[Sequence[int]],
    slots: list[int],
) -> list[int]:
    """One greedy decode step as the engine runs it; the sampled ids reach the host (a sync)."""
    rows = [
        DecodeInput(token, pos, slot, pages)
        for token, pos, slot, pages in zip(ids, positions, slots, page_tables, strict=True)
    ]
    return step.run(rows).tolist()


def run_matrix(
    bench: ModelBench,
    *,
    prefill_sizes: Sequence[int],
    prefill_chunk: int,
    decode_batches: Sequence[int],
    decode_contexts: Sequence[int],
    decode_steps: int,
    eager_baseline: bool,
    on_progress: Callable[[str], None],
) -> tuple[list[PrefillResult], list[DecodeResult]]:
    """The default matrix: prefills, then decode per batch at the first context, then batch 1
    at the other contexts; an eager batch-1 row when asked (to show what the graphs buy)."""
    prefills = []
    if prefill_sizes:
        on_progress("prefill warm-up")
        bench.prefill(min(prefill_sizes), chunk=prefill_chunk, repeats=1)
    for n in prefill_sizes:
        on_progress(f"prefill {n} tokens")
        # best of two: the first run of a new length may build cuDNN attention plans for its
        # length bucket (reported apart as first_ttft_ms); a warm server has them
        prefills.append(bench.prefill(n, chunk=prefill_chunk, repeats=2))
    decodes = []
    cells = [(b, decode_contexts[0]) for b in decode_batches]
    cells += [(1, c) for c in decode_contexts[1:]]
    for b, ctx in cells:
        graphs = bench.graphs is not None  # a failed capture turns them off for the rest
        on_progress(f"decode batch {b} at {ctx} context{' (graph capture)' if graphs else ''}")
        decodes.append(bench.decode(b, ctx, steps=decode_steps, use_graphs=graphs))
    if eager_baseline and bench.graphs is not None:
        on_progress("decode batch 1, eager")
        decodes.append(bench.decode(1, decode_contexts[0], steps=decode_steps, use_graphs=False))
    return prefills, decodes
