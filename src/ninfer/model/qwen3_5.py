"""Qwen3_5Model: the Qwen3.5 text model (dense or MoE) over bound weights, on the torch path.

Imports model.* only (never engine/, server/, protocol/). Stateless apart from its weights: all
per-sequence state lives in the ModelCache it is handed, and what a step does is entirely described
by the ForwardBatch, so the engine can replay, checkpoint or speculate without the model knowing.
Weights are checked by name and shape once at bind time; tensors already in the right dtype and
device are used as-is (zero-copy). fp8 block-scaled linear weights stay fp8 on CUDA (`Fp8Weight`,
half the bytes a decode step reads) and are dequantized to the compute dtype elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import TypeVar

import torch
import torch.nn.functional as F

from ninfer.kernels import dispatch
from ninfer.kernels.bf16_tc_gemv.launch import tc_preferred
from ninfer.kernels.fp8_gemv.launch_tc import tiles_wanted
from ninfer.kernels.fp8_gemv.reference import BLOCK, Fp8Weight, dequantize
from ninfer.kernels.fp8_gemv.tiles import attach_tiles, attached_tiles, pack_tiles
from ninfer.model.batch import ForwardBatch
from ninfer.model.cache import ModelCache
from ninfer.model.config import LayerType, TextConfig
from ninfer.model.errors import BatchError, WeightError
from ninfer.model.layers.gated_attention import (
    AttentionWeights,
    build_attention_metadata,
    gated_attention,
)
from ninfer.model.layers.gated_deltanet import DeltaNetWeights, gated_deltanet
from ninfer.model.layers.mlp import MlpWeights, mlp
from ninfer.model.layers.moe import MoeWeights, sparse_moe
from ninfer.model.layers.rope import Rope, mrope_axis_map, rope_inv_freq


@dataclass(frozen=True)
class DecoderLayerWeights:
    layer_type: LayerType
    input_layernorm: torch.Tensor  # [H]
    post_attention_layernorm: torch.Tensor  # [H]
    mixer: AttentionWeights | DeltaNetWeights
    ffn: MlpWeights | MoeWeights


class _Binder:
    """Takes named tensors, checks their shapes and moves them; remembers what was used.

    An e4m3 tensor `name` comes with its block scales `name + "_scale_inv"` (the artifact's
    `fp8_block128` format); `linear` keeps such a pair as an `Fp8Weight` when `keep_fp8`, every
    other use dequantizes it on the target device (exact up to the one cast to the dtype).
    """

    def __init__(
        self,
        weights: Mapping[str, torch.Tensor],
        dtype: torch.dtype,
        device: torch.device,
        *,
        keep_fp8: bool = False,
        consume: bool = False,
    ) -> None:
        if consume and not isinstance(weights, MutableMapping):
            raise TypeError("consume_weights needs a mutable mapping (a dict) of weights")
        self.weights = weights
        self.dtype = dtype
        self.device = device
        self.keep_fp8 = keep_fp8
        self.consume = consume
        self.used: set[str] = set()

    def _get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name not in self.weights:
            raise WeightError(f"missing weight '{name}'")
        tensor = self.weights[name]
        if tuple(tensor.shape) != shape:
            raise WeightError(
                f"weight '{name}' has shape {list(tensor.shape)}, expected {list(shape)}"
            )
        self.used.add(name)
        if self.consume:
            del self.weights[name]  # type: ignore[attr-defined]  # checked in __init__
        return tensor.detach()

    def _fp8(self, name: str, tensor: torch.Tensor) -> Fp8Weight:
        blocks = (*tensor.shape[:-2], *(-(-d // BLOCK) for d in tensor.shape[-2:]))
        scale = self._get(name + "_scale_inv", blocks)
        # Host tensors are copied, never viewed: a caller's mapped artifact may close once the
        # model is built (the dequantizing path copies anyway). Device tensors are bound as-is.
        copy = self.device.type == "cpu"
        return Fp8Weight(
            tensor.to(device=self.device, copy=copy).contiguous(),
            scale.to(device=self.device, dtype=torch.float32, copy=copy).contiguous(),
        )

    def __call__(
        self, name: str, shape: tuple[int, ...], dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        tensor = self._get(name, shape)
        if tensor.dtype == torch.float8_e4m3fn:
            w = self._fp8(name, tensor)
            return dequantize(w.weight, w.scale_inv, dtype or self.dtype)
        return tensor.to(device=self.device, dtype=dtype or self.dtype)

    def linear(self, name: str, shape: tuple[int, int]) -> torch.Tensor | Fp8Weight:
        """A projection weight: fp8 stays fp8 when `keep_fp8`, anything else as `__call__`."""
        tensor = self.weights.get(name)
        if self.keep_fp8 and tensor is not None and tensor.dtype == torch.float8_e4m3fn:
            return self._fp8(name, self._get(name, shape))
        return self(name, shape)


class Qwen3_5Model:
    """The text model: embeddings, hybrid decoder layers, final norm, untied lm_head."""

    def __init__(
        self,
        config: TextConfig,
        weights: Mapping[str, torch.Tensor],
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        strict: bool = True,
        fuse_projections: bool | None = None,
        fp8_weights: bool | None = None,
        consume_weights: bool = False,
        decode_tiles: bool = False,
    ) -> None:
        """Bind `weights` (HF text-model names without the `model.language_model.` prefix).

        With `strict`, a weight the config does not use is an error (it usually means a
        naming mismatch); pass strict=False to ignore extras such as `mtp.*`.
        `fuse_projections` (default: on for CUDA) concatenates the projections a token reads
        together (DeltaNet qkv/z/b/a, attention q/k/v, MLP gate/up) into one matrix each, so a
        decode step runs one GEMV where it ran up to four; the separate fields become views, so
        the model holds no extra copy once the caller drops `weights`. Off by default on the CPU,
        whose results then stay those of the unfused reference bit for bit.
        `fp8_weights` (default: on for CUDA) keeps fp8 projection weights in fp8 for the fp8
        GEMV kernel; off, they are dequantized to `dtype` at bind time (the CPU reference path).
        Fusion merges fp8 projections only where every part but the last ends on a 128-row block
        edge (so the scales merge too); DeltaNet's fp8 qkv/z beside bf16 b/a merge as two pairs;
        a group that cannot merge at all stays separate.
        `consume_weights` deletes each weight from `weights` (a dict) as it is bound. Why: with
        tensors already on the device (the bench's random weights) the caller's dict would keep
        every fused part alive until the end, two copies of each projection at the peak (the 27B
        in bf16 then does not fit an 80 GB card); consumed, the peak is one layer's parts.
        `decode_tiles` (CUDA, with fused projections) binds tile-major copies of the weights the
        tensor-core decode GEMVs read (`_tiled`): faster decode for more weight memory.
        """
        self.config = config
        self.dtype = dtype
        self.device = torch.device(device)
        self.fuse_projections = (
            self.device.type == "cuda" if fuse_projections is None else fuse_projections
        )
        keep_fp8 = self.device.type == "cuda" if fp8_weights is None else fp8_weights
        if decode_tiles:
            _check_tiles(self.device, dtype, self.fuse_projections)
        self.decode_tiles = decode_tiles  # the MTP head tiles its layer alike (model/mtp.py)
        self.fp8_weights = keep_fp8  # the MTP head binds its layer the same way (model/mtp.py)
        take = _Binder(weights, dtype, self.device, keep_fp8=keep_fp8, consume=consume_weights)
        c = config
        self.embed_tokens = take("embed_tokens.weight", (c.vocab_size, c.hidden_size))
        self.layers = [self._bind_layer(take, i) for i in range(c.num_hidden_layers)]
        self.norm = take("norm.weight", (c.hidden_size,))
        if "lm_head.weight" in weights or not c.tie_word_embeddings:
            self.lm_head = take("lm_head.weight", (c.vocab_size, c.hidden_size))
        else:
            self.lm_head = self.embed_tokens
        if strict and (unused := sorted(set(weights) - take.used)):
            raise WeightError(f"{len(unused)} unexpected weight(s), first '{unused[0]}'")
        self.rope = Rope(
            rope_inv_freq(c.rotary_dim, c.rope_theta, self.device),
            mrope_axis_map(c.mrope_section, c.mrope_interleaved, self.device),
        )

    def _bind_layer(self, take: _Binder, i: int) -> DecoderLayerWeights:
        c = self.config
        p = f"layers.{i}."
        mixer: AttentionWeights | DeltaNetWeights
        if c.layer_types[i] is LayerType.FULL:
            mixer = _bind_attention(take, p + "self_attn.", c)
        else:
            mixer = _bind_deltanet(take, p + "linear_attn.", c)
        ffn = _bind_moe(take, p + "mlp.", c) if c.is_moe else _bind_mlp(take, p + "mlp.", c)
        if self.fuse_projections:
            tiles = self.decode_tiles
            mixer, ffn = _tiled(_fused(mixer), tiles), _tiled(_fused(ffn), tiles)
        return DecoderLayerWeights(
            layer_type=c.layer_types[i],
            input_layernorm=take(p + "input_layernorm.weight", (c.hidden_size,)),
            post_attention_layernorm=take(p + "post_attention_layernorm.weight", (c.hidden_size,)),
            mixer=mixer,
            ffn=ffn,
        )

    @torch.no_grad()
    def forward(
        self, batch: ForwardBatch, cache: ModelCache, *, all_logits: bool = False
    ) -> torch.Tensor:
        """Run one step, updating KV pages and state slots in `cache`.

        Returns:
            fp32 logits: [B, vocab] for the last token of each sequence, or [T, vocab].
        """
        hidden = self.forward_hidden(batch, cache)
        if not all_logits and batch.max_query_len > 1:  # one token a row: already [B, H]
            hidden = hidden[batch.cu_seqlens[1:].to(torch.int64) - 1]  # [B, H]
        return self.compute_logits(hidden)

    @torch.no_grad()
    def forward_hidden(self, batch: ForwardBatch, cache: ModelCache) -> torch.Tensor:
        """The final-normed hidden states [T, H] (what lm_head and an MTP head read)."""
        self._check(batch, cache)
        c = self.config
        x = F.embedding(batch.input_ids, self.embed_tokens)  # [T, H]
        if batch.embed_index is not None and batch.embed_rows is not None:  # media tokens
            x = x.index_copy(0, batch.embed_index, batch.embed_rows.to(x.dtype))
        cos, sin = batch.rope_angles or self.rope.cos_sin(batch.positions)
        meta = build_attention_metadata(batch, cache.page_size) if c.full_attention_layers else None
        eps = c.rms_norm_eps
        h = x
        for i, layer in enumerate(self.layers):
            # x <- x + h (the previous layer's output), then the input norm: one fused kernel
            if i == 0:
                h = dispatch.rms_norm(x, layer.input_layernorm, eps)
            else:
                h, x = dispatch.add_rms_norm(h, x, layer.input_layernorm, eps)
            if isinstance(layer.mixer, AttentionWeights):
                assert meta is not None
                k_pages, v_pages = cache.kv(i)
                h = gated_attention(
                    h,
                    layer.mixer,
                    cos=cos,
                    sin=sin,
                    k_pages=k_pages,
                    v_pages=v_pages,
                    meta=meta,
                    eps=c.rms_norm_eps,
                )
            else:
                conv_state, ssm_state = cache.state(i)
                h = gated_deltanet(
                    h,
                    layer.mixer,
                    conv_state=conv_state,
                    ssm_state=ssm_state,
                    batch=batch,
                    eps=c.rms_norm_eps,
                )
            h, x = dispatch.add_rms_norm(h, x, layer.post_attention_layernorm, eps)
            if isinstance(layer.ffn, MoeWeights):
                h = sparse_moe(
                    h, layer.ffn, top_k=c.num_experts_per_tok, norm_topk_prob=c.norm_topk_prob
                )
            else:
                h = mlp(h, layer.ffn)
        if not self.layers:
            return dispatch.rms_norm(x, self.norm, eps)
        return dispatch.add_rms_norm(h, x, self.norm, eps)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, H] final-normed hidden states -> [N, vocab] fp32 logits.

        Through `dispatch.linear` like every projection, so one row runs the bf16 GEMV (which
        overlaps the final norm's tail); `NINFER_KERNELS_OFF=lm_head_gemv` keeps cuBLAS (A/B).
        """
        if dispatch.switched_off("lm_head_gemv"):
            return F.linear(hidden, self.lm_head).float()
        return dispatch.linear(hidden, self.lm_head).float()

    def _check(self, batch: ForwardBatch, cache: ModelCache) -> None:
        """Host-side checks only (no device sync): the batch must fit the cache it will write."""
        c = self.config
        if batch.input_ids.device.type != self.device.type:
            raise BatchError(f"batch is on {batch.input_ids.device}, model on {self.device}")
        if c.full_attention_layers:
            capacity = batch.page_table.shape[1] * cache.page_size
            if batch.max_kv_len > capacity:
                raise BatchError(
                    f"max_kv_len {batch.max_kv_len} exceeds page table capacity {capacity}"
                )
            k_pages = cache.k_pages[0]
            expected = (c.num_key_value_heads, c.head_dim)
            if len(cache.k_pages) < len(c.full_attention_layers) or k_pages.shape[2:] != expected:
                raise BatchError("cache KV layout does not match the model config")
        if c.linear_attention_layers and (
            len(cache.ssm_state) != len(c.linear_attention_layers)
            or cache.conv_state[0].shape[1] != c.conv_dim
        ):
            raise BatchError("cache state layout does not match the model config")


def _bind_attention(take: _Binder, a: str, c: TextConfig) -> AttentionWeights:
    hidden = c.hidden_size
    q_dim = c.num_attention_heads * c.head_dim
    kv_dim = c.num_key_value_heads * c.head_dim
    return AttentionWeights(
        q_proj=take.linear(a + "q_proj.weight", (2 * q_dim, hidden)),
        k_proj=take.linear(a + "k_proj.weight", (kv_dim, hidden)),
        v_proj=take.linear(a + "v_proj.weight", (kv_dim, hidden)),
        o_proj=take.linear(a + "o_proj.weight", (hidden, q_dim)),
        q_norm=take(a + "q_norm.weight", (c.head_dim,)),
        k_norm=take(a + "k_norm.weight", (c.head_dim,)),
    )


def _bind_deltanet(take: _Binder, a: str, c: TextConfig) -> DeltaNetWeights:
    hidden, heads = c.hidden_size, c.linear_num_value_heads
    conv = take(a + "conv1d.weight", (c.conv_dim, 1, c.linear_conv_kernel_dim))
    return DeltaNetWeights(
        in_proj_qkv=take.linear(a + "in_proj_qkv.weight", (c.conv_dim, hidden)),
        in_proj_z=take.linear(a + "in_proj_z.weight", (c.linear_value_dim, hidden)),
        in_proj_b=take.linear(a + "in_proj_b.weight", (heads, hidden)),
        in_proj_a=take.linear(a + "in_proj_a.weight", (heads, hidden)),
        conv1d=conv.reshape(c.conv_dim, c.linear_conv_kernel_dim),
        # The decay parameters stay fp32 whatever the model dtype: g feeds an exp.
        dt_bias=take(a + "dt_bias", (heads,), torch.float32),
        A_log=take(a + "A_log", (heads,), torch.float32),
        norm=take(a + "norm.weight", (c.linear_value_head_dim,)),
        out_proj=take.linear(a + "out_proj.weight", (hidden, c.linear_value_dim)),
    )


def _bind_mlp(take: _Binder, m: str, c: TextConfig) -> MlpWeights:
    hidden, inter = c.hidden_size, c.intermediate_size
    return MlpWeights(
        gate_proj=take.linear(m + "gate_proj.weight", (inter, hidden)),
        up_proj=take.linear(m + "up_proj.weight", (inter, hidden)),
        down_proj=take.linear(m + "down_proj.weight", (hidden, inter)),
    )


def _bind_moe(take: _Binder, m: str, c: TextConfig) -> MoeWeights:
    hidden, e = c.hidden_size, c.num_experts
    inter, shared = c.moe_intermediate_size, c.shared_expert_intermediate_size
    return MoeWeights(
        router=take(m + "gate.weight", (e, hidden)),
        experts_gate_up=take(m + "experts.gate_up_proj", (e, 2 * inter, hidden)),
        experts_down=take(m + "experts.down_proj", (e, hidden, inter)),
        shared_gate_proj=take.linear(m + "shared_expert.gate_proj.weight", (shared, hidden)),
        shared_up_proj=take.linear(m + "shared_expert.up_proj.weight", (shared, hidden)),
        shared_down_proj=take.linear(m + "shared_expert.down_proj.weight", (hidden, shared)),
        shared_gate=take(m + "shared_expert_gate.weight", (1, hidden)),
    )


_Linear = TypeVar("_Linear", torch.Tensor, Fp8Weight)


def _fuse_rows(parts: Sequence[_Linear]) -> tuple[_Linear, list[_Linear]] | None:
    """One [sum N_i, H] matrix and a view of it per part (row slices stay contiguous), or None
    where the parts cannot merge: plain and fp8 mixed, or fp8 parts off the 128-row block grid."""
    if all(isinstance(p, torch.Tensor) for p in parts):
        fused = torch.cat(list(parts), dim=0)
        return fused, list(fused.split([p.shape[0] for p in parts], dim=0))
    if not all(isinstance(p, Fp8Weight) for p in parts):
        return None
    if any(p.shape[0] % BLOCK for p in parts[:-1]):
        return None
    fp8 = Fp8Weight(
        torch.cat([p.weight for p in parts], dim=0),
        torch.cat([p.scale_inv for p in parts], dim=0),
    )
    edges = [0]
    for p in parts:
        edges.append(edges[-1] + p.shape[0])
    return fp8, [fp8.rows(a, b) for a, b in zip(edges, edges[1:], strict=False)]


_W = TypeVar("_W", AttentionWeights, DeltaNetWeights, MlpWeights, MoeWeights)


def _whole_on_gpu(t: torch.Tensor) -> bool:
    """`t` is on a GPU and all of its storage (not a row view of a fused matrix)."""
    return t.is_cuda and t.untyped_storage().nbytes() == t.numel() * t.element_size()


def _check_tiles(device: torch.device, dtype: torch.dtype, fused: bool) -> None:
    """`decode_tiles` where a kernel reads them (tensor-core GEMVs: sm_90+, bf16 activations, the
    fused projections), so the memory is never spent for nothing."""
    if device.type != "cuda" or not fused:
        raise ValueError("decode_tiles needs a CUDA device (the tiles feed its decode GEMVs)")
    if dtype != torch.bfloat16:
        raise ValueError("decode_tiles needs dtype bf16 (the fp32 path's GEMVs read rows)")
    if torch.cuda.get_device_capability(device) < (9, 0):
        raise ValueError("decode_tiles needs an sm_90 GPU (Hopper: the tensor-core GEMVs)")


def _tiled(w: _W, on: bool = False) -> _W:
    """At bind time, with `on` (`decode_tiles`) or the A/B switches: the decode GEMVs'
    tile-major copies (fp8_gemv/tiles.py: each k block of a 128-row block one contiguous 16 KiB
    run, which DRAM streams faster than 128-byte pieces of 128 rows) beside the row-major
    matrices, which stay for prefill's GEMMs, so the tiled projections take twice their bytes.
    fp8 (`on`, or `NINFER_KERNELS_ON=fp8_tiles`): every fp8 projection on the GPU that is not a
    row view of another (`Fp8Weight.tiles`), with `long_k_tiles` only those of K >= LONG_K_TILES
    (a third of the bytes on the 27B); views made before keep reading rows. bf16 (`on`, or
    `bf16_tiles`): every plain bf16 projection the tensor-core bf16 GEMV takes at 2-8 rows
    (`tc_preferred`: the 27B's down, out_proj and o_proj), kept on the tensor (`attach_tiles`).
    `NINFER_KERNELS_OFF=fp8_tiles` / `bf16_tiles` at launch reads the rows again (a one-process
    A/B)."""
    fp8 = on or dispatch.switched_on("fp8_tiles")
    bf16 = on or dispatch.switched_on("bf16_tiles")
    if not (fp8 or bf16):
        return w
    changes = {}
    for f in fields(w):
        v = getattr(w, f.name)
        if fp8 and isinstance(v, Fp8Weight) and v.tiles is None and _whole_on_gpu(v.weight):
            if tiles_wanted(v.shape[1]):
                changes[f.name] = replace(v, tiles=pack_tiles(v.weight))
        elif bf16 and _bf16_tc_routed(v):
            attach_tiles(v)
    return replace(w, **changes) if changes else w


def tiles_bytes(parts: Iterable[object]) -> int:
    """Device bytes of the decode tiles bound in `parts` (weight dataclasses: a layer's mixer and
    FFN, the MTP head's), each storage once: what `decode_tiles` costs beside the row-major
    weights, for the startup log."""
    seen: dict[int, int] = {}
    for part in parts:
        for f in fields(part):  # type: ignore[arg-type]
            v = getattr(part, f.name)
            if isinstance(v, Fp8Weight):
                tiles = v.tiles
            else:
                tiles = attached_tiles(v) if isinstance(v, torch.Tensor) else None
            if tiles is not None:
                storage = tiles.untyped_storage()
                seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _bf16_tc_routed(v: object) -> bool:
    """`v` is a whole plain bf16 matrix on a GPU that the tensor-core GEMV takes at 8 rows."""
    if not (isinstance(v, torch.Tensor) and v.dtype == torch.bfloat16 and v.dim() == 2):
        return False
    return _whole_on_gpu(v) and tc_preferred(8, *v.shape)


def _fused(w: _W) -> _W:
    """The same weights with the row-concatenated projection bound (see Qwen3_5Model)."""
    if isinstance(w, DeltaNetWeights):
        if (m := _fuse_rows((w.in_proj_qkv, w.in_proj_z, w.in_proj_b, w.in_proj_a))) is None:
            # fp8 qkv/z beside bf16 b/a (the official fp8 layout): two merged pairs, if they merge
            qkvz, ba = (
                _fuse_rows((w.in_proj_qkv, w.in_proj_z)),
                _fuse_rows((w.in_proj_b, w.in_proj_a)),
            )
            if qkvz is None or ba is None or not isinstance(ba[0], torch.Tensor):
                return w
            (qkvz_fused, (qkv, z)), (ba_fused, (b, a)) = qkvz, ba
            return replace(
                w,
                in_proj_qkv=qkv,
                in_proj_z=z,
                in_proj_b=b,
                in_proj_a=a,
                in_proj_qkvz=qkvz_fused,
                in_proj_ba=ba_fused,
            )
        fused, (qkv, z, b, a) = m
        return replace(
            w, in_proj_qkv=qkv, in_proj_z=z, in_proj_b=b, in_proj_a=a, in_proj_fused=fused
        )
    if isinstance(w, AttentionWeights):
        if (m := _fuse_rows((w.q_proj, w.k_proj, w.v_proj))) is None:
            return w
        fused, (q, k, v) = m
        return replace(w, q_proj=q, k_proj=k, v_proj=v, qkv_fused=fused)
    if isinstance(w, MlpWeights):
        if (m := _fuse_rows((w.gate_proj, w.up_proj))) is None:
            return w
        fused, (gate, up) = m
        return replace(w, gate_proj=gate, up_proj=up, gate_up=fused)
    # the router and the shared expert's gate read the same x: one GEMV for both, its rows
    # padded with zeros to a multiple of 8 so the [T, rows] output rows stay 16-byte aligned
    # (257 of them sent cuBLAS to an align-1 kernel above 8 rows: 9 µs per 35B layer at 64)
    pad = -(w.router.shape[0] + w.shared_gate.shape[0]) % 8
    zeros = w.router.new_zeros((pad, w.router.shape[1]))
    head = (w.router, w.shared_gate, zeros) if pad else (w.router, w.shared_gate)
    # and the shared expert's gate-up reads it too: one matrix holding all three, the two
    # narrower fused matrices as views into it (where the shared expert is plain, as the router)
    if m := _fuse_rows((*head, w.shared_gate_proj, w.shared_up_proj)):
        fused, views = m
        rows = sum(p.shape[0] for p in head)
        return replace(
            w,
            router=views[0],
            shared_gate=views[1],
            shared_gate_proj=views[-2],
            shared_up_proj=views[-1],
            router_and_gate=fused[:rows],
            shared_gate_up=fused[rows:],
            router_gate_shared=fused,
        )
    if m := _fuse_rows(head):
        router_and_gate, (router, shared_gate, *_) = m
        w = replace(w, router=router, shared_gate=shared_gate, router_and_gate=router_and_gate)
    if (m := _fuse_rows((w.shared_gate_proj, w.shared_up_proj))) is None:
        return w
    fused, (gate, up) = m
    return replace(w, shared_gate_proj=gate, shared_up_proj=up, shared_gate_up=fused)
