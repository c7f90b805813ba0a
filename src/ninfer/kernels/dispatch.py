"""Per-device choice between a CUDA kernel and its torch twin, behind the twin's own signature.

Imports torch and the kernel folders; never model/ (model/ may import this). A call on CUDA tensors
uses the kernel when CuPy is importable, `NINFER_KERNELS` is not `torch` and the op is not named
in `NINFER_KERNELS_OFF` (comma-separated op names, to bisect a suspect kernel); anything else (CPU
tensors, no CuPy) runs the reference, so callers never branch on the device themselves.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from ninfer.kernels import runtime, streams, switches
from ninfer.kernels.add_rms_norm import launch as _add_rms_norm_cuda
from ninfer.kernels.add_rms_norm import reference as _add_rms_norm_ref
from ninfer.kernels.attention_metadata import launch as _meta_cuda
from ninfer.kernels.attention_metadata import reference as _meta_ref
from ninfer.kernels.attention_metadata.reference import Indices
from ninfer.kernels.bf16_gemv import launch as _bf16_gemv_cuda
from ninfer.kernels.bf16_mma_gemv import launch as _bf16_mma_cuda
from ninfer.kernels.bf16_tc_gemv import launch as _bf16_tc_cuda
from ninfer.kernels.causal_conv1d import launch as _conv_cuda
from ninfer.kernels.causal_conv1d import reference as _conv_ref
from ninfer.kernels.expert_gemv import launch as _expert_gemv_cuda
from ninfer.kernels.expert_gemv import reference as _expert_gemv_ref
from ninfer.kernels.fp8_gemm import launch as _fp8_gemm_cuda
from ninfer.kernels.fp8_gemv import launch as _fp8_gemv_cuda
from ninfer.kernels.fp8_gemv import launch_tc as _fp8_tc_cuda
from ninfer.kernels.fp8_gemv import reference as _fp8_gemv_ref
from ninfer.kernels.fp8_gemv.reference import Fp8Weight
from ninfer.kernels.fp8_split_gemv import launch as _fp8_split_cuda
from ninfer.kernels.gated_delta_chunk import launch as _chunk_cuda
from ninfer.kernels.gated_delta_decode import launch as _delta_cuda
from ninfer.kernels.gated_delta_decode import reference as _delta_ref
from ninfer.kernels.gated_delta_prefill import launch as _prefill_cuda
from ninfer.kernels.gated_delta_prefill import reference as _prefill_ref
from ninfer.kernels.gated_delta_verify import launch as _verify_cuda
from ninfer.kernels.gated_delta_verify import reference as _verify_ref
from ninfer.kernels.gated_delta_verify.reference import FoldLayer
from ninfer.kernels.gated_rms_norm import launch as _gated_norm_cuda
from ninfer.kernels.gated_rms_norm import reference as _gated_norm_ref
from ninfer.kernels.gdn_decode_front import launch as _front_cuda
from ninfer.kernels.gdn_decode_front import reference as _front_ref
from ninfer.kernels.gdn_decode_front.reference import DecodeFront
from ninfer.kernels.int4_gemv import launch as _int4_cuda
from ninfer.kernels.int4_gemv import reference as _int4_ref
from ninfer.kernels.kv_quant import launch as _kv_cuda
from ninfer.kernels.kv_quant import reference as _kv_ref
from ninfer.kernels.kv_quant.formats import KvPages, QuantPages
from ninfer.kernels.l2_prefetch import launch as _l2_cuda
from ninfer.kernels.moe_routing import launch as _routing_cuda
from ninfer.kernels.moe_routing import reference as _routing_ref
from ninfer.kernels.mtp_front import launch as _mtp_front_cuda
from ninfer.kernels.mtp_front import reference as _mtp_front_ref
from ninfer.kernels.paged_decode_attention import launch as _paged_cuda
from ninfer.kernels.paged_decode_attention import reference as _paged_ref
from ninfer.kernels.qk_norm_rope import launch as _qk_cuda
from ninfer.kernels.qk_norm_rope import reference as _qk_ref
from ninfer.kernels.round_feed import launch as _feed_cuda
from ninfer.kernels.round_feed import reference as _feed_ref
from ninfer.kernels.sampling import launch as _sampling_cuda
from ninfer.kernels.sampling import reference as _sampling_ref
from ninfer.kernels.sampling import rng as _rng
from ninfer.kernels.sampling.rng import RngPurpose
from ninfer.kernels.sigmoid_gate import launch as _sigmoid_gate_cuda
from ninfer.kernels.sigmoid_gate import reference as _sigmoid_gate_ref
from ninfer.kernels.silu_mul import launch as _silu_mul_cuda
from ninfer.kernels.silu_mul import reference as _silu_mul_ref


def use_cuda_kernels(t: torch.Tensor, op: str | None = None) -> bool:
    """True when `t` lives on a GPU and the CUDA kernels (op `op`, if named) can run there."""
    if not t.is_cuda or os.environ.get("NINFER_KERNELS", "cuda") == "torch":
        return False
    if op is not None and switched_off(op):
        return False
    return runtime.cupy_available()


def switched_off(op: str) -> bool:
    """`op` begins an entry of NINFER_KERNELS_OFF (kernels/switches.py). Also names variants
    that are not kernels of their own (`unroll_expert_gemv`, `shared_expert_in_kernels`), so a
    device run can compare them without a code change."""
    return switches.switched_off(op)


def switched_on(op: str) -> bool:
    """`op` begins an entry of NINFER_KERNELS_ON: an opt-in variant (kernels/switches.py)."""
    return switches.switched_on(op)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual); see kernels/add_rms_norm/reference.py."""
    if use_cuda_kernels(x, "add_rms_norm"):
        return _add_rms_norm_cuda.add_rms_norm(x, residual, weight, eps)
    return _add_rms_norm_ref.add_rms_norm(x, residual, weight, eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero-centred RMSNorm with the model's `rms_norm` signature."""
    return add_rms_norm(x, None, weight, eps)[0]


def gated_rms_norm(
    x: torch.Tensor,
    gate: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The DeltaNet output norm; see kernels/gated_rms_norm/reference.py."""
    if use_cuda_kernels(x, "gated_rms_norm"):
        return _gated_norm_cuda.gated_rms_norm(x, gate, weight, eps, out_dtype)
    return _gated_norm_ref.gated_rms_norm(x, gate, weight, eps, out_dtype)


def gated_delta_rule_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ssm_state: torch.Tensor,
    state_slots: torch.Tensor,
    *,
    scale: float,
) -> torch.Tensor:
    """One batched recurrent step; see kernels/gated_delta_decode/reference.py."""
    fn = _delta_cuda if use_cuda_kernels(q, "gated_delta_decode") else _delta_ref
    return fn.gated_delta_rule_decode(q, k, v, g, beta, ssm_state, state_slots, scale=scale)


def gdn_decode_front(
    qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    conv_weight: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    conv_state: torch.Tensor,
    state_slots: torch.Tensor,
    *,
    num_k_heads: int,
    head_k_dim: int,
) -> DecodeFront:
    """The DeltaNet decode step up to the recurrence; see kernels/gdn_decode_front/reference.py."""
    fn = _front_cuda if use_cuda_kernels(qkv, "gdn_decode_front") else _front_ref
    return fn.gdn_decode_front(
        qkv,
        a,
        b,
        conv_weight,
        a_log,
        dt_bias,
        conv_state,
        state_slots,
        num_k_heads=num_k_heads,
        head_k_dim=head_k_dim,
    )


def gdn_verify_front(
    qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    conv_weight: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    conv_state: torch.Tensor,
    state_slots: torch.Tensor,
    *,
    width: int,
    num_k_heads: int,
    head_k_dim: int,
) -> DecodeFront:
    """The decode front over a verify step's W columns; see kernels/gated_delta_verify."""
    fn = _verify_cuda if use_cuda_kernels(qkv, "gdn_verify_front") else _verify_ref
    return fn.gdn_verify_front(
        qkv,
        a,
        b,
        conv_weight,
        a_log,
        dt_bias,
        conv_state,
        state_slots,
        width=width,
        num_k_heads=num_k_heads,
        head_k_dim=head_k_dim,
    )


def gated_delta_verify(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ssm_state: torch.Tensor,
    state_slots: torch.Tensor,
    *,
    width: int,
    scale: float,
) -> torch.Tensor:
    """W decode steps per sequence, state unwritten; see kernels/gated_delta_verify."""
    fn = _verify_cuda if use_cuda_kernels(q, "gated_delta_verify") else _verify_ref
    return fn.gated_delta_verify(q, k, v, g, beta, ssm_state, state_slots, width=width, scale=scale)


def fold_verify_layers(
    layers: list[FoldLayer],
    state_slots: torch.Tensor,
    rows: torch.Tensor,
    num_columns: torch.Tensor,
    max_columns: int,
) -> None:
    """Commit kept verify columns into the slots of every layer; see kernels/gated_delta_verify."""
    if not layers:
        return
    use = use_cuda_kernels(layers[0].ssm_state, "gated_delta_fold")
    fn = _verify_cuda if use else _verify_ref
    fn.fold_layers(layers, state_slots, rows, num_columns, max_columns)


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    state_slots: torch.Tensor,
    query_lens: tuple[int, ...],
    *,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Prefill depthwise conv + SiLU, varlen; see kernels/causal_conv1d/reference.py."""
    fn = _conv_cuda if use_cuda_kernels(x, "causal_conv1d") else _conv_ref
    return fn.causal_conv1d(x, weight, conv_state, state_slots, query_lens, cu_seqlens=cu_seqlens)


def chunked_delta_prefill(
    q: torch.Tensor, v: torch.Tensor, ssm_state: torch.Tensor, query_lens: tuple[int, ...]
) -> bool:
    """Whether `gated_delta_prefill` takes the chunked tensor-core kernel for these inputs.

    Only bf16 inputs whose longest sequence has `CHUNK_MIN_TOKENS` tokens or more: the chunk
    kernel rounds its operands to bf16 (fp32 models keep the exact token-serial kernel), and
    below that length the serial kernel is as fast (docs/perf.md). `gated_delta_chunk` in
    `NINFER_KERNELS_OFF` turns it off.
    """
    return (
        q.dtype == torch.bfloat16
        and max(query_lens, default=0) >= _chunk_cuda.CHUNK_MIN_TOKENS
        and not switched_off("gated_delta_chunk")
        and _chunk_cuda.supports(q, v, ssm_state)
    )


def gated_delta_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    ssm_state: torch.Tensor,
    state_slots: torch.Tensor,
    query_lens: tuple[int, ...],
    *,
    scale: float,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """The prefill delta rule with its q/k norm and gates; see kernels/gated_delta_prefill/.

    On CUDA: the chunked kernel (kernels/gated_delta_chunk/) where `chunked_delta_prefill` says
    so, else the token-serial kernel; elsewhere the twin.
    """
    if not use_cuda_kernels(q, "gated_delta_prefill"):
        fn = _prefill_ref.gated_delta_prefill
    elif chunked_delta_prefill(q, v, ssm_state, query_lens):
        fn = _chunk_cuda.gated_delta_chunk_prefill
    else:
        fn = _prefill_cuda.gated_delta_prefill
    return fn(
        q,
        k,
        v,
        a,
        b,
        a_log,
        dt_bias,
        ssm_state,
        state_slots,
        query_lens,
        scale=scale,
        cu_seqlens=cu_seqlens,
    )


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU activation of a fused gate-up row; see kernels/silu_mul/reference.py."""
    if use_cuda_kernels(gate_up, "silu_mul"):
        return _silu_mul_cuda.silu_mul(gate_up)
    return _silu_mul_ref.silu_mul(gate_up)


def expert_gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    expert_ids: torch.Tensor,
    *,
    rows_per_input: int,
    shared_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """MoE experts read in place by id (+ the shared expert); see expert_gemv/reference.py."""
    if use_cuda_kernels(x, "expert_gemv") and _expert_gemv_cuda.supports(x, weight, shared_weight):
        # `unroll_expert_gemv` in NINFER_KERNELS_OFF: one chunk step in flight per loop (A/B)
        unroll = 1 if switched_off("unroll_expert_gemv") else None  # None: GEMV_UNROLL
        return _expert_gemv_cuda.expert_gemv(
            x, weight, expert_ids, rows_per_input=rows_per_input, shared_weight=shared_weight,
            unroll=unroll,
        )  # fmt: skip
    return _expert_gemv_ref.expert_gemv(
        x, weight, expert_ids, rows_per_input=rows_per_input, shared_weight=shared_weight
    )


def expert_group_gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    expert_ids: torch.Tensor,
    *,
    rows_per_input: int,
    swiglu_input: bool = False,
    groups: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """MoE experts read once per group of their assignments; see expert_gemv/reference.py.
    On CUDA bf16 models run the tensor-core kernel (`uses_group_mma`); `expert_group_mma` in
    NINFER_KERNELS_OFF keeps the CUDA-core one."""
    if use_cuda_kernels(x, "expert_group_gemv") and _expert_gemv_cuda.supports_group(
        x, weight, swiglu_input=swiglu_input
    ):
        return _expert_gemv_cuda.expert_group_gemv(
            x, weight, expert_ids, rows_per_input=rows_per_input, swiglu_input=swiglu_input,
            groups=groups, tensor_cores=not switched_off("expert_group_mma"),
        )  # fmt: skip
    return _expert_gemv_ref.expert_group_gemv(
        x,
        weight,
        expert_ids,
        rows_per_input=rows_per_input,
        swiglu_input=swiglu_input,
        groups=groups,
    )


def moe_combine(
    y: torch.Tensor,
    weights: torch.Tensor,
    *,
    shared: torch.Tensor | None = None,
    shared_gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """Weighted sum over each token's k expert outputs (+ shared); see expert_gemv/reference.py."""
    fn = _expert_gemv_ref.moe_combine
    if use_cuda_kernels(y, "moe_combine") and _expert_gemv_cuda.supports_combine(
        y, weights, shared, shared_gate
    ):
        fn = _expert_gemv_cuda.moe_combine
    return fn(y, weights, shared=shared, shared_gate=shared_gate)


def expert_groups(expert_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Assignments sorted by expert on the device; see expert_gemv/reference.py. One
    `expert_sort` launch where `moe_routing.launch.SORT_ROUTED` (off until measured) and it
    takes the ids (`expert_sort` in NINFER_KERNELS_OFF turns it off), else torch's sort."""
    if (
        _routing_cuda.SORT_ROUTED
        and use_cuda_kernels(expert_ids, "expert_sort")
        and _routing_cuda.supports_sort(expert_ids, num_experts)
    ):
        return _routing_cuda.expert_sort(expert_ids, num_experts)
    return _expert_gemv_ref.expert_groups(expert_ids, num_experts)


def expert_group_gemv_available(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> bool:
    """Whether both grouped GEMVs of a MoE block run the CUDA kernel (the path choice)."""
    return use_cuda_kernels(x, "expert_group_gemv") and _expert_gemv_cuda.supports_group_pair(
        x, gate_up, down
    )


def expert_down_sum(
    gate_up_out: torch.Tensor,
    down: torch.Tensor,
    expert_ids: torch.Tensor,
    weights: torch.Tensor,
    *,
    shared: torch.Tensor | None = None,
    shared_gate: torch.Tensor | None = None,
    shared_down: torch.Tensor | None = None,
) -> torch.Tensor:
    """MoE decode tail (SwiGLU, down, weighted sum, shared expert); see expert_gemv/reference.py."""
    fn = _expert_gemv_ref.expert_down_sum
    if use_cuda_kernels(gate_up_out, "expert_down_sum") and _expert_gemv_cuda.supports_down_sum(
        gate_up_out, down, expert_ids, shared, shared_gate, shared_down
    ):
        fn = _expert_gemv_cuda.expert_down_sum
    return fn(
        gate_up_out,
        down,
        expert_ids,
        weights,
        shared=shared,
        shared_gate=shared_gate,
        shared_down=shared_down,
    )


def route_topk(
    router_logits: torch.Tensor, top_k: int, *, normalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """MoE router softmax + top-k (ties to the lower id); see kernels/moe_routing/reference.py."""
    if use_cuda_kernels(router_logits, "moe_routing") and _routing_cuda.supports(
        router_logits, top_k
    ):
        return _routing_cuda.route_topk(router_logits, top_k, normalize=normalize)
    return _routing_ref.route_topk(router_logits, top_k, normalize=normalize)


def grouped_mm_enabled(t: torch.Tensor) -> bool:
    """True when `torch._grouped_mm` has its sync-free bf16 kernel on `t`'s device.

    Only sm_90 and sm_100 have it (torch's own gate); elsewhere torch loops over the groups with
    the offsets copied to the host, a sync, so callers keep their own path. `NINFER_KERNELS=torch`
    or `grouped_mm` in `NINFER_KERNELS_OFF` turns it off like a kernel.
    """
    if not t.is_cuda or not hasattr(torch, "_grouped_mm"):
        return False
    if os.environ.get("NINFER_KERNELS", "cuda") == "torch" or switched_off("grouped_mm"):
        return False
    major, _ = torch.cuda.get_device_capability(t.device)
    return major in (9, 10)


def paged_decode_supported(
    q: torch.Tensor, k_pages: KvPages, v_pages: KvPages | None = None
) -> bool:
    """True when the paged decode-attention kernel runs for these operands.

    Unlike the other ops, callers check this first: the twin reads lengths on the host, so the
    model keeps its own graph-safe `paged_attention` wherever the kernel does not run.
    """
    return use_cuda_kernels(q, "paged_decode_attention") and _paged_cuda.supports(
        q, k_pages, v_pages
    )


def paged_decode_attention(
    q: torch.Tensor,
    k_pages: KvPages,
    v_pages: KvPages,
    page_table: torch.Tensor,
    kv_lens: torch.Tensor,
    *,
    scale: float,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query per sequence over its paged KV; see kernels/paged_decode_attention/reference.py.
    On CUDA the tensor-core partial serves bf16 models over bf16 / int8 / fp8 pages;
    `paged_decode_mma` in NINFER_KERNELS_OFF keeps the CUDA-core one, `paged_mma_tiles2` in
    NINFER_KERNELS_ON runs its two-tiles-per-iteration form (bit-equal; for an A/B; the launcher
    reads the switches of its V prefetch and combine itself). A `gate` [T, Hq, D] is applied in
    the combine (`gate_in_combine` says where), elsewhere by `sigmoid_gate`: [T, Hq * D] then."""
    if paged_decode_supported(q, k_pages, v_pages):
        in_combine = gate is not None and gate_in_combine(q, gate)
        out = _paged_cuda.paged_decode_attention(
            q, k_pages, v_pages, page_table, kv_lens, scale=scale,
            tensor_cores=not switched_off("paged_decode_mma"),
            mma_tiles=2 if switches.switched_on("paged_mma_tiles2") else _paged_cuda.MMA_TILES,
            gate=gate if in_combine else None,
        )  # fmt: skip
        if in_combine:
            return out.view(out.shape[0], -1)
    else:
        out = _paged_ref.paged_decode_attention(
            q, k_pages, v_pages, page_table, kv_lens, scale=scale
        )
    return out if gate is None else sigmoid_gate(out, gate)


def gate_in_combine(q: torch.Tensor, gate: torch.Tensor) -> bool:
    """Whether the paged decode attention applies the gated attention's output gate in its
    combine, so that o_proj runs the plain GEMV (the GEMV's sigmoid-gate input form streamed 3.02
    TB/s in the H200 batch-1 profile, S36F, against the plain form's 4.01; batch 8 loses its
    `sigmoid_gate` launch): bf16 on CUDA, the same bits as `sigmoid_gate` after the attention.
    Even with it on an H100 (run S37C: 0.999 at batch 1, 1.001 at 8; with the SwiGLU output form
    0.994); `NINFER_KERNELS_OFF=gate_in_combine` keeps the GEMV's gate."""
    return (
        not switches.switched_off("gate_in_combine")
        and use_cuda_kernels(q, "paged_decode_attention")
        and _paged_cuda.gate_problem(q, gate) is None
    )


def attention_indices(
    cu_seqlens: torch.Tensor,
    num_computed: torch.Tensor,
    page_table: torch.Tensor,
    page_size: int,
    num_tokens: int,
) -> Indices:
    """Each new token's sequence, index and flat KV slot, and each sequence's KV length; see
    kernels/attention_metadata/reference.py (one launch on CUDA instead of a dozen; on since run
    S39A: the 27B MTP round 0.994x, the 35B-A3B's 0.985x on an H100)."""
    if (
        use_cuda_kernels(num_computed, "attention_metadata")
        and _meta_cuda.problem(cu_seqlens, num_computed, page_table, num_tokens) is None
    ):
        return _meta_cuda.attention_indices(
            cu_seqlens, num_computed, page_table, page_size, num_tokens
        )
    return _meta_ref.attention_indices(cu_seqlens, num_computed, page_table, page_size, num_tokens)


def take_feed(
    t0: torch.Tensor,
    position: torch.Tensor,
    step: torch.Tensor,
    chain: torch.Tensor,
    slots: torch.Tensor,
    feeds: torch.Tensor,
    feed_committed: torch.Tensor,
    counts: torch.Tensor,
) -> None:
    """A chained round takes what its slot's previous round left; see kernels/round_feed/
    reference.py (one launch on CUDA; on since run S39A: with the metadata kernel the 27B MTP
    round 0.992x on an H100)."""
    args = (t0, position, step, chain, slots, feeds, feed_committed, counts)
    if use_cuda_kernels(feeds, "round_feed") and _feed_cuda.take_problem(*args) is None:
        _feed_cuda.take_feed(*args)
    else:
        _feed_ref.take_feed(*args)


def leave_feed(
    feeds: torch.Tensor,
    feed_committed: torch.Tensor,
    slots: torch.Tensor,
    position: torch.Tensor,
    step: torch.Tensor,
    stops: torch.Tensor,
    accepted: torch.Tensor,
    committed: torch.Tensor,
) -> None:
    """A round leaves its slot's feeds for a chained successor; see kernels/round_feed/
    reference.py (one launch on CUDA, as `take_feed`)."""
    args = (feeds, feed_committed, slots, position, step, stops, accepted, committed)
    if use_cuda_kernels(feeds, "round_feed") and _feed_cuda.leave_problem(*args) is None:
        _feed_cuda.leave_feed(*args)
    else:
        _feed_ref.leave_feed(*args)


def mtp_front(
    ids: torch.Tensor,
    embed: torch.Tensor,
    hidden: torch.Tensor,
    embed_norm: torch.Tensor,
    hidden_norm: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """The MTP head's input [rms_norm(embed[ids]) | rms_norm(hidden)]; see kernels/mtp_front/
    reference.py. One launch on CUDA with the four launches' bits (on since run S40B: with
    `round_commit` the 27B MTP round 0.998x on an H100); `NINFER_KERNELS_OFF=mtp_front` runs
    the four."""
    args = (ids, embed, hidden, embed_norm, hidden_norm)
    if use_cuda_kernels(hidden, "mtp_front") and _mtp_front_cuda.problem(*args) is None:
        return _mtp_front_cuda.mtp_front(*args, eps)
    return _mtp_front_ref.mtp_front(*args, eps, rms_norm=rms_norm)  # its norms through dispatch


def round_commit(
    ids: torch.Tensor,
    position: torch.Tensor,
    header: int,
    result_width: int,
    *,
    target: torch.Tensor | None = None,
    committed: torch.Tensor | None = None,
    accepted: torch.Tensor | None = None,
) -> _feed_ref.Commit:
    """A round's bookkeeping after its verify (what it keeps, the head pass's ids, its result
    rows); see kernels/round_feed/reference.py. One launch on CUDA where the twin runs about 16
    (on since run S40B, with `mtp_front`); `NINFER_KERNELS_OFF=round_commit` runs the twin."""
    given = {"target": target, "committed": committed, "accepted": accepted}
    if (
        use_cuda_kernels(ids, "round_commit")
        and use_cuda_kernels(ids, "round_feed")
        and _feed_cuda.commit_problem(ids, position, header, result_width, **given) is None
    ):
        return _feed_cuda.round_commit(ids, position, header, result_width, **given)
    return _feed_ref.round_commit(ids, position, header, result_width, **given)


def store_kv(x: torch.Tensor, pages: KvPages, slot_mapping: torch.Tensor) -> None:
    """New K or V rows into their page slots, quantized on the way for `QuantPages`; see
    kernels/kv_quant/reference.py. Plain pages keep torch's `index_copy_`."""
    if (
        isinstance(pages, QuantPages)
        and use_cuda_kernels(x, "kv_store")
        and _kv_cuda.supports_store(x, pages)
    ):
        _kv_cuda.store_kv(x, pages, slot_mapping)
        return
    _kv_ref.store_kv(x, pages, slot_mapping)


def gather_kv_pages(pages: KvPages, page_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Pages `page_ids` as [n, P, Hk, D] in `dtype`, dequantized for `QuantPages` (one fused
    gather-dequantize kernel on CUDA); see kernels/kv_quant/reference.py."""
    if (
        isinstance(pages, QuantPages)
        and use_cuda_kernels(pages.values, "kv_gather")
        and _kv_cuda.supports_gather(pages, dtype)
    ):
        return _kv_cuda.gather_pages(pages, page_ids, dtype)
    return _kv_ref.gather_pages(pages, page_ids, dtype)


def qk_norm_rope_store(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    k_pages: KvPages,
    v_pages: KvPages,
    slot_mapping: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`qk_norm_rope`, then the step's K (its result) and V into their page slots (`store_kv`);
    returns (q, k). Plain pages on CUDA take one launch for all three instead of three
    (kernels/qk_norm_rope: `qk_norm_rope_store`, the same bits; 1-2 % of a 27B decode step on
    an H100, docs/perf.md run Z1); `NINFER_KERNELS_OFF=qk_rope_store` runs the separate ops."""
    if (
        not switches.switched_off("qk_rope_store")
        and use_cuda_kernels(q, "qk_norm_rope")
        # plain pages only (store_problem): QuantPages keep store_kv's kernels
        and _qk_cuda.store_problem(q, k, v, cos, k_pages, v_pages, slot_mapping) is None
    ):
        return _qk_cuda.qk_norm_rope_store(
            q, k, v, q_weight, k_weight, cos, sin, eps, k_pages, v_pages, slot_mapping
        )
    q, k = qk_norm_rope(q, k, q_weight, k_weight, cos, sin, eps)
    store_kv(k, k_pages, slot_mapping)
    store_kv(v, v_pages, slot_mapping)
    return q, k


def qk_norm_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention q/k norm + RoPE; see kernels/qk_norm_rope/reference.py."""
    if use_cuda_kernels(q, "qk_norm_rope") and _qk_cuda.supports(q, k, cos):
        fn = _qk_cuda.qk_norm_rope
    else:
        fn = _qk_ref.qk_norm_rope
    return fn(q, k, q_weight, k_weight, cos, sin, eps)


def counter_uniforms(
    seeds: torch.Tensor, steps: torch.Tensor, lanes: torch.Tensor, purpose: RngPurpose
) -> torch.Tensor:
    """The counter RNG's uniforms (kernels/sampling/rng.py) in one launch on CUDA
    (`sampling_uniforms`; switched off, the torch counters around one Philox launch): the torch
    Philox is ~200 elementwise kernels per call, which a sampled speculative round paid three
    times inside its graph."""
    on_cuda = use_cuda_kernels(lanes, "sampling_philox")
    if on_cuda and not switches.switched_off("sampling_uniforms"):
        return _sampling_cuda.counter_uniforms(seeds, steps, lanes, int(purpose))
    return _rng.counter_uniforms(seeds, steps, lanes, purpose, _philox_cuda if on_cuda else None)


def _philox_cuda(counter: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """The kernel's Philox over broadcast [..., 4] counters and [..., 2] keys."""
    key = key.expand(*counter.shape[:-1], 2)
    words = _sampling_cuda.philox4x32_10(counter.reshape(-1, 4), key.reshape(-1, 2))
    return words.view(*counter.shape)


def sample_tokens(
    logits: torch.Tensor,
    rows: _sampling_ref.RowParams,
    *,
    num_sampleable: int,
    counts: torch.Tensor | None = None,
    count_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """One token per logits row; see kernels/sampling/reference.py and engine.sampling.Sampler."""
    if use_cuda_kernels(logits, "sampling") and _sampling_cuda.supports(logits, counts):
        fn = _sampling_cuda.sample_tokens
    else:
        fn = _sampling_ref.sample_tokens
    return fn(logits, rows, num_sampleable=num_sampleable, counts=counts, count_rows=count_rows)


def top_candidates(z: torch.Tensor, num_candidates: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampler's candidates of each row (ids, float32 logits) by (logit desc, id asc), from
    float32 or bf16 rows; see kernels/sampling/reference.py `top_candidates`."""
    if use_cuda_kernels(z, "sampling") and _sampling_cuda.supports_candidates(z, num_candidates):
        return _sampling_cuda.top_candidates(z, num_candidates)
    return _sampling_ref.top_candidates(z.float(), num_candidates)


def _int4_tensor_cores() -> bool:
    """Whether dispatch may run the tensor-core int4 kernel: `int4_gemv.launch.MMA_ROUTED` and
    not `int4_mma` in NINFER_KERNELS_OFF."""
    return _int4_cuda.MMA_ROUTED and not switched_off("int4_mma")


def int4_linear_available(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor) -> bool:
    """Whether `int4_linear` runs a CUDA kernel for these operands in one launch: bf16 x of at
    most `int4_gemv.launch.MMA_MAX_ROWS` rows on tensor cores (where `_int4_tensor_cores`), else
    at most `MAX_ROWS` rows on CUDA cores."""
    return use_cuda_kernels(x, "int4_gemv") and _int4_cuda.supports(
        x, packed, scale, tensor_cores=_int4_tensor_cores()
    )


def int4_mma_available(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor) -> bool:
    """Whether `int4_linear` runs the tensor-core kernel for x's dtype at every row count (in
    launches of up to MMA_MAX_ROWS rows): what lets the shortlist head drop its bf16 rows."""
    return int4_linear_available(x, packed, scale) and _int4_cuda.uses_mma(
        x[:1], _int4_tensor_cores()
    )


def int4_linear(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """[M, R] fp32 logits of x against packed int4 rows with fp32 group scales; see
    kernels/int4_gemv/reference.py. Where `_int4_tensor_cores`, bf16 x runs the tensor-core
    kernel in launches of up to MMA_MAX_ROWS rows (from MMA_MIN_ROWS); x of 1..MAX_ROWS rows
    the CUDA-core one (x
    made contiguous first); anything else, and every CPU call, runs the twin."""
    dense = x.contiguous()
    tensor_cores = _int4_tensor_cores()
    step = _int4_cuda.MMA_MAX_ROWS
    chunked = (
        dense.dim() == 2
        and dense.shape[0] > step
        and _int4_cuda.uses_mma(dense[:1], tensor_cores)
        and int4_linear_available(dense[:step], packed, scale)
    )
    if chunked:  # bf16 x past one launch: launches of up to MMA_MAX_ROWS rows
        parts = [
            int4_linear(dense[i : i + step], packed, scale) for i in range(0, len(dense), step)
        ]
        return torch.cat(parts)
    if int4_linear_available(dense, packed, scale):
        # one row: the CUDA-core kernel is faster (135 against 162 µs on the 27B shortlist with
        # the tensor-core kernel's scales through L1, run S41A; the 27B MTP round 1.01x with
        # one-row proposals on tensor cores)
        mma = tensor_cores and (dense.dim() != 2 or dense.shape[0] >= _int4_cuda.MMA_MIN_ROWS)
        return _int4_cuda.int4_linear(dense, packed, scale, tensor_cores=mma)
    return _int4_ref.int4_linear(x, packed, scale)


def bf16_gemv_routed(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    swiglu_input: bool = False,
    gate: torch.Tensor | None = None,
) -> bool:
    """Whether `linear` (or `swiglu_linear` with `swiglu_input`, or `sigmoid_gate_linear` with a
    `gate`) runs the bf16 GEMV kernel.

    bf16 x of 1..`bf16_gemv.launch.MAX_ROWS` rows on CUDA, a shape where the kernel is measured to
    beat cuBLAS (`bf16_gemv_preferred`, a rule in launch.py) and operands it takes (`supports`);
    `bf16_gemv` in `NINFER_KERNELS_OFF` turns it off, `swiglu_gemv` and `sigmoid_gate_gemv` only
    the fused input forms, which serve one x row only. The cheap checks come first: this runs
    for every projection call, on the CPU too.
    """
    return (
        x.dtype == torch.bfloat16
        and x.dim() == 2
        and 1 <= x.shape[0] <= _bf16_gemv_cuda.MAX_ROWS
        and use_cuda_kernels(x, "bf16_gemv")
        and not (swiglu_input and switched_off("swiglu_gemv"))
        and not (gate is not None and switched_off("sigmoid_gate_gemv"))
        # the fused forms recompute their SiLU / sigmoid per x row in every block: measured
        # neutral at one row (docs/perf.md run U3), more work than the saved launch from two
        and ((not swiglu_input and gate is None) or x.shape[0] == 1)
        and _bf16_gemv_cuda.bf16_gemv_preferred(x.shape[0], weight.shape[0], weight.shape[1])
        and _bf16_gemv_cuda.supports(x, weight, swiglu_input=swiglu_input, gate=gate)
    )


def bf16_tc_routed(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear` runs the tensor-core bf16 GEMV (`bf16_tc_gemv`) for a plain weight: where
    `bf16_tc_gemv.launch.tc_preferred` says so (2..8 rows of a long-row projection; the switch
    `NINFER_KERNELS_ON=bf16_tc_gemv` routes every 1..8-row projection, for a model A/B), the
    operands are ones it takes, and not `bf16_tc_gemv` in `NINFER_KERNELS_OFF`.
    """
    return (
        x.dtype == torch.bfloat16
        and x.dim() == 2
        and _bf16_tc_cuda.tc_preferred(x.shape[0], weight.shape[0], weight.shape[-1])
        and use_cuda_kernels(x, "bf16_tc_gemv")
        and _bf16_tc_cuda.supports(x, weight)
    )


def bf16_mma_routed(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear` runs the tensor-core skinny GEMM (`bf16_mma_gemv`) for a plain weight.

    Off by default: cuBLAS beat it on every decode shape (run V1, docs/perf.md: 181 against 95
    µs for the gate-up at 64 rows), so `bf16_mma_gemv.launch.mma_preferred` routes nothing until
    its ROUTE_ROWS constant names a row range. Then: bf16
    2-D x on CUDA of a routed row count and shape, operands `supports` takes, and not
    `bf16_mma_gemv` in `NINFER_KERNELS_OFF`. The routing constant is read first, so with routing
    off this costs one comparison per projection call.
    """
    return (
        _bf16_mma_cuda.ROUTE_ROWS is not None
        and x.dtype == torch.bfloat16
        and x.dim() == 2
        and weight.dim() == 2
        and _bf16_mma_cuda.mma_preferred(x.shape[0], weight.shape[0], weight.shape[1])
        and use_cuda_kernels(x, "bf16_mma_gemv")
        and _bf16_mma_cuda.supports(x, weight)
    )


PAIR_MAX_ROWS = 8  # linear_pair forks at decode sizes only: prefill's GEMMs fill the GPU alone


def linear_pair(
    x: torch.Tensor, weight: torch.Tensor | Fp8Weight, other: torch.Tensor | Fp8Weight
) -> tuple[torch.Tensor, torch.Tensor]:
    """(linear(x, weight), linear(x, other)): two projections of one x that cannot share a
    launch (an fp8 weight beside a bf16 one). On CUDA with at most `PAIR_MAX_ROWS` x rows (a
    decode step or an MTP verify) `other`'s GEMV runs on a side stream beside `weight`'s
    (kernels/streams.py: a launch and a dependency off the step, S46A), the same kernels and
    bits; `NINFER_KERNELS_OFF=linear_pair` runs them one after the other (A/B)."""
    if x.dim() == 2 and x.shape[0] <= PAIR_MAX_ROWS and use_cuda_kernels(x, "linear_pair"):
        return streams.beside(lambda: linear(x, weight), lambda: linear(x, other), x.device)
    return linear(x, weight), linear(x, other)


PREFETCH_MAX_BYTES = 32 * 2**20  # of one weight: well inside a 50 MB L2 beside the step's state


def prefetch_ahead(x: torch.Tensor, weight: torch.Tensor | Fp8Weight) -> streams.Ahead | None:
    """Opt-in (`NINFER_KERNELS_ON=l2_prefetch`, sm_90): `weight`'s bytes (its first
    PREFETCH_MAX_BYTES, an fp8 weight's scales too) queued for L2 on a side stream, for a GEMV
    of decode-sized x a few kernels later; the caller joins the returned `Ahead` before that
    GEMV (`join`). None where it does not apply. Same bits: a prefetch writes nothing."""
    if not (
        x.dim() == 2
        and x.shape[0] <= PAIR_MAX_ROWS
        and switches.switched_on("l2_prefetch")
        and use_cuda_kernels(x, "l2_prefetch")
    ):
        return None
    parts = (weight.weight, weight.scale_inv) if isinstance(weight, Fp8Weight) else (weight,)
    parts = tuple(_capped(t) for t in parts if _l2_cuda.supports(t))
    if not parts:
        return None
    return streams.ahead(lambda: [_l2_cuda.prefetch(t) for t in parts], x.device)


def _capped(t: torch.Tensor) -> torch.Tensor:
    """`t`'s leading rows within PREFETCH_MAX_BYTES (where they keep the kernel's 16-byte
    multiples; else all of `t`)."""
    if t.dim() < 2:
        return t
    head = t[: max(1, PREFETCH_MAX_BYTES // (t[0].numel() * t.element_size()))]
    return head if _l2_cuda.supports(head) else t


def join(ahead: streams.Ahead | None) -> None:
    """Order the current stream after a `prefetch_ahead` fork (nothing for None)."""
    if ahead is not None:
        ahead.join()


def swiglu_linear(gate_up: torch.Tensor, weight: torch.Tensor | Fp8Weight) -> torch.Tensor:
    """swiglu(gate_up) @ weight.T: a dense MLP's down projection over its gate-up output.

    Where `linear` would run the bf16 GEMV on the activated row, the GEMV forms the SwiGLU as it
    loads x (one launch and one intermediate fewer, the same bits as `silu_mul` then the GEMV);
    so does the tensor-core fp8 GEMV's ring form at 1..4 rows (`launch_tc.swiglu_routed`);
    everything else runs `silu_mul` then `linear`.
    """
    if not isinstance(weight, Fp8Weight) and bf16_gemv_routed(gate_up, weight, swiglu_input=True):
        return _bf16_gemv_cuda.bf16_linear(gate_up, weight, swiglu_input=True)
    if (
        isinstance(weight, Fp8Weight)
        and use_cuda_kernels(gate_up, "fp8_gemv")
        and _fp8_tc_cuda.swiglu_routed(gate_up, weight)
    ):
        return _fp8_tc_cuda.fp8_linear(gate_up, weight, swiglu_input=True)
    if _fp8_split_routed(gate_up, weight, swiglu_input=True):
        return _fp8_split_cuda.fp8_linear(gate_up, weight, swiglu_input=True)
    return linear(silu_mul(gate_up), weight)


def swiglu_mlp(
    x: torch.Tensor, gate_up: torch.Tensor | Fp8Weight, down: torch.Tensor | Fp8Weight
) -> torch.Tensor:
    """down(swiglu(x @ gate_up.T)): a dense MLP (or shared expert) over its [2I, H] gate-up.

    Where the bf16 GEMV runs the gate-up projection of one x row, its SwiGLU output form writes
    the activated row and the down projection is a plain GEMV (the same bits as every other route
    here; run S37C, H100: the 27B batch-1 step 0.4 % faster than the down projection's SwiGLU
    input form, whose H200 profile had it at 3.59 TB/s against the plain form's 4.01);
    `NINFER_KERNELS_OFF=gate_up_swiglu` keeps that input form. Otherwise the gate-up projection,
    then `swiglu_linear`.
    """
    if (
        not switches.switched_off("gate_up_swiglu")
        and not isinstance(gate_up, Fp8Weight)
        and x.shape[0] == 1  # x is [T, H]; `bf16_gemv_routed` checks its rank, dtype, device
        and bf16_gemv_routed(x, gate_up)
        and _bf16_gemv_cuda.swiglu_output_problem(x, gate_up) is None
    ):
        return linear(_bf16_gemv_cuda.gate_up_swiglu(x, gate_up), down)
    return swiglu_linear(linear(x, gate_up), down)


def sigmoid_gate_linear(
    o: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor | Fp8Weight
) -> torch.Tensor:
    """(o * sigmoid(gate)) @ weight.T: the gated attention's output gate, then o_proj.

    o, gate: [T, H, D] (gate a strided view of the q projection). Where `linear` would run the
    bf16 GEMV on the gated rows, the GEMV applies the gate as it loads x (two elementwise launches
    and an intermediate fewer, rounded as torch rounds the eager ops); everything else runs
    `sigmoid_gate` (one kernel on CUDA in bf16) then `linear`.
    """
    # a view only: a head-major prefill output would be copied just to be turned down here
    if o.is_contiguous():
        x = o.view(o.shape[0], -1)
        if not isinstance(weight, Fp8Weight) and bf16_gemv_routed(x, weight, gate=gate):
            return _bf16_gemv_cuda.bf16_linear(x, weight, gate=gate)
        if _fp8_split_routed(x, weight, gate=gate):
            return _fp8_split_cuda.fp8_linear(x, weight, gate=gate)
    return linear(sigmoid_gate(o, gate), weight)


def _fp8_split_routed(
    x: torch.Tensor,
    weight: torch.Tensor | Fp8Weight,
    *,
    swiglu_input: bool = False,
    gate: torch.Tensor | None = None,
) -> bool:
    """Whether the split-K CUDA-core fp8 GEMV takes this decode-sized fp8 projection: opt-in
    (`NINFER_KERNELS_ON=fp8_split`) until a model step says it beats the tensor-core kernel."""
    return (
        isinstance(weight, Fp8Weight)
        and use_cuda_kernels(x, "fp8_gemv")
        and switches.switched_on("fp8_split")
        and _fp8_split_cuda.supports(x, weight, swiglu_input=swiglu_input, gate=gate)
    )


def sigmoid_gate(o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """[T, H, D] o and gate -> [T, H * D] o * sigmoid(gate); see kernels/sigmoid_gate."""
    if use_cuda_kernels(o, "sigmoid_gate") and _sigmoid_gate_cuda.supports(o, gate):
        return _sigmoid_gate_cuda.sigmoid_gate(o, gate)
    return _sigmoid_gate_ref.sigmoid_gate(o, gate)


def _fp8_w8a8_routed(x: torch.Tensor, weight: Fp8Weight) -> bool:
    """Whether opt-in `fp8_w8a8` sends decode-sized x to the W8A8 GEMM: only where its cached
    probe says SCALED_MM (a capture that finds no probe result keeps the GEMV, never the
    dequantizing fallback)."""
    return (
        switches.switched_on("fp8_w8a8")
        and x.dim() == 2
        and x.is_contiguous()
        and use_cuda_kernels(x, "fp8_gemm")
        and _fp8_gemm_cuda.supports(x, weight)
        and _fp8_gemm_cuda.choose_path(x, weight) is _fp8_gemm_cuda.GemmPath.SCALED_MM
    )


def linear(x: torch.Tensor, weight: torch.Tensor | Fp8Weight) -> torch.Tensor:
    """x @ weight.T for a plain weight or an fp8 block-scaled one (`Fp8Weight`).

    Plain weights: `F.linear`, except decode-sized bf16 x on CUDA in the shapes of
    `bf16_gemv_routed`, which run the bf16 GEMV (K split across warps, where cuBLAS leaves few-row
    outputs well under the device bandwidth), and those of `bf16_mma_routed` (none until its
    routing constant is set), which run the tensor-core skinny GEMM.

    fp8 on CUDA: decode-sized x (at most `fp8_gemv.launch.MAX_ROWS` rows) runs the GEMV kernel,
    which reads the e4m3 bytes once; larger x (prefill) runs `fp8_gemm.launch.fp8_linear`: x
    quantized per 1x128 group and a block-scaled fp8 `torch._scaled_mm`, or (fp32 x, shapes off
    its grid, no blockwise support) a dequantize kernel into a scratch copy, then cuBLAS.
    Opt-in (`NINFER_KERNELS_ON=fp8_w8a8`, for an A/B): decode-sized x takes that W8A8 GEMM too,
    as vLLM and SGLang serve the block-scaled checkpoints, where its probe found blockwise
    support (x rounded to e4m3: not the weight-only GEMVs' bits).
    """
    if not isinstance(weight, Fp8Weight):
        if bf16_tc_routed(x, weight):
            return _bf16_tc_cuda.bf16_linear(x, weight)
        if bf16_gemv_routed(x, weight):
            return _bf16_gemv_cuda.bf16_linear(x, weight)
        if bf16_mma_routed(x, weight):
            return _bf16_mma_cuda.bf16_linear(x, weight)
        return F.linear(x, weight)
    if _fp8_w8a8_routed(x, weight):
        return _fp8_gemm_cuda.fp8_gemm(x, weight)
    if use_cuda_kernels(x, "fp8_gemv") and x.dim() == 2 and x.shape[0] <= _fp8_gemv_cuda.MAX_ROWS:
        x = x.contiguous()
        # opt-in: one or two rows on the CUDA cores with the bf16 GEMV's split-K grid
        if _fp8_split_routed(x, weight):
            return _fp8_split_cuda.fp8_linear(x, weight)
        # tensor cores first (sm_90, bf16 x); NINFER_KERNELS_OFF=fp8_tc falls back to the
        # CUDA-core GEMV, which also takes fp32 x (full fp32 products)
        if not switched_off("fp8_tc") and _fp8_tc_cuda.supports(x, weight):
            return _fp8_tc_cuda.fp8_linear(x, weight)
        if _fp8_gemv_cuda.supports(x, weight):
            return _fp8_gemv_cuda.fp8_linear(x, weight)
    # prefill-sized x (or x the GEMV does not take): block-scaled fp8 GEMM, else dequantize+cuBLAS
    if use_cuda_kernels(x, "fp8_gemm") and _fp8_gemm_cuda.supports(x, weight):
        return _fp8_gemm_cuda.fp8_linear(x, weight)
    return _fp8_gemv_ref.fp8_linear(x, weight)
