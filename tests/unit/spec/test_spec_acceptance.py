"""The acceptance rule on fixed toy distributions: committed tokens follow the target p.

Statistical tests with fixed seeds: N draws, each keyed by its own output index, and Pearson's
chi-square of the committed-token histogram against N p. With 7 degrees of freedom the 0.999
quantile is 24.3; the tests require chi2 < 30 (a correct rule fails with probability < 2e-4 for
a fresh seed, and the seeds are fixed). Each test also checks that the same harness rejects a
wrong rule (always accepting the draft), so it can fail.
"""

from __future__ import annotations

import pytest
import torch

from ninfer.engine.acceptance import accept_draft, verify, verify_greedy
from ninfer.kernels.sampling.reference import RowParams

N = 20000
CHI2_MAX = 30.0
P = torch.tensor([0.30, 0.20, 0.15, 0.12, 0.10, 0.07, 0.04, 0.02], dtype=torch.float64)
Q = torch.tensor([0.05, 0.40, 0.05, 0.20, 0.05, 0.05, 0.15, 0.05], dtype=torch.float64)


def _chi2(tokens: torch.Tensor, p: torch.Tensor) -> float:
    observed = torch.bincount(tokens, minlength=p.shape[0]).double()
    expected = p * tokens.shape[0]
    return float(((observed - expected) ** 2 / expected).sum())


def test_accept_draft_commits_tokens_distributed_by_p() -> None:
    """Drafts drawn from q, accepted with min(1, p/q), else replaced from norm(max(p - q, 0))."""
    gen = torch.Generator().manual_seed(11)
    lanes = torch.arange(8).repeat(N, 1)
    draft = torch.multinomial(Q, N, replacement=True, generator=gen)
    seeds = torch.full((N,), 1234, dtype=torch.int64)
    steps = torch.arange(N, dtype=torch.int64)
    ok, replacement = accept_draft(P.repeat(N, 1), Q.repeat(N, 1), lanes, draft, seeds, steps)
    committed = torch.where(ok, draft, replacement)
    assert _chi2(committed, P) < CHI2_MAX
    # the acceptance rate is sum(min(p, q)) in expectation
    rate = ok.double().mean().item()
    assert abs(rate - torch.minimum(P, Q).sum().item()) < 0.02
    assert _chi2(draft, P) > 10 * CHI2_MAX  # the harness would catch a rule that always accepts


def test_verify_sampled_column_follows_p_with_a_one_hot_draft() -> None:
    """The engine's path: argmax drafts (q one-hot). Column 0 commits the draft with
    probability p(d) and otherwise draws from p without d: overall exactly p."""
    logits = P.log().float()
    batch = torch.zeros((N, 2, 8), dtype=torch.float32)
    batch[:, 0] = logits
    batch[:, 1] = logits
    drafts = torch.full((N, 1), 1, dtype=torch.int64)  # always propose token 1 (p = 0.2)
    reals = torch.tensor([[1.0, 1.0, 0.0, 0.0, 0.0]], dtype=torch.float64).repeat(N, 1)
    ints = torch.stack(
        (
            torch.full((N,), 8),
            torch.zeros(N, dtype=torch.int64),
            torch.full((N,), 99),
            torch.arange(N) * 2,
        ),
        dim=1,
    )
    committed, accepted = verify(batch, drafts, RowParams(reals, ints), num_sampleable=8)
    first = committed[:, 0]
    assert _chi2(first, P) < CHI2_MAX
    assert abs(accepted.double().mean().item() - 0.2) < 0.02
    # after an accepted draft the bonus token is a plain draw from column 1: p again
    assert _chi2(committed[accepted == 1, 1], P) < CHI2_MAX
    always = torch.ones_like(first)  # a rule that always accepts commits 1 every time
    assert _chi2(always, P) > 10 * CHI2_MAX


def test_verify_greedy_accepts_exactly_the_argmax_lowest_id_on_ties() -> None:
    logits = torch.tensor([[[0.0, 2.0, 2.0, 1.0], [3.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 5.0]]])
    reals = torch.tensor([[1.0, 1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    ints = torch.tensor([[4, 1, 0, 0]])
    # column 0's argmax is 1 (tie with 2 goes to the lower id): d1 = 1 accepted; column 1's is
    # 0, d2 = 2 rejected; the round commits [1, 0]
    committed, accepted = verify(
        logits, torch.tensor([[1, 2]]), RowParams(reals, ints), num_sampleable=4
    )
    assert accepted.tolist() == [1]
    assert committed[0, :2].tolist() == [1, 0]
    committed, accepted = verify(
        logits, torch.tensor([[2, 0]]), RowParams(reals, ints), num_sampleable=4
    )
    assert accepted.tolist() == [0] and committed[0, 0].item() == 1
    committed, accepted = verify(
        logits, torch.tensor([[1, 0]]), RowParams(reals, ints), num_sampleable=4
    )
    assert accepted.tolist() == [2] and committed[0].tolist() == [1, 0, 3]  # bonus from column 2


def test_verify_seeded_is_reproducible_and_row_independent() -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn((4, 3, 16), generator=gen)
    drafts = logits[:, :2].argmax(-1)
    reals = torch.tensor([[0.9, 0.95, 0.0, 0.0, 0.0]], dtype=torch.float64).repeat(4, 1)
    ints = torch.tensor([[20, 0, 7 + i, 3] for i in range(4)])
    a = verify(logits, drafts, RowParams(reals, ints), num_sampleable=16)
    b = verify(logits[2:], drafts[2:], RowParams(reals[2:], ints[2:]), num_sampleable=16)
    assert torch.equal(a[0][2:], b[0]) and torch.equal(a[1][2:], b[1])


def test_verify_greedy_fast_path_equals_the_general_walk() -> None:
    """`verify_greedy` (what rounds of greedy, penalty-free rows run) commits what `verify`
    commits on such rows: random logits with planted ties, drafts that match the argmax for a
    random number of leading columns, logits beyond the sampleable ids that must be ignored."""
    gen = torch.Generator().manual_seed(21)
    rows, k, vocab, sampleable = 64, 4, 50, 40
    logits = torch.randn(rows, k + 1, vocab, generator=gen).round(decimals=1)  # many ties
    logits[:, :, sampleable:] = 100.0  # out of range: never the pick
    target = logits[:, :, :sampleable].argmax(-1)
    keep = torch.randint(0, k + 1, (rows,), generator=gen)  # leading drafts equal to the target
    drafts = torch.randint(0, sampleable, (rows, k), generator=gen)
    for i in range(rows):
        drafts[i, : int(keep[i])] = target[i, : int(keep[i])]
    reals = torch.tensor([[1.0, 1.0, 0.0, 0.0, 0.0]], dtype=torch.float64).repeat(rows, 1)
    ints = torch.tensor([[0, 1, 5, 0]], dtype=torch.int64).repeat(rows, 1)
    want = verify(logits, drafts, RowParams(reals, ints), num_sampleable=sampleable)
    got = verify_greedy(logits, drafts, num_sampleable=sampleable)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])
    assert (got[1] >= keep).all() and got[1].unique().numel() > 2  # every length occurs


def test_verify_without_counts_at_once_equals_the_column_walk() -> None:
    """`verify` without penalty counts takes every column at once; it must commit exactly what
    the column-by-column walk commits: sampled and greedy rows mixed, varied temperature /
    top-k / top-p / min-p and seeds, drafts equal to a candidate, to the argmax or to nothing
    likely, logits with ties."""
    from ninfer.engine.acceptance import _verify_at_once, _verify_walk

    gen = torch.Generator().manual_seed(31)
    rows, k, vocab = 96, 3, 64
    logits = (torch.randn(rows, k + 1, vocab, generator=gen) * 2).round(decimals=1)
    drafts = torch.randint(0, vocab, (rows, k), generator=gen)
    top = logits[:, :k].argmax(-1)
    choose = torch.rand(rows, k, generator=gen) < 0.6
    drafts = torch.where(choose, top, drafts)  # many drafts are the argmax: long acceptances
    reals = torch.stack(
        (
            torch.rand(rows, generator=gen, dtype=torch.float64) * 1.5 + 0.2,  # temperature
            torch.rand(rows, generator=gen, dtype=torch.float64) * 0.5 + 0.5,  # top-p
            torch.rand(rows, generator=gen, dtype=torch.float64) * 0.05,  # min-p
            torch.zeros(rows, dtype=torch.float64),
            torch.zeros(rows, dtype=torch.float64),
        ),
        dim=1,
    )
    ints = torch.stack(
        (
            torch.randint(1, 21, (rows,), generator=gen),  # top-k
            (torch.rand(rows, generator=gen) < 0.3).to(torch.int64),  # greedy
            torch.randint(-(2**40), 2**40, (rows,), generator=gen),  # seed
            torch.randint(0, 1000, (rows,), generator=gen),  # step
        ),
        dim=1,
    )
    params = RowParams(reals, ints)
    got = _verify_at_once(logits, drafts, params, num_sampleable=60)
    want = _verify_walk(logits, drafts, params, num_sampleable=60, counts=None, count_rows=None)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])
    assert got[1].unique().numel() == k + 1  # every acceptance length 0..k occurs


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _penalized_case(gen: torch.Generator, rows: int, k: int, vocab: int, device: str):
    """Random bf16-valued logits with each row's drafts planted high in their columns (so
    long acceptances occur even after the penalties), drafts repeating one another and ids
    already counted, and counts and penalties that vary by row (zero for some)."""
    logits = (torch.randn(rows, k + 1, vocab, generator=gen) * 2).bfloat16()
    drafts = torch.randint(0, vocab, (rows, k), generator=gen)
    repeat = torch.rand(rows, k, generator=gen) < 0.3  # d_j = d_{j-1}: a count raised twice
    for j in range(1, k):
        drafts[:, j] = torch.where(repeat[:, j], drafts[:, j - 1], drafts[:, j])
    lift = torch.rand(rows, k, generator=gen) * 6.0 + 4.0
    for j in range(k):
        col = logits[:, j].float()
        col[torch.arange(rows), drafts[:, j]] += lift[:, j]
        logits[:, j] = col.bfloat16()
    counts = torch.randint(0, 3, (rows + 2, vocab + 5), generator=gen, dtype=torch.int32)
    counts *= (torch.rand(rows + 2, vocab + 5, generator=gen) < 0.2).int()
    count_rows = torch.randperm(rows + 2, generator=gen)[:rows]
    reals = torch.stack(
        (
            torch.rand(rows, generator=gen, dtype=torch.float64) * 1.2 + 0.3,  # temperature
            torch.rand(rows, generator=gen, dtype=torch.float64) * 0.5 + 0.5,  # top-p
            torch.zeros(rows, dtype=torch.float64),
            torch.randint(0, 4, (rows,), generator=gen).double() * 0.5,  # presence 0..1.5
            torch.randint(0, 3, (rows,), generator=gen).double() * 0.25,  # frequency 0..0.5
        ),
        dim=1,
    )
    ints = torch.stack(
        (
            torch.randint(1, 21, (rows,), generator=gen),
            (torch.rand(rows, generator=gen) < 0.5).to(torch.int64),  # greedy
            torch.randint(-(2**40), 2**40, (rows,), generator=gen),
            torch.randint(0, 1000, (rows,), generator=gen),
        ),
        dim=1,
    )
    on = [t.to(device) for t in (logits, drafts, counts, count_rows, reals, ints)]
    logits, drafts, counts, count_rows, reals, ints = on
    return logits, drafts, counts, count_rows, RowParams(reals, ints)


@pytest.mark.parametrize("device", DEVICES)
def test_penalized_columns_equal_per_column_counts_bitwise(device: str) -> None:
    """Column j of `penalized_columns` is, bit for bit, the penalty formula over counts that
    include d1..dj, written out here column by column (bincount of the drafts)."""
    from ninfer.engine.acceptance import penalized_columns

    gen = torch.Generator().manual_seed(41)
    rows, k, vocab, sampleable = 48, 4, 97, 90
    logits, drafts, counts, count_rows, params = _penalized_case(gen, rows, k, vocab, device)
    drafts[0, 1] = sampleable + 3  # never sampleable: clamped (its later columns are not read)
    got = penalized_columns(
        logits, drafts, params, num_sampleable=sampleable, counts=counts, count_rows=count_rows
    )
    presence = params.reals[:, 3].float()[:, None]
    frequency = params.reals[:, 4].float()[:, None]
    base = counts[count_rows, :sampleable]
    for j in range(k + 1):
        c = base.clone()
        for i in range(j):
            d = drafts[:, i]
            ok = d < sampleable
            c[ok.nonzero()[:, 0], d[ok]] += 1
        c = c.float()
        want = logits[:, j, :sampleable].float() - presence * (c > 0) - frequency * c
        # columns after an unsampleable draft are never read (it is never accepted)
        live = (drafts[:, :j] < sampleable).all(dim=1)
        assert torch.equal(got[live, j], want[live]), j
    assert not live[0] and live.sum() > rows // 2


@pytest.mark.parametrize("device", DEVICES)
def test_penalized_verify_at_once_equals_the_column_walk(device: str) -> None:
    """`verify` with penalty counts (every column at once over `penalized_columns`) commits
    exactly what the column-by-column walk commits, greedy and sampled rows mixed; and
    `verify_greedy` with counts does on the greedy rows alone. Every acceptance length occurs."""
    from ninfer.engine.acceptance import _verify_walk

    gen = torch.Generator().manual_seed(43)
    rows, k, vocab = 128, 3, 80
    logits, drafts, counts, count_rows, params = _penalized_case(gen, rows, k, vocab, device)
    kw = {"num_sampleable": vocab - 4, "counts": counts, "count_rows": count_rows}
    got = verify(logits, drafts, params, **kw)
    want = _verify_walk(logits, drafts, params, **kw)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])
    assert got[1].unique().numel() == k + 1
    greedy = params.ints[:, 1] != 0
    sub = RowParams(params.reals[greedy], params.ints[greedy])
    kw_g = {**kw, "count_rows": count_rows[greedy]}
    fast = verify_greedy(logits[greedy], drafts[greedy], rows=sub, **kw_g)
    walk = _verify_walk(logits[greedy], drafts[greedy], sub, **kw_g)
    assert torch.equal(fast[1], walk[1]) and torch.equal(fast[0], walk[0])
    # the penalties decide: without them the same greedy rows commit something else
    plain = verify_greedy(logits[greedy], drafts[greedy], num_sampleable=vocab - 4)
    assert not torch.equal(plain[0], fast[0])


@pytest.mark.parametrize("device", DEVICES)
def test_verify_reads_bf16_logits_as_their_float32_values(device: str) -> None:
    """Without penalties the candidates are picked from the bf16 logits in place (on CUDA by
    the sampler's kernel, no float32 copy of every verify row): the same commits as from the
    same values in float32, sampled and greedy rows mixed."""
    gen = torch.Generator().manual_seed(47)
    rows, k, vocab = 64, 3, 300
    logits, drafts, _, _, params = _penalized_case(gen, rows, k, vocab, device)
    assert logits.dtype == torch.bfloat16
    got = verify(logits, drafts, params, num_sampleable=vocab - 7)
    want = verify(logits.float(), drafts, params, num_sampleable=vocab - 7)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])
    assert got[1].unique().numel() == k + 1
