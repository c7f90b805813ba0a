"""The attention-metadata twin (CPU) and the kernel against it (GPU, bit for bit).

The twin is the index maths gated attention always ran; the CPU tests pin its meaning against a
plain per-token loop on random batches, and what the launcher refuses. The GPU tests hold the
one-launch kernel equal to the twin on fresh random batches: int32 and int64 offsets and tables,
strided views as the CUDA-graph steps pass them (a column of the staged integer block, a slice of
its page columns), page sizes 1..64, eagerly and replayed in a graph on new inputs.
"""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels import dispatch
from ninfer.kernels.attention_metadata import launch as meta_cuda
from ninfer.kernels.attention_metadata import reference as meta_ref


def _batch(
    num_seqs: int, max_new: int, page_size: int, seed: int, device: str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(cu_seqlens int32, num_computed int64, page table int32 [B, W], num_tokens): random
    lengths and contexts, each sequence's pages a random permutation of the pool."""
    g = torch.Generator().manual_seed(seed)
    new = torch.randint(1, max_new + 1, (num_seqs,), generator=g)
    done = torch.randint(0, 300, (num_seqs,), generator=g)
    width = (300 + max_new + page_size - 1) // page_size + 1  # covers any draw; a spare column
    pool = num_seqs * width * 2
    table = torch.stack([torch.randperm(pool, generator=g)[:width] for _ in range(num_seqs)])
    cu = torch.zeros(num_seqs + 1, dtype=torch.int32)
    cu[1:] = new.cumsum(0)
    return cu.to(device), done.to(device), table.to(torch.int32).to(device), int(new.sum())


def _loop(cu, done, table, page_size, num_tokens):
    """The meaning, one token at a time in Python."""
    slots, seqs, locals_ = [], [], []
    for t in range(num_tokens):
        b = max(i for i in range(len(done)) if int(cu[i]) <= t)
        kv = int(done[b]) + t - int(cu[b])
        slots.append(int(table[b, kv // page_size]) * page_size + kv % page_size)
        seqs.append(b)
        locals_.append(t - int(cu[b]))
    return slots, seqs, locals_


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_the_twin_means_what_attention_reads(seed: int, page_size: int) -> None:
    cu, done, table, num_tokens = _batch(5, 40, page_size, seed)
    got = meta_ref.attention_indices(cu, done, table, page_size, num_tokens)
    slots, seqs, locals_ = _loop(cu, done, table, page_size, num_tokens)
    assert got.slot_mapping.tolist() == slots
    assert got.seq_idx.tolist() == seqs
    assert got.local_idx.tolist() == locals_
    assert got.kv_lens.tolist() == (done + (cu[1:] - cu[:-1])).tolist()
    assert got.page_table.dtype == torch.int64 and torch.equal(got.page_table, table.long())
    assert all(t.dtype == torch.int64 for t in got)


def test_cpu_tensors_take_the_twin() -> None:
    cu, done, table, num_tokens = _batch(3, 5, 16, 0)
    got = dispatch.attention_indices(cu, done, table, 16, num_tokens)
    want = meta_ref.attention_indices(cu, done, table, 16, num_tokens)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_the_launcher_names_what_it_refuses() -> None:
    cu, done, table, num_tokens = _batch(3, 5, 16, 0)
    assert meta_cuda.problem(cu, done, table, num_tokens) is None
    assert "int32 or int64" in meta_cuda.problem(cu.float(), done, table, num_tokens)
    assert "num_computed must be int64" in meta_cuda.problem(cu, done.int(), table, num_tokens)
    assert "do not match" in meta_cuda.problem(cu[:-1], done, table, num_tokens)
    assert "rows must be dense" in meta_cuda.problem(cu, done, table.t().contiguous().t(), 1)
    assert "2**31" in meta_cuda.problem(cu, done, table, 2**31)


# -- the kernel (GPU) ------------------------------------------------------------------------------


def _equal(got: meta_ref.Indices, want: meta_ref.Indices) -> None:
    for name, a, b in zip(meta_ref.Indices._fields, got, want, strict=True):
        assert a.dtype == torch.int64 and a.shape == b.shape, name
        assert torch.equal(a, b), name


@pytest.mark.gpu
@pytest.mark.parametrize("cu_dtype", [torch.int32, torch.int64], ids=["cu32", "cu64"])
@pytest.mark.parametrize("table_dtype", [torch.int32, torch.int64], ids=["t32", "t64"])
@pytest.mark.parametrize(
    "num_seqs,max_new,page_size",
    [(1, 1, 16), (8, 1, 16), (64, 1, 16), (4, 6, 16), (3, 700, 64), (5, 9, 1), (33, 40, 32)],
    ids=["b1", "b8", "b64", "verify", "prefill", "page1", "mixed"],
)
def test_the_kernel_equals_the_twin(cu_dtype, table_dtype, num_seqs, max_new, page_size) -> None:
    seed = torch.seed() % 2**31
    cu, done, table, num_tokens = _batch(num_seqs, max_new, page_size, seed, "cuda")
    cu, table = cu.to(cu_dtype), table.to(table_dtype)
    want = meta_ref.attention_indices(cu, done, table, page_size, num_tokens)
    got = meta_cuda.attention_indices(cu, done, table, page_size, num_tokens)
    _equal(got, want)
    if table_dtype == torch.int64:
        assert got.page_table is table  # as torch's .to(int64): the same tensor


@pytest.mark.gpu
def test_strided_views_as_the_graph_steps_stage_them() -> None:
    """num_computed a column and the page table a column slice of one staged int64 block."""
    seed = torch.seed() % 2**31
    cu, done, table, num_tokens = _batch(16, 1, 16, seed, "cuda")
    width = table.shape[1]
    staged = torch.randint(0, 9, (16, 5 + width + 3), dtype=torch.int64, device="cuda")
    staged[:, 2] = done
    staged[:, 5 : 5 + width] = table
    nc, tab = staged[:, 2], staged[:, 5 : 5 + width]
    assert not nc.is_contiguous() and not tab.is_contiguous()
    _equal(
        meta_cuda.attention_indices(cu, nc, tab, 16, num_tokens),
        meta_ref.attention_indices(cu, nc, tab, 16, num_tokens),
    )


@pytest.mark.gpu
def test_a_graph_replay_reads_its_inputs_anew() -> None:
    from support.gpu_checks import capture_graph

    seed = torch.seed() % 2**31
    cu, done, table, num_tokens = _batch(8, 3, 16, seed, "cuda")
    cu_in, done_in, table_in = cu.clone(), done.clone(), table.clone()
    graph, got = capture_graph(
        lambda: meta_cuda.attention_indices(cu_in, done_in, table_in, 16, num_tokens)
    )
    for offset in (1, 2):  # same lengths, new contexts and pages
        _, done2, table2, _ = _batch(8, 3, 16, seed + offset, "cuda")
        done_in.copy_(done2[:8])
        table_in.copy_(table2)
        graph.replay()
        _equal(got, meta_ref.attention_indices(cu_in, done_in, table_in, 16, num_tokens))
