"""Gated full attention of Qwen3.5 over a paged KV cache.

Imports torch, model.batch, sibling layers and kernels.dispatch. The per-step index maths (which
flat KV slot each token writes, which sequence it belongs to) is computed once per forward in
`AttentionMetadata` and shared by all layers. `paged_attention` gathers each sequence's pages into
a padded [B, L] view and runs SDPA with a causal-and-length mask, so prefill chunks and decode
batches share one code path. On CUDA, a prefill of one fresh sequence skips the gather and the
mask (`fresh_causal_attention`), and a later chunk of one sequence gathers its pages and uses a
lower-right causal bias (`continued_causal_attention`; a long chunk as a cuDNN prefix part and
a causal own part merged by log-sum-exp), so SDPA can use a fused backend; decode
runs the split-KV paged kernel (kernels/paged_decode_attention), and so does a speculative verify
step, one query per token (`paged_rows_attention`); the CPU keeps the reference.
With a quantized KV dtype the pages are `QuantPages`: new rows are quantized as they are stored,
and every attention path reads the stored (dequantized) rows, a fresh prefill included, so a
prefix-cache hit or a restored snapshot sees exactly the KV a cold run saw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from ninfer.kernels import dispatch
from ninfer.kernels.fp8_gemv.reference import Fp8Weight
from ninfer.kernels.kv_quant.formats import KvPages, QuantPages
from ninfer.model.batch import ForwardBatch
from ninfer.model.layers.cudnn_plans import bshd_heads
from ninfer.model.layers.split_attention import split_prefix_attention

# Static steps whose rows carry at most this many new tokens each (a speculative verify: k + 1
# <= 6) attend through the split-KV decode kernel, one query per token, on CUDA.
ROWS_AS_QUERIES = 8

# A continued prefill chunk of at least this many queries attends as two cuDNN calls merged by
# log-sum-exp (split_attention.py); shorter ones keep one flash call with the lower-right bias.
SPLIT_MIN_QUERIES = 512


class AttentionMetadata(NamedTuple):
    """Per-step indices shared by every full-attention layer (all on the batch's device)."""

    slot_mapping: torch.Tensor  # [T] int64, flat KV slot (page * P + offset) of each new token
    seq_idx: torch.Tensor  # [T] int64, sequence of each token
    local_idx: torch.Tensor  # [T] int64, index of each token within its sequence's new tokens
    num_computed: torch.Tensor  # [B] int64, KV index of each sequence's first new token
    kv_lens: torch.Tensor  # [B] int64, num_computed + new tokens
    page_table: torch.Tensor  # [B, max_pages] int64
    max_query_len: int
    max_kv_len: int
    # max_kv_len is only a bound (a CUDA graph's static shape): the single-sequence fast paths,
    # which take it for the sequence's length, are off; lengths come from kv_lens on the device
    static: bool = False


@dataclass(frozen=True)
class AttentionWeights:
    q_proj: torch.Tensor | Fp8Weight  # [Hq * 2D, H]: per head, D query rows then D gate rows
    k_proj: torch.Tensor | Fp8Weight  # [Hk * D, H]
    v_proj: torch.Tensor | Fp8Weight  # [Hk * D, H]
    o_proj: torch.Tensor | Fp8Weight  # [H, Hq * D]
    q_norm: torch.Tensor  # [D]
    k_norm: torch.Tensor  # [D]
    # Optional [Hq * 2D + 2 Hk * D, H]: q, k, v rows in one matrix (the three fields above are
    # then views into it), so a decode step runs one GEMM instead of three.
    qkv_fused: torch.Tensor | Fp8Weight | None = None


def build_attention_metadata(batch: ForwardBatch, page_size: int) -> AttentionMetadata:
    """Derive token -> (sequence, KV slot) maps on device without a host sync (one kernel on
    CUDA: `dispatch.attention_indices`)."""
    index = dispatch.attention_indices(
        batch.cu_seqlens, batch.num_computed, batch.page_table, page_size, batch.num_tokens
    )
    return AttentionMetadata(
        slot_mapping=index.slot_mapping,
        seq_idx=index.seq_idx,
        local_idx=index.local_idx,
        num_computed=batch.num_computed,
        kv_lens=index.kv_lens,
        page_table=index.page_table,
        max_query_len=batch.max_query_len,
        max_kv_len=batch.max_kv_len,
        static=batch.static_shapes,
    )


def paged_attention(
    q: torch.Tensor,
    k_pages: KvPages,
    v_pages: KvPages,
    meta: AttentionMetadata,
    *,
    scale: float,
) -> torch.Tensor:
    """Causal GQA attention of new tokens over their sequences' paged KV (including themselves).

    Token i of a sequence with kv_len L and q_len n sits at KV index L - n + i and sees KV indices
    0..L-n+i. The KV of the new tokens must already be stored.

    Args:
        q: [T, Hq, D]; k_pages, v_pages: [num_pages, P, Hk, D].
    Returns:
        [T, Hq, D] in q's dtype.
    """
    num_seqs = meta.page_table.shape[0]
    page_size = k_pages.shape[1]
    num_pages = -(-meta.max_kv_len // page_size)
    pages = meta.page_table[:, :num_pages]
    # [B, n, P, Hk, D] -> [B, Hk, L, D] with L = n * P
    k = dispatch.gather_kv_pages(k_pages, pages, q.dtype).flatten(1, 2).transpose(1, 2)
    v = dispatch.gather_kv_pages(v_pages, pages, q.dtype).flatten(1, 2).transpose(1, 2)
    kv_len_max = k.shape[2]

    q_pad = q.new_zeros(num_seqs, meta.max_query_len, *q.shape[1:])  # [B, n_q, Hq, D]
    q_pad[meta.seq_idx, meta.local_idx] = q
    q_pos = meta.num_computed[:, None] + torch.arange(meta.max_query_len, device=q.device)
    key_pos = torch.arange(kv_len_max, device=q.device)
    mask = (key_pos[None, None, :] <= q_pos[:, :, None]) & (
        key_pos[None, None, :] < meta.kv_lens[:, None, None]
    )  # [B, n_q, L]

    out = F.scaled_dot_product_attention(
        q_pad.transpose(1, 2),
        k.to(q.dtype),
        v.to(q.dtype),
        attn_mask=mask[:, None],
        scale=scale,
        enable_gqa=True,
    )  # [B, Hq, n_q, D]
    return out.transpose(1, 2)[meta.seq_idx, meta.local_idx]


def gated_attention(
    x: torch.Tensor,
    w: AttentionWeights,
    *,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_pages: KvPages,
    v_pages: KvPages,
    meta: AttentionMetadata,
    eps: float,
) -> torch.Tensor:
    """The full-attention token mixer: projections, q/k norm, RoPE, paged attention, gate, o_proj.

    Args:
        x: [T, H] (already input-normed); cos, sin: [T, R].
    Returns:
        [T, H].
    """
    num_tokens = x.shape[0]
    num_kv_heads, head_dim = k_pages.shape[2:]
    if w.qkv_fused is not None:
        kv_dim = num_kv_heads * head_dim
        proj = dispatch.linear(x, w.qkv_fused)
        qg, k, v = proj.split((w.q_proj.shape[0], kv_dim, kv_dim), dim=-1)
    else:
        qg, k, v = (dispatch.linear(x, p) for p in (w.q_proj, w.k_proj, w.v_proj))
    # opt-in: o_proj's weights into L2 beside the norms and attention (joined before o_proj)
    ahead = dispatch.prefetch_ahead(x, w.o_proj)
    qg = qg.reshape(num_tokens, -1, 2, head_dim)  # [T, Hq, (q, gate), D]
    q, gate = qg[:, :, 0], qg[:, :, 1]
    k = k.reshape(num_tokens, num_kv_heads, head_dim)
    v = v.reshape(num_tokens, num_kv_heads, head_dim)
    # apply_rope(rms_norm(.)) for q and k (one kernel on CUDA, the same torch ops elsewhere),
    # then the step's K and V into their pages
    q, k = dispatch.qk_norm_rope_store(
        q, k, v, w.q_norm, w.k_norm, cos, sin, eps, k_pages, v_pages, meta.slot_mapping
    )
    scale = head_dim**-0.5
    quantized = isinstance(k_pages, QuantPages) or isinstance(v_pages, QuantPages)
    fresh = not meta.static and _is_fresh_single_sequence(x, meta)
    if fresh and not quantized:
        out = fresh_causal_attention(q, k, v, scale=scale)
    elif fresh or (not meta.static and _is_continued_single_sequence(x, meta)):
        # a quantized fresh prefill reads its stored rows too (lower-right causal = causal here)
        out = continued_causal_attention(q, k_pages, v_pages, meta, scale=scale)
    elif _rows_as_queries(meta) and dispatch.paged_decode_supported(q, k_pages, v_pages):
        # CUDA decode and speculative verify: split-KV kernel, no gather, no mask
        if dispatch.gate_in_combine(q, gate):  # the gate in its combine, a plain o_proj
            gated = paged_rows_attention(q, k_pages, v_pages, meta, scale=scale, gate=gate)
            dispatch.join(ahead)
            return dispatch.linear(gated, w.o_proj)
        out = paged_rows_attention(q, k_pages, v_pages, meta, scale=scale)
    else:
        out = paged_attention(q, k_pages, v_pages, meta, scale=scale)  # [T, Hq, D]
    # out * sigmoid(gate), then o_proj (at decode sizes the gate is applied inside the GEMV)
    dispatch.join(ahead)
    return dispatch.sigmoid_gate_linear(out, gate, w.o_proj)


def _rows_as_queries(meta: AttentionMetadata) -> bool:
    """Decode steps, and the static (graph-shaped) steps of a few tokens per row that the
    speculative round runs (its verify and the MTP head's pass): eager mixed steps keep SDPA."""
    return meta.max_query_len == 1 or (meta.static and meta.max_query_len <= ROWS_AS_QUERIES)


def paged_rows_attention(
    q: torch.Tensor,
    k_pages: KvPages,
    v_pages: KvPages,
    meta: AttentionMetadata,
    *,
    scale: float,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """Each new token as its own query of the split-KV decode kernel: its sequence's pages, and
    its own KV index + 1 as the length (the causal bound). A decode step has one token per
    sequence; a static step of rows up to `ROWS_AS_QUERIES` tokens (a speculative verify) repeats
    a sequence's page-table row per token. Why: the gather + masked SDPA path copies every page of
    the padded table and runs a generic kernel per layer (~66 us per layer at 1k context in a
    27B round); W queries of one sequence read its pages W times instead, a few MB at decode
    contexts. The KV of the step's tokens must be stored first.

    Args:
        q: [T, Hq, D] CUDA, operands `dispatch.paged_decode_supported` accepts; gate: an output
            gate [T, Hq, D] (`dispatch.paged_decode_attention`).
    Returns:
        [T, Hq, D] in q's dtype; with a gate, the gated rows [T, Hq * D].
    """
    if meta.max_query_len == 1:
        table, lens = meta.page_table, meta.kv_lens
    else:
        table = meta.page_table.index_select(0, meta.seq_idx)
        lens = meta.num_computed.index_select(0, meta.seq_idx) + meta.local_idx + 1
    return dispatch.paged_decode_attention(q, k_pages, v_pages, table, lens, scale=scale, gate=gate)


def _is_fresh_single_sequence(x: torch.Tensor, meta: AttentionMetadata) -> bool:
    """A CUDA prefill of one sequence from position 0 (host-side facts only: no sync).

    max_kv_len bounds num_computed + query_len, so max_kv_len == max_query_len with one sequence
    means nothing was computed before: its KV is exactly the new k, v. Only CUDA takes this path,
    so CPU results stay those of the reference `paged_attention`.
    """
    return (
        x.is_cuda
        and meta.page_table.shape[0] == 1
        and meta.max_query_len > 1
        and meta.max_kv_len == meta.max_query_len
    )


def _is_continued_single_sequence(x: torch.Tensor, meta: AttentionMetadata) -> bool:
    """A CUDA prefill chunk of one sequence that continues earlier chunks (host facts only).

    With one sequence, max_kv_len is its kv_len, so the page gather can be sized on the host.
    """
    return (
        x.is_cuda
        and meta.page_table.shape[0] == 1
        and meta.max_query_len > 1
        and meta.max_kv_len > meta.max_query_len
    )


def continued_causal_attention(
    q: torch.Tensor,
    k_pages: KvPages,
    v_pages: KvPages,
    meta: AttentionMetadata,
    *,
    scale: float,
) -> torch.Tensor:
    """Causal attention of one sequence's new chunk over its whole paged KV, without a mask tensor.

    The chunk's n queries are the last n of the sequence's L keys, which is the lower-right
    aligned causal pattern; `causal_lower_right` expresses it as a bias object that SDPA's flash
    and memory-efficient backends take natively, where an explicit [n, L] mask would force the
    math backend (fp32 scores of n x L per head).

    Args:
        q: [n, Hq, D]; k_pages, v_pages: [num_pages, P, Hk, D] (the chunk's KV already stored).
    Returns:
        [n, Hq, D] in q's dtype.
    """
    page_size = k_pages.shape[1]
    kv_len = meta.max_kv_len
    pages = meta.page_table[0, : -(-kv_len // page_size)]
    # [n_pages, P, Hk, D] -> [L, Hk, D], dequantized into q's dtype for a quantized KV
    k = dispatch.gather_kv_pages(k_pages, pages, q.dtype).flatten(0, 1)[:kv_len]
    v = dispatch.gather_kv_pages(v_pages, pages, q.dtype).flatten(0, 1)[:kv_len]
    if _splits_prefix(q, kv_len):
        out = split_prefix_attention(q, k, v, scale=scale)
        if out is not None:
            return out
    return _sdpa_grouped(q, k, v, scale=scale, attn_mask=causal_lower_right(q.shape[0], kv_len))


def warm_prefill_attention(
    num_heads: int, num_kv_heads: int, head_dim: int, *, dtype: torch.dtype, device: torch.device
) -> None:
    """Run each CUDA prefill-attention variant once on a small shape (a fresh causal chunk, and
    a continued one through the split form), so their kernels load and their first plans build
    while an engine starts: the first call of a cuDNN variant took 1.0-2.0 s on an H100 (run
    W1), which a server would otherwise add to its first prompt. No-op off CUDA."""
    if device.type != "cuda":
        return
    n = SPLIT_MIN_QUERIES
    q = torch.zeros(n, num_heads, head_dim, dtype=dtype, device=device)
    kv = torch.zeros(2 * n, num_kv_heads, head_dim, dtype=dtype, device=device)
    scale = head_dim**-0.5
    fresh_causal_attention(q, kv[:n], kv[:n], scale=scale)
    if _splits_prefix(q, 2 * n):
        split_prefix_attention(q, kv, kv, scale=scale)
    torch.cuda.synchronize(device)


def _splits_prefix(q: torch.Tensor, kv_len: int) -> bool:
    """A CUDA chunk of at least `SPLIT_MIN_QUERIES` queries after a prefix: its attention runs
    as an unmasked prefix part and a causal own part in cuDNN, merged (model/layers/
    split_attention.py); `split_prefix_attention` in NINFER_KERNELS_OFF keeps one flash call."""
    return (
        q.is_cuda
        and kv_len > q.shape[0] >= SPLIT_MIN_QUERIES
        and not dispatch.switched_off("split_prefix_attention")
    )


def fresh_causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float
) -> torch.Tensor:
    """Causal GQA attention of one sequence over its own new tokens, with no mask tensor.

    `is_causal` without `attn_mask` lets SDPA pick its flash or memory-efficient backend.

    Args:
        q: [T, Hq, D]; k, v: [T, Hk, D].
    Returns:
        [T, Hq, D] in q's dtype.
    """
    return _sdpa_grouped(q, k, v, scale=scale, is_causal=True)


def _sdpa_grouped(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    is_causal: bool = False,
    attn_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """SDPA of one sequence with grouped KV heads (`enable_gqa`), no expanded copies of K and V;
    `attn_mask` may be a bias object such as `causal_lower_right`.

    Backend order: cuDNN first, then flash. On an H200 with the 27B's heads (24 over 4 of 256),
    an 8k causal prefill takes 1.25 ms per layer in cuDNN with grouped heads against 1.45 ms with
    expanded ones and 2.76 ms in flash; the lower-right bias of a continued chunk only takes flash
    or the memory-efficient kernel, and flash with grouped heads beats expanded ones there too
    (7.93 against 8.34 ms at 8k over 16k keys; docs/perf.md run U3). The memory-efficient kernel
    does not take grouped heads, so shapes only it would serve run the math kernel.

    Args:
        q: [n, Hq, D]; k, v: [L, Hk, D].
    Returns:
        [n, Hq, D] in q's dtype.
    """
    # [T, H, D] -> [1, H, T, D] views of BSHD memory (cuDNN's length-free plans: cudnn_plans.py)
    qh, kh, vh = bshd_heads(q), bshd_heads(k.to(q.dtype)), bshd_heads(v.to(q.dtype))
    with sdpa_kernel(_GROUPED_BACKENDS, set_priority=True):
        out = F.scaled_dot_product_attention(
            qh, kh, vh, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=True
        )
    return out[0].transpose(0, 1)


_GROUPED_BACKENDS = [
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
]
