"""The round-feed kernels against their torch twin, bit for bit (GPU), and what they refuse (CPU).

Fresh random rounds each run: slots distinct (padding rows of a static round share the dummy
slot, whose feeds nobody reads), some rows chained, stop ids that hit before, at and after the
accepted columns, per-row inputs as the static round stages them (strided columns of one int64
block) and as the eager round builds them (contiguous).
"""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels import dispatch
from ninfer.kernels.round_feed import launch as feed_cuda
from ninfer.kernels.round_feed import reference as feed_ref

SLOTS, VOCAB, STOPS = 70, 300, 4


def _round(num: int, width: int, seed: int, device: str, staged: bool) -> dict:
    g = torch.Generator().manual_seed(seed)
    block = torch.randint(0, 1000, (num, 16), generator=g)
    block[:, 0] = torch.randperm(SLOTS - 1, generator=g)[:num]  # distinct slots
    block[:, 1] = torch.randint(0, 5, (num,), generator=g) * (torch.rand(num, generator=g) < 0.5)
    block[:, 8:12] = torch.randint(0, 12, (num, STOPS), generator=g)  # stop ids, some hit
    block[:, 10:12] = -1  # padding
    block = block.to(device)
    cols = {n: block[:, i] for n, i in (("slots", 0), ("chain", 1), ("t0", 2), ("position", 3))}
    cols["step"], cols["stops"] = block[:, 6], block[:, 8 : 8 + STOPS]
    if not staged:
        cols = {n: t.contiguous() for n, t in cols.items()}
    committed = torch.randint(0, 12, (num, width), generator=g)
    accepted = torch.randint(0, width, (num,), generator=g)
    committed[torch.arange(width)[None, :] > accepted[:, None]] = 0  # as acceptance leaves it
    feed_committed = torch.randint(-1, VOCAB, (SLOTS, width), generator=g)
    return {
        **cols,
        "block": block,
        "committed": committed.to(device),
        "accepted": accepted.to(device),
        "feeds": torch.randint(0, 1000, (4, SLOTS), generator=g).to(device),
        "feed_committed": feed_committed.to(device),
        "counts": torch.randint(0, 3, (SLOTS, VOCAB), generator=g, dtype=torch.int32).to(device),
    }


def _take(fn, r: dict):
    return fn(r["t0"], r["position"], r["step"], r["chain"], r["slots"], r["feeds"],
       r["feed_committed"], r["counts"])  # fmt: skip


def _leave(fn, r: dict):
    return fn(r["feeds"], r["feed_committed"], r["slots"], r["position"], r["step"], r["stops"],
       r["accepted"], r["committed"])  # fmt: skip


def _clone(r: dict) -> dict:
    out = {n: t.clone() for n, t in r.items()}
    if not r["t0"].is_contiguous():  # the staged columns: views of the copied block
        b = out["block"]
        out |= {"slots": b[:, 0], "chain": b[:, 1], "t0": b[:, 2], "position": b[:, 3]}
        out |= {"step": b[:, 6], "stops": b[:, 8 : 8 + STOPS]}
    return out


def test_the_launcher_names_what_it_refuses() -> None:
    r = _round(4, 4, 0, "cpu", staged=True)

    def take(**change) -> str | None:
        return _take(feed_cuda.take_problem, {**r, **change})

    def leave(**change) -> str | None:
        return _leave(feed_cuda.leave_problem, {**r, **change})

    assert take() is None and leave() is None
    assert "int64" in take(slots=r["slots"].int())
    assert "1..1024" in take(t0=r["t0"][:0])
    assert "contiguous" in take(feeds=r["feeds"].t().contiguous().t())
    assert "contiguous int32" in take(counts=r["counts"].long())
    assert "contiguous" in leave(committed=r["committed"].t().contiguous().t())
    assert "as wide as" in leave(committed=r["committed"][:, :3].contiguous())


def test_dispatch_runs_the_twin_on_the_cpu() -> None:
    r = _round(5, 4, 1, "cpu", staged=True)
    want = _clone(r)
    _take(dispatch.take_feed, r)
    _leave(dispatch.leave_feed, r)
    _take(feed_ref.take_feed, want)
    _leave(feed_ref.leave_feed, want)
    assert all(torch.equal(r[n], want[n]) for n in r)


@pytest.mark.gpu
@pytest.mark.parametrize("staged", [True, False], ids=["staged", "eager"])
@pytest.mark.parametrize("num,width", [(1, 4), (8, 4), (64, 6), (3, 2)])
def test_the_kernels_equal_the_twin(num: int, width: int, staged: bool) -> None:
    r = _round(num, width, torch.seed() % 2**31, "cuda", staged)
    want = _clone(r)
    _take(feed_cuda.take_feed, r)
    _take(feed_ref.take_feed, want)
    _leave(feed_cuda.leave_feed, r)
    _leave(feed_ref.leave_feed, want)
    for name in ("block", "feeds", "feed_committed", "counts", "t0", "position", "step"):
        assert torch.equal(r[name], want[name]), name


def _commit_round(num: int, width: int, seed: int, device: str, staged: bool, greedy: bool):
    """ids, positions and either a target (some drafts equal it, so every count of kept drafts
    occurs) or a sampled verify's committed and accepted."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 6, (num, width), generator=g)
    block = torch.randint(0, 10_000, (num, 5), generator=g)
    position = block[:, 3] if staged else block[:, 3].contiguous()
    given: dict = {}
    if greedy:
        target = torch.randint(0, 6, (num, width), generator=g)
        same = torch.rand(num, width - 1, generator=g) < 0.7
        target[:, :-1] = torch.where(same, ids[:, 1:], target[:, :-1])
        given["target"] = target
    else:
        accepted = torch.randint(0, width, (num,), generator=g)
        committed = torch.randint(0, 6, (num, width), generator=g)
        committed[torch.arange(width)[None, :] > accepted[:, None]] = 0
        given |= {"committed": committed, "accepted": accepted}
    return ids.to(device), position.to(device), {n: t.to(device) for n, t in given.items()}


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_round_commit_twin_is_the_acceptance_walk(greedy: bool) -> None:
    """The twin against the plain walk it replaces: the leading drafts equal to the target's
    token before them, the head pass's ids, result rows of (a + 1, a, committed, zeros)."""
    ids, position, given = _commit_round(40, 4, 5, "cpu", staged=True, greedy=greedy)
    got = feed_ref.round_commit(ids, position, 2, 7, **given)
    for b in range(40):
        if greedy:
            t = given["target"][b].tolist()
            a = 0
            while a < 3 and t[a] == ids[b, a + 1]:
                a += 1
            committed = [t[j] if j <= a else 0 for j in range(4)]
        else:
            a, committed = int(given["accepted"][b]), given["committed"][b].tolist()
        assert int(got.accepted[b]) == a and got.committed[b].tolist() == committed
        head_ids = ids[b, 1:].tolist() + [int(ids[b, 0])]
        head_ids[a] = committed[a]
        assert got.next_ids[b].tolist() == head_ids
        assert got.result[b].tolist() == [a + 1, a, *committed, 0]
        assert int(got.gather[b]) == b * 4 + a
        assert int(got.draft_position[b]) == int(position[b]) + a


def test_round_commit_launcher_names_what_it_refuses() -> None:
    ids, position, given = _commit_round(4, 4, 0, "cpu", staged=True, greedy=True)
    assert feed_cuda.commit_problem(ids, position, 2, 6, **given) is None
    assert "either" in feed_cuda.commit_problem(ids, position, 2, 6)
    assert "int64" in feed_cuda.commit_problem(ids.int(), position, 2, 6, **given)
    assert "does not hold" in feed_cuda.commit_problem(ids, position, 2, 5, **given)
    assert "contiguous" in feed_cuda.commit_problem(
        ids.t().contiguous().t(), position, 2, 6, **given
    )


@pytest.mark.gpu
@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
@pytest.mark.parametrize("staged", [True, False], ids=["staged", "eager"])
@pytest.mark.parametrize("num,width", [(1, 4), (8, 4), (64, 6), (3, 2)])
def test_round_commit_kernel_equals_the_twin(num, width, staged, greedy) -> None:
    ids, position, given = _commit_round(num, width, torch.seed() % 2**31, "cuda", staged, greedy)
    want = feed_ref.round_commit(ids, position, 2, width + 3, **given)
    got = feed_cuda.round_commit(ids, position, 2, width + 3, **given)
    for name, w in want._asdict().items():
        assert torch.equal(getattr(got, name), w), name
