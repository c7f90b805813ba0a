"""Tests for ninfer.engine.sampling: distributions, greedy, seeds, presets and validation.

Statistical tests draw many tokens from fixed logits with fixed seeds (so they are deterministic,
never flaky) and compare the counts with a distribution computed here independently in float64,
by a chi-square test whose p-value must exceed 1e-3; tokens the reference gives zero mass must
never appear. One power check shows the same test rejects a wrong distribution.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from ninfer.engine.sampling import (
    NON_THINKING,
    SEED_MAX,
    SEED_MIN,
    THINKING,
    RngPurpose,
    Sampler,
    SamplingParamError,
    SamplingParams,
    SamplingPreset,
    UnknownArchitectureError,
    count_output_ids,
    counter_uniforms,
    philox4x32_10,
    presets_for,
    resolve_sampling,
)

NUM_DRAWS = 20_000
MIN_P_VALUE = 1e-3

# ------------------------------------------------------------------------------------------
# Independent references
# ------------------------------------------------------------------------------------------


def _philox_reference(counter: tuple[int, ...], key: tuple[int, ...]) -> tuple[int, ...]:
    """Philox4x32-10 with Python integers, written from the paper's round function."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for round_idx in range(10):
        if round_idx:
            k0 = (k0 + 0x9E3779B9) % 2**32
            k1 = (k1 + 0xBB67AE85) % 2**32
        p0 = 0xD2511F53 * c0
        p1 = 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 % 2**32, (p0 >> 32) ^ c3 ^ k1, p0 % 2**32
    return c0, c1, c2, c3


def _reference_distribution(
    logits: list[float], params: SamplingParams, counts: list[int] | None = None
) -> np.ndarray:
    """The sampler's documented pipeline, token by token in float64."""
    num_tokens = len(logits)
    z = np.array(logits, dtype=np.float64)
    if counts is not None:
        c = np.array(counts, dtype=np.float64)
        z = z - params.presence_penalty * (c > 0) - params.frequency_penalty * c
    z = z / params.temperature
    order = sorted(range(num_tokens), key=lambda i: (-z[i], i))
    top_k = params.top_k if params.top_k else 20
    kept = order[:top_k]
    weights = np.exp(z[kept] - z[kept].max())
    probs = dict(zip(kept, weights / weights.sum(), strict=True))
    survivors: list[int] = []
    mass = 0.0
    for token in kept:
        if survivors and mass >= params.top_p:
            break
        survivors.append(token)
        mass += probs[token]
    largest = max(probs.values())
    survivors = [t for t in survivors if probs[t] >= params.min_p * largest]
    out = np.zeros(num_tokens)
    for token in survivors:
        out[token] = probs[token]
    return out / out.sum()


def _chi_square_p_value(observed: np.ndarray, expected_probs: np.ndarray) -> float:
    """Pearson chi-square p-value; expected bins under 5 draws are pooled into one."""
    support = expected_probs > 0
    assert observed[~support].sum() == 0, "a token outside the expected support was drawn"
    total = observed.sum()
    expected = expected_probs[support] * total
    obs = observed[support].astype(np.float64)
    small = expected < 5
    if small.any():
        expected = np.append(expected[~small], expected[small].sum())
        obs = np.append(obs[~small], obs[small].sum())
    if len(expected) == 1:
        return 1.0
    stat = float(((obs - expected) ** 2 / expected).sum())
    dof = len(expected) - 1
    # chi-square survival function = regularised upper incomplete gamma Q(dof/2, stat/2)
    q = torch.special.gammaincc(
        torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)
    )
    return float(q)


def _draw_counts(
    logits: list[float],
    params: SamplingParams,
    counts: list[int] | None = None,
    *,
    seed: int = 20240611,
    num_draws: int = NUM_DRAWS,
) -> np.ndarray:
    """num_draws tokens from one request: a batch of identical rows at steps 0..num_draws-1."""
    row = torch.tensor(logits, dtype=torch.float32)
    batch_logits = row.expand(num_draws, -1).contiguous()
    batch_counts = None
    if counts is not None:
        batch_counts = torch.tensor(counts, dtype=torch.int32).expand(num_draws, -1).contiguous()
    seeded = replace(params, seed=seed)
    tokens = Sampler().sample(
        batch_logits, [seeded] * num_draws, list(range(num_draws)), batch_counts
    )
    return np.bincount(tokens.numpy(), minlength=len(logits))


BASE_LOGITS = [2.0, 1.6, 1.3, 1.1, 0.9, 0.5, 0.3, 0.0, -0.4, -0.8, -1.2, -2.0]
COUNTS = [3, 0, 1, 0, 2, 0, 0, 5, 0, 0, 1, 0]
# 30 distinct logits in a fixed scrambled order, so the top 20 are not simply the first 20 ids
CAP_LOGITS = [float(v) for v in np.random.default_rng(7).permutation(np.linspace(1.0, -1.9, 30))]

DISTRIBUTION_CASES = {
    "plain": (BASE_LOGITS, SamplingParams(), None),
    "temperature_0.5": (BASE_LOGITS, SamplingParams(temperature=0.5), None),
    "temperature_1.7": (BASE_LOGITS, SamplingParams(temperature=1.7), None),
    "top_k_3": (BASE_LOGITS, SamplingParams(top_k=3), None),
    "top_k_0_is_cap_20": (CAP_LOGITS, SamplingParams(top_k=0), None),
    "top_p_0.5": (BASE_LOGITS, SamplingParams(top_p=0.5), None),
    "top_p_0.9_with_temperature": (BASE_LOGITS, SamplingParams(temperature=0.6, top_p=0.9), None),
    "min_p_0.2": (BASE_LOGITS, SamplingParams(min_p=0.2), None),
    "penalties": (
        BASE_LOGITS,
        SamplingParams(presence_penalty=0.8, frequency_penalty=0.3),
        COUNTS,
    ),
    "negative_penalties": (
        BASE_LOGITS,
        SamplingParams(presence_penalty=-0.5, frequency_penalty=-0.2),
        COUNTS,
    ),
    "combined": (
        BASE_LOGITS,
        SamplingParams(
            temperature=0.8,
            top_k=6,
            top_p=0.9,
            min_p=0.1,
            presence_penalty=0.4,
            frequency_penalty=0.2,
        ),
        COUNTS,
    ),
}


# ------------------------------------------------------------------------------------------
# RNG
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("counter", "key", "expected"),
    [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        (
            (0xFFFFFFFF,) * 4,
            (0xFFFFFFFF,) * 2,
            (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD),
        ),
        (
            (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
            (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
        ),
    ],
    ids=["zeros", "ones", "pi"],
)
def test_philox_matches_random123_known_answers(counter, key, expected) -> None:
    out = philox4x32_10(torch.tensor(counter), torch.tensor(key))
    assert tuple(int(w) for w in out) == expected


def test_philox_matches_python_reference_on_random_words() -> None:
    rng = np.random.default_rng(3)
    counters = rng.integers(0, 2**32, size=(64, 4), dtype=np.uint64).astype(np.int64)
    keys = rng.integers(0, 2**32, size=(64, 2), dtype=np.uint64).astype(np.int64)
    out = philox4x32_10(torch.from_numpy(counters), torch.from_numpy(keys))
    for i in range(64):
        want = _philox_reference(tuple(map(int, counters[i])), tuple(map(int, keys[i])))
        assert tuple(int(w) for w in out[i]) == want


def test_counter_uniforms_are_uniform_on_the_open_interval() -> None:
    seeds = torch.tensor([SEED_MIN, -1, 0, 12345], dtype=torch.int64)
    steps = torch.tensor([0, 7, 2**40, 3], dtype=torch.int64)
    lanes = torch.arange(5000, dtype=torch.int64).expand(4, -1)
    u = counter_uniforms(seeds, steps, lanes, RngPurpose.SAMPLE)
    assert u.dtype == torch.float64
    assert bool((u > 0).all()) and bool((u < 1).all())
    observed = np.bincount((u.flatten().numpy() * 20).astype(np.int64), minlength=20)
    assert _chi_square_p_value(observed, np.full(20, 1 / 20)) > MIN_P_VALUE
    other = counter_uniforms(seeds, steps, lanes, RngPurpose.SPEC_ACCEPT)
    assert not torch.equal(u, other)


# ------------------------------------------------------------------------------------------
# Distributions
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(DISTRIBUTION_CASES))
def test_sampled_distribution_matches_reference(case: str) -> None:
    logits, params, counts = DISTRIBUTION_CASES[case]
    expected = _reference_distribution(logits, params, counts)
    observed = _draw_counts(logits, params, counts)
    assert observed.sum() == NUM_DRAWS
    assert _chi_square_p_value(observed, expected) > MIN_P_VALUE


def test_chi_square_rejects_a_wrong_temperature() -> None:
    # Power check: the counts drawn at T=0.7 must be told apart from the T=1 distribution.
    observed = _draw_counts(BASE_LOGITS, SamplingParams(temperature=0.7))
    wrong = _reference_distribution(BASE_LOGITS, SamplingParams(temperature=1.0))
    assert _chi_square_p_value(observed, wrong) < 1e-9


def test_top_k_cap_excludes_the_lowest_ten_of_thirty() -> None:
    observed = _draw_counts(CAP_LOGITS, SamplingParams(top_k=0, temperature=2.0))
    ranked = sorted(range(30), key=lambda i: -CAP_LOGITS[i])
    assert observed[ranked[20:]].sum() == 0
    assert (observed[ranked[:20]] > 0).all()


def test_top_k_ties_resolve_to_lowest_ids() -> None:
    logits = [0.5, 1.0, 0.2, 1.0, 1.0, 1.0]
    observed = _draw_counts(logits, SamplingParams(top_k=2), num_draws=2000)
    assert observed[[0, 2, 4, 5]].sum() == 0
    assert observed[1] > 0 and observed[3] > 0
    # At the cap of 20: the larger logit at the highest id stays in, ties fill from the lowest id.
    logits = [1.0] * 25 + [1.5]
    observed = _draw_counts(logits, SamplingParams(top_k=0), num_draws=4000)
    assert observed[19:25].sum() == 0
    assert (observed[:19] > 0).all() and observed[25] > 0


def test_top_p_zero_keeps_only_the_best_token() -> None:
    observed = _draw_counts(BASE_LOGITS, SamplingParams(top_p=0.0), num_draws=500)
    assert observed[0] == 500


def test_min_p_one_keeps_only_the_best_token() -> None:
    observed = _draw_counts(BASE_LOGITS, SamplingParams(min_p=1.0), num_draws=500)
    assert observed[0] == 500


# ------------------------------------------------------------------------------------------
# Greedy, vocabulary limit, penalties plumbing
# ------------------------------------------------------------------------------------------


def test_greedy_and_temperature_zero_are_penalised_argmax() -> None:
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(32, 500, generator=gen)
    counts = torch.randint(0, 3, (32, 500), generator=gen) * (
        torch.rand(32, 500, generator=gen) < 0.05
    )
    presence = [0.1 * (i % 7) for i in range(32)]
    frequency = [0.05 * (i % 5) for i in range(32)]
    penalised = (
        logits.double().numpy()
        - np.array(presence)[:, None] * (counts.numpy() > 0)
        - np.array(frequency)[:, None] * counts.numpy()
    )
    expected = penalised.argmax(axis=1)
    for flavour in ({"greedy": True, "temperature": 1.3}, {"temperature": 0.0}):
        params = [
            SamplingParams(presence_penalty=presence[i], frequency_penalty=frequency[i], **flavour)
            for i in range(32)
        ]
        tokens = Sampler().sample(logits, params, [5] * 32, counts)
        assert tokens.tolist() == expected.tolist()


def test_greedy_ties_pick_the_lowest_id() -> None:
    logits = torch.zeros(2, 50)
    logits[:, [41, 17, 33]] = 3.0
    tokens = Sampler().sample(logits, [SamplingParams(greedy=True)] * 2, [0, 1])
    assert tokens.tolist() == [17, 17]


def test_ids_past_num_sampleable_are_never_drawn() -> None:
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(64, 40, generator=gen)
    logits[:, 30:] = 100.0
    params = [SamplingParams(greedy=i % 2 == 0, temperature=2.0, seed=i) for i in range(64)]
    tokens = Sampler(num_sampleable=30).sample(logits, params, list(range(64)))
    assert tokens.dtype == torch.int64 and tokens.shape == (64,)
    assert int(tokens.max()) < 30
    with pytest.raises(ValueError, match="columns"):
        Sampler(num_sampleable=41).sample(logits, params, list(range(64)))


def test_penalties_need_output_counts() -> None:
    with pytest.raises(ValueError, match="output_counts"):
        Sampler().sample(torch.zeros(1, 8), [SamplingParams(presence_penalty=1.0)], [0])
    with pytest.raises(ValueError, match="output_counts"):
        Sampler().sample(
            torch.zeros(1, 8),
            [SamplingParams(frequency_penalty=1.0)],
            [0],
            torch.zeros(1, 4, dtype=torch.int32),
        )


def test_count_output_ids_counts_each_occurrence() -> None:
    counts = count_output_ids([[3, 1, 3, 3], [], [0, 9]], 10)
    expected = np.zeros((3, 10), dtype=np.int32)
    expected[0, 3], expected[0, 1], expected[2, 0], expected[2, 9] = 3, 1, 1, 1
    assert counts.dtype == torch.int32
    assert np.array_equal(counts.numpy(), expected)


def test_sample_rejects_mismatched_lengths_and_bad_steps() -> None:
    with pytest.raises(ValueError, match="logit rows"):
        Sampler().sample(torch.zeros(2, 8), [SamplingParams()], [0, 1])
    with pytest.raises(ValueError, match="steps"):
        Sampler().sample(torch.zeros(1, 8), [SamplingParams()], [-1])


def test_sample_validates_params() -> None:
    with pytest.raises(SamplingParamError) as info:
        Sampler().sample(torch.zeros(1, 8), [SamplingParams(top_k=25)], [0])
    assert info.value.field == "top_k"


# ------------------------------------------------------------------------------------------
# Seeds
# ------------------------------------------------------------------------------------------


def _flat_logits(num_rows: int, num_columns: int = 64, seed: int = 0) -> torch.Tensor:
    return 0.3 * torch.randn(num_rows, num_columns, generator=torch.Generator().manual_seed(seed))


def test_seeded_row_is_the_same_alone_and_inside_any_batch() -> None:
    num_steps = 40
    target_logits = _flat_logits(num_steps, seed=1)
    target = SamplingParams(temperature=1.2, top_p=0.95, seed=-987654321)
    sampler = Sampler()
    alone = [
        int(sampler.sample(target_logits[t : t + 1], [target], [t])[0]) for t in range(num_steps)
    ]
    assert len(set(alone)) > 10  # the stream really is random, so agreement below means something

    for batch_size, position in [(2, 1), (7, 0), (16, 9)]:
        other_params = [
            SamplingParams(temperature=0.5 + 0.1 * i, top_k=i % 21, seed=None if i % 3 else i)
            for i in range(batch_size - 1)
        ]
        params = other_params[:position] + [target] + other_params[position:]
        for t in range(num_steps):
            logits = _flat_logits(batch_size, seed=100 + t)
            logits[position] = target_logits[t]
            steps = [t if i == position else 1000 + i for i in range(batch_size)]
            tokens = sampler.sample(logits, params, steps)
            assert int(tokens[position]) == alone[t]


EDGE_SEEDS = [SEED_MIN, SEED_MIN + 1, -1, 0, 1, 2**32 + 1, SEED_MAX]


def test_signed_seed_edges_give_distinct_reproducible_streams() -> None:
    logits = torch.zeros(64, 20)
    streams = []
    for seed in EDGE_SEEDS:
        params = [SamplingParams(seed=seed)] * 64
        first = Sampler().sample(logits, params, list(range(64))).tolist()
        again = Sampler().sample(logits, params, list(range(64))).tolist()
        assert first == again
        streams.append(tuple(first))
    assert len(set(streams)) == len(EDGE_SEEDS)


def test_unseeded_rows_draw_fresh_entropy() -> None:
    logits = torch.zeros(64, 20)
    params = [SamplingParams(seed=None)] * 64
    first = Sampler().sample(logits, params, [0] * 64)
    second = Sampler().sample(logits, params, [0] * 64)
    assert not torch.equal(first, second)  # equal only with probability 20**-64


# ------------------------------------------------------------------------------------------
# Validation
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.1),
        ("temperature", 2.01),
        ("temperature", math.nan),
        ("temperature", math.inf),
        ("temperature", "1"),
        ("temperature", True),
        ("top_p", -0.01),
        ("top_p", 1.01),
        ("top_k", -1),
        ("top_k", 21),
        ("top_k", 2.0),
        ("top_k", True),
        ("min_p", -0.1),
        ("min_p", 1.5),
        ("presence_penalty", 2.5),
        ("presence_penalty", -2.01),
        ("frequency_penalty", 2.01),
        ("frequency_penalty", math.nan),
        ("seed", SEED_MAX + 1),
        ("seed", SEED_MIN - 1),
        ("seed", 1.0),
        ("greedy", 1),
    ],
)
def test_validate_names_the_bad_field(field: str, value: object) -> None:
    with pytest.raises(SamplingParamError) as info:
        SamplingParams(**{field: value}).validate()
    assert info.value.field == field
    assert field in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", 0.0),
        ("temperature", 2),
        ("top_p", 0.0),
        ("top_p", 1.0),
        ("top_k", 0),
        ("top_k", 20),
        ("min_p", 0.0),
        ("min_p", 1.0),
        ("presence_penalty", -2.0),
        ("frequency_penalty", 2.0),
        ("seed", SEED_MIN),
        ("seed", SEED_MAX),
        ("seed", None),
    ],
)
def test_validate_accepts_range_edges(field: str, value: object) -> None:
    SamplingParams(**{field: value}).validate()


# ------------------------------------------------------------------------------------------
# Presets and precedence
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("architecture", "thinking_presence"),
    [
        ("qwen3_5", 0.0),
        ("Qwen3_5ForConditionalGeneration", 0.0),
        ("Qwen3.8-27B", 0.0),
        ("qwen3_5_moe", 1.5),
        ("Qwen3.6-35B-A3B", 1.5),
    ],
)
def test_presets_follow_the_spec(architecture: str, thinking_presence: float) -> None:
    presets = presets_for(architecture)
    assert set(presets) == {THINKING, NON_THINKING}
    assert presets[THINKING] == SamplingPreset(1.0, 0.95, 20, 0.0, thinking_presence, 0.0)
    assert presets[NON_THINKING] == SamplingPreset(0.7, 0.80, 20, 0.0, 1.5, 0.0)


def test_unknown_architecture_is_rejected() -> None:
    with pytest.raises(UnknownArchitectureError, match="llama"):
        presets_for("llama")


NON_THINKING_27B = SamplingPreset(0.7, 0.80, 20, 0.0, 1.5)


def test_precedence_preset_then_process_then_request() -> None:
    params = resolve_sampling(
        NON_THINKING_27B,
        {"temperature": 0.9, "top_p": 0.5, "min_p": None, "seed": 7},
        {"top_p": 0.6, "frequency_penalty": 1, "temperature": None},
        greedy=False,
    )
    assert params == SamplingParams(
        temperature=0.9,
        top_p=0.6,
        top_k=20,
        min_p=0.0,
        presence_penalty=1.5,
        frequency_penalty=1.0,
        seed=7,
        greedy=False,
    )
    assert isinstance(params.frequency_penalty, float)
    request_seed = resolve_sampling(NON_THINKING_27B, {"seed": 7}, {"seed": -3}, greedy=False)
    assert request_seed.seed == -3


def test_greedy_forces_temperature_zero_last() -> None:
    params = resolve_sampling(
        NON_THINKING_27B, {"temperature": 1.5}, {"temperature": 1.9}, greedy=True
    )
    assert params.temperature == 0.0 and params.greedy and params.is_greedy
    assert params.presence_penalty == 1.5 and params.top_p == 0.80


def test_missing_seed_becomes_a_fresh_signed_seed() -> None:
    seeds = {resolve_sampling(NON_THINKING_27B, {}, {}, greedy=False).seed for _ in range(8)}
    assert len(seeds) == 8
    assert all(isinstance(s, int) and SEED_MIN <= s <= SEED_MAX for s in seeds)


def test_resolve_rejects_unknown_fields_and_bad_values() -> None:
    with pytest.raises(SamplingParamError) as info:
        resolve_sampling(NON_THINKING_27B, {}, {"top_q": 0.5}, greedy=False)
    assert info.value.field == "top_q"
    with pytest.raises(SamplingParamError) as info:
        resolve_sampling(NON_THINKING_27B, {"top_k": 30}, {}, greedy=False)
    assert info.value.field == "top_k"


# ------------------------------------------------------------------------------------------
# Device
# ------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_cuda_draws_match_cpu_draws() -> None:
    gen = torch.Generator().manual_seed(21)
    num_rows, num_columns, num_sampleable = 48, 248_320, 248_077
    logits = (3 * torch.randn(num_rows, num_columns, generator=gen)).to(torch.bfloat16).float()
    counts = torch.randint(0, 2, (num_rows, num_columns), generator=gen, dtype=torch.int32)
    params = [
        SamplingParams(
            temperature=0.3 + 0.03 * i,
            top_p=0.5 + 0.01 * i,
            top_k=i % 21,
            min_p=0.002 * i,
            presence_penalty=0.5,
            frequency_penalty=0.1,
            seed=SEED_MIN + 977 * i,
            greedy=i % 5 == 0,
        )
        for i in range(num_rows)
    ]
    steps = [3 * i for i in range(num_rows)]
    sampler = Sampler(num_sampleable=num_sampleable)
    on_cpu = sampler.sample(logits, params, steps, counts)
    on_cuda = sampler.sample(logits.cuda(), params, steps, counts.cuda())
    assert on_cuda.device.type == "cuda"
    assert torch.equal(on_cuda.cpu(), on_cpu)
