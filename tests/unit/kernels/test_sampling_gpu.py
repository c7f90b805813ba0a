"""The sampling kernel against its torch twin on the GPU (GPU only).

Token ids must agree on at least 99.9% of rows and every disagreement must be a float64 near-tie
(two race values, a prefix mass against top_p * total, or a log-ratio against log(min_p) within
1e-9 relative); greedy rows must agree always. Inputs are fresh each run: bf16-rounded (and
coarsely quantised) logits for heavy ties, every parameter mix, penalties read through a per-slot
count buffer, many seeds and steps. A 20k-draw check compares the kernel's empirical distribution
with the twin's probabilities, and a graph capture checks the launches are capturable.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from ninfer.engine.sampling import Sampler, SamplingParams, count_output_ids
from ninfer.kernels import dispatch
from ninfer.kernels.sampling import launch, reference
from ninfer.kernels.sampling.reference import RowParams, top_candidates
from ninfer.kernels.sampling.rng import RngPurpose, counter_uniforms, philox4x32_10

pytestmark = pytest.mark.gpu
NEAR_TIE = 1e-9
MIN_AGREEMENT = 0.999


@pytest.fixture
def seed() -> int:
    return torch.seed() % 2**31  # fresh inputs each run


def _random_rows(rng: random.Random, num_rows: int) -> tuple[list, list]:
    reals, ints = [], []
    for _ in range(num_rows):
        reals.append(
            (
                rng.choice([0.7, 1.0, rng.uniform(0.05, 2.0)]),
                rng.choice([1.0, 0.95, 0.8, rng.uniform(0.1, 1.0)]),
                rng.choice([0.0, 0.0, 0.05, rng.uniform(0.0, 0.3)]),
                rng.choice([0.0, 1.5, rng.uniform(-2.0, 2.0)]),
                rng.choice([0.0, 0.0, rng.uniform(-2.0, 2.0)]),
            )
        )
        ints.append(
            (
                rng.choice([1, 5, 20, rng.randint(1, 20)]),
                int(rng.random() < 0.15),
                rng.randint(-(2**63), 2**63 - 1),
                rng.choice([0, 1, rng.randint(0, 2**40)]),
            )
        )
    return reals, ints


def _logits(num_rows: int, num_columns: int, style: str, gen: torch.Generator) -> torch.Tensor:
    x = 3.0 * torch.randn(num_rows, num_columns, device="cuda", generator=gen)
    if style == "bf16":
        x = x.to(torch.bfloat16).float()
    elif style == "coarse":  # very heavy ties: steps of 0.5
        x = torch.round(2.0 * x) / 2.0
    return x


def _twin_candidates(
    logits_row, counts_row, num_sampleable, temperature, presence, frequency, top_k
):
    """The twin's math for one row, restated in float64 on the CPU: its top-20 candidate ids, their
    log-ratios to the best (-inf past top_k), weights e^ratio and the mass before each."""
    z = logits_row[None, :num_sampleable].cpu().float()
    if counts_row is not None:
        c = counts_row[None, :num_sampleable].cpu().float()
        z = z - torch.tensor(presence, dtype=torch.float32) * (c > 0)
        z = z - torch.tensor(frequency, dtype=torch.float32) * c
    ids, cand_z = top_candidates(z, min(20, num_sampleable))
    scaled = cand_z / torch.tensor(temperature, dtype=torch.float32)
    ratio = scaled.double() - scaled[:, :1].double()
    ratio[:, top_k:] = -math.inf
    weights = torch.exp(ratio)
    return ids, ratio, weights, torch.cumsum(weights, -1) - weights


def _explained(logits_row, counts_row, reals, ints, num_sampleable, a: int, b: int) -> bool:
    """True when tokens a and b differ only through a float64 near-tie of the twin's own math."""
    temperature, top_p, min_p, presence, frequency = reals
    top_k = ints[0]
    ids, ratio, weights, before = _twin_candidates(
        logits_row, counts_row, num_sampleable, temperature, presence, frequency, top_k
    )
    total = float(weights.sum())
    near = (before[0, :top_k] - top_p * total).abs().min().item() <= NEAR_TIE * total
    if min_p > 0:
        near |= (ratio[0, :top_k] - math.log(min_p)).abs().min().item() <= NEAR_TIE
    seeds, steps = torch.tensor([ints[2]]), torch.tensor([ints[3]])
    race = ratio - torch.log(-torch.log(counter_uniforms(seeds, steps, ids, RngPurpose.SAMPLE)))
    listed = ids[0].tolist()
    if a in listed and b in listed:
        ra, rb = race[0, listed.index(a)].item(), race[0, listed.index(b)].item()
        near |= abs(ra - rb) <= NEAR_TIE * (1.0 + abs(ra))
    return near


CASES = [
    # (rows, columns, sampleable, logits style, dtype, trials)
    (1, 248_320, 248_077, "bf16", torch.float32, 600),
    (1, 248_320, 248_320, "coarse", torch.float32, 400),
    (8, 248_320, 248_077, "bf16", torch.float32, 80),
    (64, 248_320, 248_077, "bf16", torch.float32, 16),
    (64, 248_320, 248_320, "coarse", torch.bfloat16, 16),
    (37, 151_936, 151_643, "plain", torch.float32, 30),
    (5, 4_100, 4_097, "coarse", torch.float32, 100),
    (16, 33, 33, "bf16", torch.float32, 80),
    (13, 20, 20, "coarse", torch.float32, 80),
    (3, 7, 5, "plain", torch.bfloat16, 200),
]


@pytest.mark.parametrize(
    ("num_rows", "num_columns", "num_sampleable", "style", "dtype", "trials"), CASES
)
def test_kernel_draws_the_twins_tokens(
    num_rows, num_columns, num_sampleable, style, dtype, trials, seed
) -> None:
    rng = random.Random(seed)
    gen = torch.Generator("cuda").manual_seed(seed)
    num_slots = num_rows + 3
    total = agree = 0
    unexplained = []
    for trial in range(trials):
        logits = _logits(num_rows, num_columns, style, gen).to(dtype)
        if trial % 7 == 3:
            logits[:, : num_sampleable // 3] = -math.inf  # masked ids; the rest stay finite
        buffer = torch.randint(0, 3, (num_slots, num_columns), device="cuda", generator=gen)
        buffer = (buffer * (torch.rand(buffer.shape, device="cuda", generator=gen) < 0.05)).int()
        slots = torch.randperm(num_slots, device="cuda", generator=gen)[:num_rows]
        reals, ints = _random_rows(rng, num_rows)
        rows = RowParams.pack(reals, ints, "cuda")
        use_counts = trial % 4 != 0
        kwargs = {"counts": buffer, "count_rows": slots} if use_counts else {}
        before = (logits.clone(), buffer.clone())
        got = launch.sample_tokens(logits, rows, num_sampleable=num_sampleable, **kwargs)
        want = reference.sample_tokens(logits, rows, num_sampleable=num_sampleable, **kwargs)
        assert torch.equal(logits, before[0]) and torch.equal(buffer, before[1])
        assert got.dtype == torch.int64 and got.shape == (num_rows,)
        assert int(got.max()) < num_sampleable and int(got.min()) >= 0
        got_l, want_l = got.tolist(), want.tolist()
        for i in range(num_rows):
            total += 1
            if got_l[i] == want_l[i]:
                agree += 1
                continue
            assert not ints[i][1], f"greedy row differs: {got_l[i]} vs {want_l[i]}"
            counts_row = buffer[int(slots[i])] if use_counts else None
            if not _explained(
                logits[i].float(),
                counts_row,
                reals[i],
                ints[i],
                num_sampleable,
                got_l[i],
                want_l[i],
            ):
                unexplained.append((trial, i, reals[i], ints[i], got_l[i], want_l[i]))
    assert not unexplained, unexplained[:5]
    assert agree / total >= MIN_AGREEMENT, f"{agree}/{total}"


def test_philox_kernel_matches_known_answers_and_rng() -> None:
    known = [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        (
            (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
            (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
        ),
    ]
    counters = torch.tensor([k[0] for k in known], device="cuda")
    keys = torch.tensor([k[1] for k in known], device="cuda")
    assert launch.philox4x32_10(counters, keys).tolist() == [list(k[2]) for k in known]
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    counters = torch.randint(0, 2**32, (4096, 4), generator=gen, dtype=torch.int64)
    keys = torch.randint(0, 2**32, (4096, 2), generator=gen, dtype=torch.int64)
    got = launch.philox4x32_10(counters.cuda(), keys.cuda()).cpu()
    assert torch.equal(got, philox4x32_10(counters, keys))


@pytest.mark.parametrize(
    ("num_columns", "num_sampleable", "params", "with_counts"),
    [
        (248_320, 248_077, (0.7, 0.8, 0.0, 1.5, 0.0, 20), True),
        (248_320, 248_320, (1.0, 0.95, 0.0, 0.0, 0.0, 20), False),
        (50, 50, (1.3, 1.0, 0.02, 0.4, 0.3, 12), True),
        (50, 45, (0.9, 0.6, 0.0, 0.0, 0.0, 5), False),
    ],
)
def test_empirical_distribution_matches_twin_probabilities(
    num_columns, num_sampleable, params, with_counts, seed
) -> None:
    num_draws = 20_000
    gen = torch.Generator("cuda").manual_seed(seed)
    scale = 4.0 if num_columns > 1000 else 1.0  # a few dozen tokens carry the mass
    row = (scale * torch.randn(1, num_columns, device="cuda", generator=gen)).bfloat16().float()
    counts = None
    if with_counts:
        counts = torch.randint(0, 3, (1, num_columns), device="cuda", generator=gen).int()
    temperature, top_p, min_p, presence, frequency, top_k = params
    reals = [(temperature, top_p, min_p, presence, frequency)] * num_draws
    ints = [(top_k, 0, seed * 7 + 1, step) for step in range(num_draws)]
    rows = RowParams.pack(reals, ints, "cuda")
    many = row.expand(num_draws, -1)  # stride 0: one row read num_draws times
    many_counts = counts.expand(num_draws, -1) if counts is not None else None
    tokens = launch.sample_tokens(many, rows, num_sampleable=num_sampleable, counts=many_counts)
    observed = torch.bincount(tokens.cpu(), minlength=num_columns).double() / num_draws

    # the twin's probabilities for this row: survivors' weights, renormalised (float64)
    ids, ratio, weights, before = _twin_candidates(
        row[0],
        None if counts is None else counts[0],
        num_sampleable,
        temperature,
        presence,
        frequency,
        top_k,
    )
    keep = (before < top_p * weights.sum()) | (top_p >= 1.0)
    if min_p > 0:
        keep &= ratio >= math.log(min_p)
    keep[:, 0] = True
    probs = torch.zeros(num_columns, dtype=torch.float64)
    probs[ids[0]] = torch.where(keep[0], weights[0], torch.zeros_like(weights[0]))
    probs /= probs.sum()

    assert observed[probs == 0].sum() == 0, "a token outside the twin's support was drawn"
    sigma = (probs * (1 - probs) / num_draws).sqrt()
    assert bool(((observed - probs).abs() <= 5 * sigma + 1e-3).all())
    assert 0.5 * float((observed - probs).abs().sum()) < 0.03  # total variation


def test_launches_replay_inside_a_cuda_graph(seed) -> None:
    gen = torch.Generator("cuda").manual_seed(seed)
    num_rows, num_columns = 8, 248_320
    logits = _logits(num_rows, num_columns, "bf16", gen)
    counts = torch.randint(0, 2, (num_rows + 2, num_columns), device="cuda", generator=gen).int()
    slots = torch.arange(2, num_rows + 2, device="cuda")
    reals, ints = _random_rows(random.Random(seed), num_rows)
    rows = RowParams.pack(reals, ints, "cuda")
    kwargs = {"num_sampleable": num_columns, "counts": counts, "count_rows": slots}
    launch.sample_tokens(logits, rows, **kwargs)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = launch.sample_tokens(logits, rows, **kwargs)
    for step in range(3):
        logits.copy_(_logits(num_rows, num_columns, "bf16", gen))
        rows.ints[:, 3] = step + 100
        graph.replay()
        assert torch.equal(captured, launch.sample_tokens(logits, rows, **kwargs))


def test_sampler_with_slot_counts_on_cuda_matches_cpu(seed) -> None:
    gen = torch.Generator().manual_seed(seed)
    num_rows, num_columns = 6, 248_320
    logits = (3 * torch.randn(num_rows, num_columns, generator=gen)).bfloat16().float()
    outputs = [torch.randint(0, 300, (n,), generator=gen).tolist() for n in (0, 5, 40, 1, 9, 77)]

    # per-slot counts read in place through a row -> slot map, as the decode step does
    slot_of_row = (4, 0, 7, 2, 5, 1)
    expected = count_output_ids(outputs, num_columns)
    counts = torch.zeros((8, num_columns), dtype=torch.int32, device="cuda")
    counts[list(slot_of_row)] = expected.cuda()
    slots = torch.tensor(slot_of_row, dtype=torch.int64, device="cuda")
    params = [
        SamplingParams(
            temperature=0.7,
            top_p=0.8,
            presence_penalty=1.5,
            frequency_penalty=0.3 * i,
            seed=seed + i,
        )
        for i in range(num_rows)
    ]
    steps = [len(o) for o in outputs]
    sampler = Sampler(num_sampleable=248_077)
    on_cuda = sampler.sample(logits.cuda(), params, steps, counts, slots)
    on_cpu = sampler.sample(logits, params, steps, expected)
    assert torch.equal(on_cuda.cpu(), on_cpu)


@pytest.mark.parametrize("kernel", ["philox", "sampling_uniforms"])
def test_dispatch_counter_uniforms_equal_the_torch_philox(gen, kernel, monkeypatch) -> None:
    """The speculative acceptance's uniforms on CUDA (one launch for everything, or with
    `sampling_uniforms` off, one Philox launch around the torch counters) are bit for bit the
    torch twin's, for every purpose, negative and large seeds, steps past 2**32, seeds and
    steps read as columns of the row ints (strided), inside a CUDA graph too."""
    if kernel == "philox":
        monkeypatch.setenv("NINFER_KERNELS_OFF", "sampling_uniforms")
    ints = torch.randint(0, 2**40, (7, 4), device="cuda", generator=gen)
    ints[:, 2] = torch.randint(-(2**62), 2**62, (7,), device="cuda", generator=gen)
    seeds, steps = ints[:, 2], ints[:, 3]
    lanes = torch.randint(0, 248_320, (7, 21), device="cuda", generator=gen)
    for purpose in RngPurpose:
        got = dispatch.counter_uniforms(seeds, steps, lanes, purpose)
        want = counter_uniforms(seeds.clone(), steps.clone(), lanes, purpose)
        assert got.dtype == torch.float64 and torch.equal(got, want), purpose
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = dispatch.counter_uniforms(seeds, steps, lanes, RngPurpose.SPEC_ACCEPT)
    ints[:, 3] += 2**33  # new steps in the same buffer: the replay reads them
    graph.replay()
    want = counter_uniforms(seeds.clone(), steps.clone(), lanes, RngPurpose.SPEC_ACCEPT)
    assert torch.equal(captured, want)


@pytest.mark.parametrize(
    ("num_rows", "num_columns", "num_candidates", "style", "dtype"),
    [
        (4, 248_077, 20, "bf16", torch.float32),  # a verify row of 1 + 3 columns, whole vocab
        (256, 248_077, 20, "coarse", torch.float32),  # 64 rows x 4 columns, heavy ties
        (12, 151_643, 20, "plain", torch.bfloat16),
        (7, 4_100, 20, "coarse", torch.float32),
        (5, 33, 20, "bf16", torch.float32),
        (3, 20, 20, "coarse", torch.float32),
        (6, 9, 9, "plain", torch.float32),  # fewer sampleable ids than the cap
    ],
)
def test_kernel_candidates_equal_the_twins(
    seed: int, num_rows: int, num_columns: int, num_candidates: int, style: str, dtype
) -> None:
    """`launch.top_candidates` (the speculative acceptance's candidates on CUDA) returns the
    twin's ids and logits exactly, ties to the lower id, -inf entries included, inside a
    CUDA graph too."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    z = _logits(num_rows, num_columns, style, gen).to(dtype)
    z[0, : num_columns // 2] = -math.inf  # a row whose first half is masked
    if num_rows > 1:
        z[1] = z[1, 0]  # a row of one value: the lowest ids win
    want_ids, want_z = top_candidates(z.float().cpu(), num_candidates)
    got_ids, got_z = launch.top_candidates(z, num_candidates)
    assert got_ids.dtype == torch.int64 and got_z.dtype == torch.float32
    assert torch.equal(got_ids.cpu(), want_ids) and torch.equal(got_z.cpu(), want_z)
    assert torch.equal(dispatch.top_candidates(z, num_candidates)[0], got_ids)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured_ids, captured_z = launch.top_candidates(z, num_candidates)
    z.copy_(z.flip(1))  # new inputs, same buffer: the replay reads them
    graph.replay()
    want_ids, want_z = top_candidates(z.float().cpu(), num_candidates)
    assert torch.equal(captured_ids.cpu(), want_ids) and torch.equal(captured_z.cpu(), want_z)
