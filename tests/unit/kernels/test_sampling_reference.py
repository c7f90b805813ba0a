"""The sampling kernel's torch twin (kernels/sampling/reference.py) against an independent
row-by-row NumPy/Python restatement of the documented pipeline: float32 penalties and
temperature, float64 top-p / min-p / race, Philox from Python integers. Token ids must agree
exactly (a float64 near-tie, the only allowed difference, has probability ~1e-15 per row)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ninfer.kernels.sampling import launch
from ninfer.kernels.sampling.reference import RowParams, sample_tokens

MASK = 2**32 - 1


def _philox_word0(counter: tuple[int, int, int, int], key: tuple[int, int]) -> int:
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(10):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & MASK, (k1 + 0xBB67AE85) & MASK
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & MASK, (p0 >> 32) ^ c3 ^ k1, p0 & MASK
    return c0


def _row_reference(
    logits: np.ndarray, counts: np.ndarray | None, reals: tuple, ints: tuple, num_sampleable: int
) -> int:
    temperature, top_p, min_p, presence, frequency = reals
    top_k, greedy, seed, step = ints
    z = logits[:num_sampleable].astype(np.float32)
    if counts is not None:
        c = counts[:num_sampleable].astype(np.float32)
        z = z - np.float32(presence) * (c > 0).astype(np.float32)
        z = z - np.float32(frequency) * c
    order = sorted(range(num_sampleable), key=lambda i: (-float(z[i]), i))
    cand = order[: min(20, num_sampleable)]
    if greedy:
        return cand[0]
    kept = cand[:top_k]
    scaled = [np.float32(z[i]) / np.float32(temperature) for i in kept]  # float32 division
    ratio = [float(s) - float(scaled[0]) for s in scaled]
    weights = [math.exp(r) for r in ratio]
    total = sum(weights)
    best, best_race, before = None, -math.inf, 0.0
    for rank, token in enumerate(kept):
        ok = top_p >= 1.0 or before < top_p * total
        ok = ok and (min_p == 0.0 or ratio[rank] >= math.log(min_p))
        before += weights[rank]
        if not (ok or rank == 0):
            continue
        word = _philox_word0(
            (token, step & MASK, step >> 32, 0), (seed & MASK, (seed >> 32) & MASK)
        )
        u = (word + 0.5) * 2.0**-32
        race = ratio[rank] - math.log(-math.log(u))
        if race > best_race:
            best, best_race = token, race
    return best


def _random_rows(rng: np.random.Generator, num_rows: int, greedy_share: float = 0.2):
    reals, ints = [], []
    for _ in range(num_rows):
        reals.append(
            (
                float(rng.choice([0.3, 0.7, 1.0, 1.9, rng.uniform(0.05, 2.0)])),
                float(rng.choice([1.0, 0.95, 0.8, rng.uniform(0.05, 1.0)])),
                float(rng.choice([0.0, 0.0, 0.05, rng.uniform(0.0, 0.5)])),
                float(rng.choice([0.0, 1.5, rng.uniform(-2, 2)])),
                float(rng.choice([0.0, rng.uniform(-2, 2)])),
            )
        )
        ints.append(
            (
                int(rng.choice([1, 5, 20, rng.integers(1, 21)])),
                int(rng.random() < greedy_share),
                int(rng.integers(-(2**63), 2**63 - 1)),
                int(rng.choice([0, 1, rng.integers(0, 2**40)])),
            )
        )
    return reals, ints


@pytest.mark.parametrize(
    ("num_columns", "num_sampleable", "ties"),
    [(300, 300, False), (300, 250, True), (7, 7, True), (40, 19, False), (5000, 4999, True)],
)
def test_twin_matches_row_by_row_reference(num_columns: int, num_sampleable: int, ties: bool):
    rng = np.random.default_rng(num_columns + num_sampleable)
    num_rows = 48
    logits = torch.from_numpy(rng.normal(0, 2.5, (num_rows, num_columns)).astype(np.float32))
    if ties:  # bf16 rounding leaves many exact ties among the candidates
        logits = logits.to(torch.bfloat16).float()
    logits[::5, 1:4] = -math.inf  # masked tokens (at least one finite value per row remains)
    counts = torch.from_numpy(rng.integers(0, 3, (num_rows, num_columns)).astype(np.int32))
    counts *= torch.from_numpy(rng.random((num_rows, num_columns)) < 0.1)
    reals, ints = _random_rows(rng, num_rows)
    rows = RowParams.pack(reals, ints, "cpu")
    got = sample_tokens(logits, rows, num_sampleable=num_sampleable, counts=counts)
    for i in range(num_rows):
        want = _row_reference(
            logits[i].numpy(), counts[i].numpy(), reals[i], ints[i], num_sampleable
        )
        assert int(got[i]) == want, f"row {i}: {reals[i]} {ints[i]}"


def test_count_rows_read_a_shared_buffer_in_place() -> None:
    rng = np.random.default_rng(2)
    logits = torch.from_numpy(rng.normal(0, 1, (6, 64)).astype(np.float32))
    buffer = torch.from_numpy(rng.integers(0, 4, (9, 70)).astype(np.int32))
    slots = torch.tensor([8, 0, 3, 3, 5, 1])
    reals = [(1.0, 1.0, 0.0, 1.5, 0.7)] * 6
    ints = [(20, 0, 11 * i, i) for i in range(6)]
    rows = RowParams.pack(reals, ints, "cpu")
    via_rows = sample_tokens(logits, rows, num_sampleable=64, counts=buffer, count_rows=slots)
    gathered = sample_tokens(logits, rows, num_sampleable=64, counts=buffer[slots])
    assert torch.equal(via_rows, gathered)
    plain = sample_tokens(logits, rows, num_sampleable=64)
    assert not torch.equal(via_rows, plain)  # the penalties were applied


def test_pack_lays_out_the_documented_columns() -> None:
    rows = RowParams.pack([(0.7, 0.8, 0.0, 1.5, 0.0)], [(20, 1, -5, 2**40)], "cpu")
    assert rows.reals.dtype == torch.float64 and rows.reals.shape == (1, 5)
    assert rows.ints.dtype == torch.int64 and rows.ints.tolist() == [[20, 1, -5, 2**40]]


@pytest.mark.parametrize(
    ("num_rows", "num_sampleable", "num_sms"),
    [(1, 248_077, 132), (8, 248_320, 132), (64, 248_320, 132), (1, 7, 132), (3, 4096, 132)],
)
def test_split_count_fills_the_gpu_within_bounds(num_rows, num_sampleable, num_sms) -> None:
    splits = launch.num_splits_for(num_rows, num_sampleable, num_sms)
    assert 1 <= splits <= launch.MAX_SPLITS
    assert splits == 1 or num_sampleable / splits >= launch.MIN_SPLIT_COLUMNS / 2
    if num_sampleable >= launch.MAX_SPLITS * launch.MIN_SPLIT_COLUMNS:
        assert num_rows * splits >= min(2 * num_sms, num_rows * launch.MAX_SPLITS)
