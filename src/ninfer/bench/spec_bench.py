"""`ninfer bench --spec mtp`: speculative decoding with the MTP head on random weights.

Imports torch, the public api, engine/ and model/. Random weights accept almost nothing (the
head's argmax rarely equals the target's), so a measured acceptance length near 1 says nothing
about real checkpoints. The report therefore has two parts per decode batch B:

- **measured end to end**: B greedy requests through `Engine.from_model(spec="mtp")`: output
  tok/s while all B decode (the steady window of `--e2e`), what a round takes there
  (`e2e_round_ms`, host work between rounds included; `e2e_round_over_round` against the
  round's graph alone), the same without chained rounds (`e2e_unchained_tok_s`,
  `e2e_unchained_round_ms`: every round lands before the next is planned), acceptance length
  (mean tokens committed per round) and the accepted drafts per position, summed over the
  requests' `speculative` counters;
- **step costs and projections**: the plain decode step (the engine's `DecodeStep`, a CUDA
  graph when available), the verify forward of B rows of k + 1 tokens, one autoregressive head
  step, and a whole round as the engine runs it (verify, acceptance, head pass, k - 1 head
  steps; the fold of the kept columns runs after it, between steps) for greedy rows
  (`round_ms`, the argmax acceptance), for greedy rows as the end-to-end requests run them
  (`round_served_ms`: `greedy` keeps the architecture's preset penalties, so the 35B-A3B's
  rows carry its presence penalty 1.5 and take the penalized argmax; `e2e_round_over_round`
  is against this round) and for sampled rows (`round_sampled_ms`: temperature 0.7, top-p
  0.95, the general acceptance), each the median of `steps` timed runs at
  context `context`, every row and verify column fed a distinct random id (fresh drafts before
  each round: one id everywhere would send every MoE row to the same experts); from the greedy
  round the tok/s a round implies at a stated acceptance length L: B * L / round time (and the
  plain step's B / step time beside it).
On CUDA every cost is a CUDA-graph replay (the round as the engine replays it, staging
included; the verify forward and the head step captured here for timing). With `profile`, each
batch also gets the kernels of one eager round over the same padded body the graph holds
(`round_profile`, as `--profile` gives for a decode step): where a round's time goes beyond the
verify.
"""

from __future__ import annotations

import gc
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ninfer.bench.ab import cycle
from ninfer.bench.profile import profile_steps, summarize
from ninfer.engine.graphs import DecodeInput, DecodeStep
from ninfer.engine.handles import RequestHandle
from ninfer.engine.request import EventKind
from ninfer.engine.sampling import THINKING, presets_for
from ninfer.engine.spec_step import SpecInput, SpecStep
from ninfer.model.batch import ForwardBatch
from ninfer.model.cache import ModelCache
from ninfer.model.lm_head_draft import ShortlistHead
from ninfer.model.mtp import MtpHead
from ninfer.model.qwen3_5 import Qwen3_5Model

PAGE_SIZE = 64
GREEDY_FIELDS = ((1.0, 1.0, 0.0, 0.0, 0.0), (1, 1, 0, 0))
# a sampled row: temperature 0.7, top-p 0.95, top-k 20, seed 1 (the general acceptance)
SAMPLED_FIELDS = ((0.7, 0.95, 0.0, 0.0, 0.0), (20, 0, 1, 0))


def served_greedy_fields(architecture: str) -> tuple[tuple, tuple]:
    """A greedy row as `_drive`'s requests are served: `greedy` keeps the thinking preset's
    presence and frequency penalties (the 35B-A3B's presence 1.5)."""
    preset = presets_for(architecture)[THINKING]
    reals = (1.0, 1.0, 0.0, preset.presence_penalty, preset.frequency_penalty)
    return reals, GREEDY_FIELDS[1]


def run_spec_bench(
    model: Qwen3_5Model,
    head: MtpHead,
    *,
    architecture: str,
    draft_tokens: int,
    batches: Sequence[int],
    context: int,
    prompt_tokens: int,
    output_tokens: int,
    steps: int,
    acceptance_lengths: Sequence[float] = (1.0, 2.0, 3.2),
    lm_head_draft: bool = False,
    profile: bool = False,
    ab: Sequence[tuple[str, str]] = (),
    ab_rounds: int = 1,
    on_progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Measure every batch in `batches`; returns the JSON-ready report (see the module doc).
    `lm_head_draft`: drafts through the 4-bit shortlist head, as `--lm-head-draft` serves;
    `profile`: each row gets `round_profile` (kernels of one eager round); `ab` (`--ab`
    settings, bench/ab.py): each row gets `ab`, the round's pieces timed again under each
    setting and then the base, `ab_rounds` times over."""
    rows = []
    for batch in batches:
        on_progress(f"spec e2e: batch {batch}")
        args = (model, head, architecture, draft_tokens, batch, prompt_tokens, output_tokens)
        e2e = _e2e(*args, lm_head_draft, chained=True)
        unchained = _e2e(*args, lm_head_draft, chained=False)
        e2e["e2e_unchained_tok_s"] = unchained["e2e_tok_s"]
        e2e["e2e_unchained_round_ms"] = unchained["e2e_round_ms"]
        on_progress(f"spec step costs: batch {batch}, context {context}")
        costs = _step_costs(
            model,
            head,
            draft_tokens,
            batch,
            context,
            steps,
            lm_head_draft,
            served=served_greedy_fields(architecture),
            profile=profile,
        )
        round_s = costs["round_ms"] / 1000.0
        costs["projected_tok_s"] = {
            f"{length:g}": batch * length / round_s for length in acceptance_lengths
        }
        costs["plain_tok_s"] = batch / (costs["plain_decode_ms"] / 1000.0)
        costs["verify_over_plain_decode"] = costs["verify_ms"] / costs["plain_decode_ms"]
        # the host's share of a round end to end (what chaining leaves of it), against the
        # round the e2e requests run
        costs["e2e_round_over_round"] = e2e["e2e_round_ms"] / costs["round_served_ms"]
        if ab:
            costs["ab"] = _ab_costs(
                model, head, draft_tokens, batch, context, steps, lm_head_draft,
                ab, ab_rounds, on_progress,
            )  # fmt: skip
        rows.append({"batch": batch, **e2e, **costs})
    return {
        "draft_tokens": draft_tokens,
        "lm_head_draft": lm_head_draft,
        "context": context,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "note": "random weights: the measured acceptance length is not a model's; the "
        "projections assume the stated acceptance lengths",
        "rows": rows,
    }


def _e2e(
    model: Qwen3_5Model,
    head: MtpHead,
    architecture: str,
    k: int,
    batch: int,
    prompt_tokens: int,
    output_tokens: int,
    lm_head_draft: bool,
    *,
    chained: bool,
) -> dict[str, Any]:
    """`chained=False`: the engine lands every round before planning the next (`no_overlap`),
    the baseline that chained rounds are measured against in the same run."""
    from ninfer.api import Engine

    max_context = prompt_tokens + output_tokens + 2 * k + 2
    pages = -(-max_context // PAGE_SIZE)
    engine = Engine.from_model(
        model,
        architecture=architecture,
        mtp=head,
        spec="mtp",
        draft_tokens=k,
        lm_head_draft=lm_head_draft,
        max_concurrency=batch,
        max_pending_requests=batch,
        max_context=max_context,
        kv_capacity=batch * pages * PAGE_SIZE,
        device_state_slots=0,
        prefill_chunk=min(8192, prompt_tokens),
        pending_timeout_ms=600_000,
        no_prefix_reuse=True,
        page_size=PAGE_SIZE,
        dtype="bf16" if model.dtype == torch.bfloat16 else "fp32",
        device=str(model.device),
        no_overlap=not chained,
    )
    try:
        # a first, untimed pass captures the round graphs of every page-table width the timed
        # pass reaches (and compiles the kernels), as a serving engine has after its first turns
        vocab = min(model.config.vocab_size, 200_000)
        _drive(engine, batch, prompt_tokens, output_tokens, vocab)
        stamps, finals = _drive(engine, batch, prompt_tokens, output_tokens, vocab)
    finally:
        engine.close()
    # the steady state, as `--e2e` counts it: tokens committed while every request decodes
    # (from the last first token to the first last token), so later requests' prefills stay out
    first = max(s[0] for s in stamps)
    last = min(s[-1] for s in stamps)
    decoded = sum(1 for s in stamps for t in s if first < t <= last)
    # a round's tokens arrive in one event (one stamp): each request's distinct stamps in the
    # window count the rounds it took part in, every row of every round
    rounds_seen = statistics.mean(len({t for t in s if first < t <= last}) for s in stamps)
    spec = [f.stats.speculative for f in finals]
    rounds = sum(s["rounds"] for s in spec)
    accepted = sum(s["accepted_tokens"] for s in spec)
    per_position = [sum(s["accepted_per_position"][i] for s in spec) for i in range(k)]
    return {
        "e2e_tok_s": decoded / (last - first) if last > first else 0.0,
        # what a round costs end to end, host work between rounds included (beside round_ms)
        "e2e_round_ms": 1000.0 * (last - first) / rounds_seen if rounds_seen else 0.0,
        "rounds": rounds,
        "fallback_steps": sum(s["fallback_steps"] for s in spec),
        "acceptance_length": (rounds + accepted) / rounds if rounds else 0.0,
        "accepted_per_position": [n / rounds if rounds else 0.0 for n in per_position],
    }


def _drive(
    engine: Any, batch: int, prompt_tokens: int, output_tokens: int, vocab: int
) -> tuple[list[list[float]], list[Any]]:
    """`batch` greedy requests at once; per request the arrival time of each token and the
    terminal event."""
    g = torch.Generator().manual_seed(7)
    handles = [
        RequestHandle(
            engine.core,
            engine.make_request(
                torch.randint(0, vocab, (prompt_tokens,), generator=g).tolist(),
                max_tokens=output_tokens,
                ignore_eos=True,
                greedy=True,
            ),
        )
        for _ in range(batch)
    ]
    stamps: list[list[float]] = [[] for _ in handles]
    finals: list[Any] = [None] * batch

    def drain(i: int) -> None:
        for ev in handles[i]:
            if ev.kind == EventKind.TOKENS:
                stamps[i].extend([time.perf_counter()] * len(ev.token_ids))
            elif ev.is_terminal:
                finals[i] = ev

    threads = [threading.Thread(target=drain, args=(i,)) for i in range(batch)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return stamps, finals


AB_PIECES = ("plain_decode_ms", "verify_ms", "draft_step_ms", "round_ms")


def _ab_costs(
    model: Qwen3_5Model,
    head: MtpHead,
    k: int,
    batch: int,
    context: int,
    steps: int,
    lm_head_draft: bool,
    settings: Sequence[tuple[str, str]],
    rounds: int,
    on_progress: Callable[[str], None],
) -> list[dict[str, Any]]:
    """The round's pieces (AB_PIECES) under each `--ab` setting, then the base again (setting
    ''), the cycle `rounds` times. Each timing builds its own decode step, round and graphs
    (`_step_costs`), so a switch read at launch or capture applies; one process, one card, so
    the sides compare where two processes' rounds differ by ~1.4 % (docs/perf.md, run S36C)."""
    out = []
    for label, text in cycle(settings, rounds):
        on_progress(f"spec A/B, {text}: batch {batch}")
        costs = _step_costs(model, head, k, batch, context, steps, lm_head_draft, pieces_only=True)
        out.append({"setting": label, **costs})
        gc.collect()
        if model.device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def _step_costs(
    model: Qwen3_5Model,
    head: MtpHead,
    k: int,
    batch: int,
    context: int,
    steps: int,
    lm_head_draft: bool,
    *,
    served: tuple[tuple, tuple] = GREEDY_FIELDS,
    profile: bool = False,
    pieces_only: bool = False,
) -> dict[str, Any]:
    """Median milliseconds of the pieces of a round, on a private cache (zero KV: timing only);
    `served`: the fields of `round_served_ms`'s rows (`served_greedy_fields`); with `profile`,
    also `round_profile`: one eager round's kernels (`bench.profile`); `pieces_only`: only
    AB_PIECES (an A/B's timings)."""
    device = model.device
    cuda = device.type == "cuda"
    per_seq = -(-(context + 2 * k + 1) // PAGE_SIZE)
    cache = ModelCache.allocate(
        model.config,
        num_pages=batch * per_seq + 1,
        num_slots=batch + 1,
        page_size=PAGE_SIZE,
        dtype=model.dtype,
        device=device,
        extra_attention_layers=1,
    )
    vocab = min(model.config.vocab_size, 248077)
    decode = DecodeStep(
        model,
        cache,
        max_batch=batch,
        max_pages=per_seq,
        num_sampleable=vocab,
        use_graphs=cuda,
        dummy_slot=batch,
        dummy_page=batch * per_seq,
    )
    spec = SpecStep(
        model,
        head,
        cache,
        draft_tokens=k,
        num_sampleable=vocab,
        counts=decode.counts,
        max_batch=batch,
        max_pages=per_seq,
        use_graphs=cuda,
        dummy_slot=batch,
        dummy_page=batch * per_seq,
        shortlist=ShortlistHead(model.lm_head, vocab) if lm_head_draft else None,
    )
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(batch)]
    reals, ints = GREEDY_FIELDS
    # distinct random ids in every row and column: the same id everywhere would route every
    # MoE row and verify column to the same experts and time a fraction of the expert reads
    gen = torch.Generator().manual_seed(11)

    def ids(*shape: int) -> torch.Tensor:
        return torch.randint(0, vocab, shape, generator=gen)

    feed = ids(batch).tolist()
    plain_rows = [
        DecodeInput(
            token=feed[i], position=context, slot=i, pages=tables[i], reals=reals, ints=ints
        )
        for i in range(batch)
    ]
    spec_rows, served_rows, sampled_rows = (
        [
            SpecInput(
                token=feed[i],
                position=context,
                slot=i,
                pages=tables[i],
                num_drafts=k,
                reals=fields[0],
                ints=fields[1],
            )
            for i in range(batch)
        ]
        for fields in (GREEDY_FIELDS, served, SAMPLED_FIELDS)
    )
    verify_ids = ids(batch, k + 1).to(device)
    verify_batch = spec._batch(spec_rows, verify_ids, k + 1, verify=True)
    # as the round's graph runs it: lengths from the device, no host-synced MoE or attention
    verify_batch.static_shapes = True

    def verify() -> None:
        model.compute_logits(model.forward_hidden(verify_batch, cache))

    hidden = torch.zeros((batch, model.config.hidden_size), dtype=model.dtype, device=device)
    step_batch = ForwardBatch.decode(
        feed,
        num_computed=[context] * batch,
        page_tables=tables,
        state_slots=list(range(batch)),
        device=device,
    )

    def draft_step() -> None:
        spec._propose(head.forward_hidden(step_batch, cache, hidden))

    def fresh_drafts() -> None:
        """Distinct random drafts before each timed round (a random head proposes one id
        over and over, which would shrink the verify's expert reads)."""
        spec.drafts[:batch] = ids(batch, k).to(device)

    verify_fn, verify_graphed = _graphed(verify, cuda)
    draft_fn, draft_graphed = _graphed(draft_step, cuda)
    round_ms = _median_ms(lambda: spec.run(spec_rows), steps, cuda, before=fresh_drafts)
    pieces: dict[str, Any] = {  # AB_PIECES
        "plain_decode_ms": _median_ms(lambda: decode.run(plain_rows), steps, cuda),
        "verify_ms": _median_ms(verify_fn, steps, cuda),
        "draft_step_ms": _median_ms(draft_fn, steps, cuda),
        "round_ms": round_ms,
    }
    if pieces_only:
        return pieces
    costs: dict[str, Any] = {
        **pieces,
        # the same rows when greedy is served with the preset's penalties, else round_ms
        "round_served_ms": round_ms
        if served == GREEDY_FIELDS
        else _median_ms(lambda: spec.run(served_rows), steps, cuda, before=fresh_drafts),
        "round_sampled_ms": _median_ms(
            lambda: spec.run(sampled_rows), steps, cuda, before=fresh_drafts
        ),
        # pieces timed eagerly because their capture failed: their times include launches
        "eager_pieces": [
            name
            for name, graphed in (("verify", verify_graphed), ("draft_step", draft_graphed))
            if cuda and not graphed
        ],
    }
    if profile:
        # the padded body the graph holds, run eagerly (a replay hides its kernels from the
        # profiler); the same cache, rows and shortlist
        spec.use_graphs, spec.static = False, True
        with torch.no_grad():
            events = profile_steps(lambda: (fresh_drafts(), spec.run(spec_rows)), 2, device.type)
        costs["round_profile"] = summarize(
            events, 2, batch=batch, context=context, top=16, kind="round"
        )
    return costs


def _graphed(fn: Callable[[], Any], cuda: bool) -> tuple[Callable[[], Any], bool]:
    """`fn` captured in a CUDA graph (timed as a replay, as the engine would run it), and
    True; `fn` itself and False on the CPU or when it cannot be captured."""
    if not cuda:
        return fn, False
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()  # warm-up: kernel compilation, one-time probes
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                fn()
        except RuntimeError:
            return fn, False
    return graph.replay, True


def _median_ms(
    fn: Callable[[], Any], steps: int, cuda: bool, *, before: Callable[[], None] = lambda: None
) -> float:
    """Median wall milliseconds of `fn` from an idle device to an idle device; `before` runs
    ahead of each call, untimed."""
    with torch.no_grad():
        before()
        fn()  # warm-up (graph capture, kernel compilation)
        times = []
        for _ in range(steps):
            before()
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if cuda:
                torch.cuda.synchronize()
            times.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(times)
