"""Exact prefix reuse in the scheduler, over a runner that simulates device memory (support/
sim_runner.py: a slot holds the exact token history fed into it, a page the tokens at its
positions, and every row checks both before it runs). A hit must start from the longest stored
checkpoint whose tokens are exactly a prefix, share its full pages, copy a partial tail page,
restore the state image, prefill only the suffix and sample exactly what a cold run samples;
misses say why; retained prefixes give way (LRU) to running requests."""

from __future__ import annotations

import random
import time

import pytest

from ninfer.engine.plan import PAGES, STATE
from ninfer.engine.request import EngineEvent, EventKind, FinishReason
from ninfer.tokenizer import Tokenizer
from support.sim_runner import EOS, PAGE, SimEngine, admitted, out, prompt, req


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.qwen3_5()


@pytest.fixture
def engines(tokenizer):
    made: list[SimEngine] = []

    def make(**kw) -> SimEngine:
        made.append(SimEngine(tokenizer, **kw))
        return made[-1]

    yield make
    for e in made:
        e.close()


@pytest.mark.parametrize("cut", [8, 7, 9, 19, 20])  # page-aligned, one before/after a boundary
def test_a_hit_starts_at_the_longest_checkpoint_and_equals_the_cold_run(engines, cut) -> None:
    warm = engines()
    first = warm.run(req(prompt(30), checkpoints=(cut, 3)))
    assert admitted(first).prefix_cache == "miss=no_candidate"
    second_prompt = prompt(30)[: cut + 5] + [7, 7, 7]
    plans_before = len(warm.runner.plans)
    second = warm.run(req(second_prompt, checkpoints=(cut,)))
    a = admitted(second)
    assert a.num_cached == cut and a.prefix_cache == f"hit={cut}; path=checkpoint"
    fin = second[-1]
    assert fin.usage.cached_tokens == cut and fin.num_cached == cut
    assert fin.timings.cache_n == cut and fin.timings.prompt_n == len(second_prompt) - cut
    plans = warm.runner.plans[plans_before:]
    rows = [r for p in plans for r in p.rows]
    assert rows[0].start == cut and rows[0].first  # only the suffix is prefilled
    copies = [c for p in plans for c in p.copies]
    restores = [
        c for c in copies if c.kind == STATE and not c.dst_host and c.dst == (rows[0].slot,)
    ]
    assert len(restores) == 1
    tail = [c for c in copies if c.kind == PAGES]
    assert len(tail) == (1 if cut % PAGE else 0)  # copy-on-write of a partial tail page only
    cold = engines(cache=False)
    assert out(second) == out(cold.run(req(second_prompt)))
    assert admitted(cold.run(req(second_prompt))).prefix_cache == "miss=disabled"


def test_chunks_end_at_checkpoints_and_capture_there(engines) -> None:
    e = engines(chunk=8)
    e.run(req(prompt(30), checkpoints=(5, 13, 16, 29, 30, 40)))
    rows = [r for p in e.runner.plans for r in p.prefill]
    ends = [r.start + r.num_new_tokens for r in rows]
    assert ends == [5, 13, 16, 24, 29, 30]
    captured = {r.start + r.num_new_tokens for r in rows if r.after}
    assert captured == {5, 13, 16, 29}  # 30 is the whole prompt, 40 beyond it: not candidates
    assert all(r.checkpoint_at == (r.num_new_tokens,) for r in rows if r.after)
    stored = sorted(ck.length for ck in e.cache.checkpoints)
    assert stored == [5, 13, 16, 29, 35]  # and the end of the conversation: 30 + 6 - 1


def test_the_end_of_a_conversation_serves_its_continuation(engines) -> None:
    e = engines()
    first = e.run(req(prompt(12), max_tokens=5))
    history = prompt(12) + out(first)  # the 5th token was sampled, never fed
    second = e.run(req(history + [3, 4, 5], max_tokens=4))
    assert admitted(second).num_cached == 12 + 4
    cold = engines(cache=False)
    assert out(second) == out(cold.run(req(history + [3, 4, 5], max_tokens=4)))
    # a stop token fed by the row in flight when the stop landed is part of the checkpoint
    third = e.run(req(prompt(20, 500), max_tokens=9, eos_at=3))
    assert out(third)[-1] == EOS and third[-1].finish_reason == FinishReason.STOP
    lengths = {ck.length for ck in e.cache.checkpoints}
    assert 20 + 3 in lengths or 20 + 4 in lengths


def test_misses_say_why(engines) -> None:
    e = engines(pages=16, extra_slots=1, host_images=0)
    e.run(req(prompt(20), max_tokens=1, checkpoints=(12,)))
    diverged = prompt(20)[:9] + [1, 2, 3, 4, 5]
    assert admitted(e.run(req(diverged, max_tokens=1))).prefix_cache == "hit=0; miss=diverged@9"
    assert admitted(e.run(req([1, 2, 3], max_tokens=1))).prefix_cache == "miss=no_candidate"
    # one device image and no host: each new checkpoint evicts the one before (12 went first)
    e.run(req(prompt(20, 900), max_tokens=1, checkpoints=(6,)))
    again = e.run(req(prompt(20)[:15], max_tokens=1))
    assert admitted(again).prefix_cache == "miss=evicted"
    assert e.cache.num_evicted >= 1


def test_a_hit_that_cannot_fit_starts_cold_instead_of_waiting_forever(engines) -> None:
    # 4 pages of 4 tokens. A checkpoint at 6 keeps a full page and a partial one; a request
    # starting from it writes into a copy of the partial page, so a 14-token prompt (all four
    # pages of its own) would need five. With nothing running to free one it used to wait
    # until its deadline; it must start cold and match the cold run.
    e = engines(pages=4, max_context=16, lanes=1)
    stem = prompt(10)
    e.run(req(stem, max_tokens=2, checkpoints=(6,)))
    fits = stem[:6] + [1, 2, 3, 4, 5, 6]  # 12 tokens: 1 shared + 1 copy + 2 pages, and the hit
    assert admitted(e.run(req(fits, max_tokens=1, checkpoints=(6,)))).prefix_cache == (
        "hit=6; path=checkpoint"
    )
    tight = stem[:6] + [7] * 8  # 14 tokens
    events = e.run(req(tight, max_tokens=2))
    assert admitted(events).prefix_cache == "miss=capacity" and admitted(events).num_cached == 0
    assert events[-1].usage.cached_tokens == 0
    assert out(events) == out(engines(cache=False, pages=4, max_context=16).run(req(tight, 2)))


def test_a_paused_request_whose_own_checkpoint_cannot_fit_replays_cold(engines) -> None:
    # 4 pages of 4 tokens, no host room (a pause replays). B's 12-token prompt fills three pages
    # beside the older A's one; A's growth pauses B, which had published its checkpoint at 6 (a
    # partial page). Resuming needs all four pages for B's 12 tokens and its next one; from the
    # checkpoint it would need five (the checkpoint keeps its partial page). With A done and
    # nothing running, B must replay from the start rather than never resume.
    e = engines(pages=4, lanes=2, host_images=0, chunk=8, max_context=16)
    a_events: list[EngineEvent] = []
    b_events: list[EngineEvent] = []
    e.core.submit(req(prompt(3, 500), max_tokens=6), a_events.append)
    e.core.submit(req(prompt(12), max_tokens=3, checkpoints=(6,)), b_events.append)
    e.wait_idle()
    fin = b_events[-1]
    assert fin.num_preemptions == 1 and fin.num_replay_restores == 1
    assert fin.finish_reason == FinishReason.LENGTH and a_events[-1].is_terminal
    cold = engines(cache=False, pages=4, max_context=16)
    assert out(b_events) == out(cold.run(req(prompt(12), max_tokens=3)))


def test_retained_prefixes_give_way_to_running_requests_lru(engines) -> None:
    e = engines(pages=12, lanes=1)  # 48 tokens of KV
    e.run(req(prompt(16, 100), max_tokens=1, checkpoints=(8,)))
    e.run(req(prompt(16, 200), max_tokens=1, checkpoints=(8,)))
    assert len(e.cache) == 4 and e.pages.num_free < 12 - 4
    # needs 10 pages: both of the older prompt's checkpoints go first (LRU), then the newer
    big = e.run(req(prompt(40, 300), max_tokens=1))
    assert big[-1].finish_reason == FinishReason.LENGTH
    lengths = {ck.tokens[0] for ck in e.cache.checkpoints}
    assert 100 not in lengths
    hit = e.run(req(prompt(16, 300)[:12] + [1], max_tokens=1))
    assert admitted(hit).prefix_cache == "hit=0; miss=diverged@12"  # 300's checkpoint: 40
    # reclaiming more than evicting everything could give evicts nothing
    before = len(e.cache)
    assert not e.cache.reclaim(e.pages.num_free + e.cache.reclaimable_pages() + 1, [])
    assert len(e.cache) == before
    assert e.cache.reclaim(e.pages.num_free + e.cache.reclaimable_pages(), [])
    assert len(e.cache) == 0 and e.pages.num_free == 12


def test_soak_shared_prefixes_cancellations_and_tiny_pools(engines) -> None:
    """300 requests over a few shared stems, 20 % cancelled at random moments, every output
    equal to its cold run, integrity after every step, nothing leaked at the end."""
    rng = random.Random(77)
    stems = [[rng.randrange(100, 9000) for _ in range(40)] for _ in range(4)]
    e = engines(lanes=3, pages=40, extra_slots=2, host_images=3, chunk=8, max_context=96, budget=14)
    requests = []
    for i in range(300):
        stem = stems[rng.randrange(4)]
        cut = rng.randint(1, 40)
        body = stem[:cut] + [rng.randrange(100, 9000) for _ in range(rng.randint(1, 12))]
        marks = sorted(rng.sample(range(1, len(body) + 3), k=rng.randint(0, 3)))
        requests.append(
            req(body, max_tokens=rng.randint(1, 12), checkpoints=marks, request_id=f"r{i}",
                eos_at=rng.choice([None, 2, 5]))
        )  # fmt: skip
    events: dict[str, list[EngineEvent]] = {}
    submitted: list[str] = []
    for r in requests:
        events[r.request_id] = []
        e.core.submit(r, events[r.request_id].append)
        submitted.append(r.request_id)
        if rng.random() < 0.2:
            e.core.cancel(rng.choice(submitted))
        if rng.random() < 0.3:
            time.sleep(0.002)
    e.wait_idle()
    hits = sum(admitted(events[r]).num_cached > 0 for r in submitted if _was_admitted(events[r]))
    assert hits > 50
    cold = engines(cache=False, lanes=1, pages=40, max_context=96)
    for r in requests:
        ev = events[r.request_id]
        assert sum(x.is_terminal for x in ev) == 1 and ev[-1].kind == EventKind.FINISHED
        if ev[-1].finish_reason == FinishReason.CANCELLED:
            continue
        want = out(cold.run(r))
        assert out(ev) == want, r.request_id
    e.core.close()
    e.sched.check_integrity()
    if e.cache is not None:
        free_host: list[int] = []
        e.cache.clear(free_host)
    assert e.pages.num_free == 40 and e.sched.slots.num_free == 3
    assert e.images.num_free == 2 and e.images.host.used == 0


def _was_admitted(events: list[EngineEvent]) -> bool:
    return any(x.kind == EventKind.ADMITTED for x in events)
