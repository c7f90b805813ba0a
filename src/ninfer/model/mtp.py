"""MtpHead: the Qwen3.5 multi-token-prediction head (`mtp.*` weights) over a bound target model.

Imports model.* only. As the reference implementations define it (vLLM's Qwen3.5 MTP model): the
embedding of the next token and the target's final-normed hidden state are each (1+w)-RMS-normed,
concatenated in that order (embedding first), projected by `fc` [H, 2H], passed through one
decoder layer of the target's full-attention kind (gated attention with its own KV, dense MLP or
MoE), and (1+w)-normed; the target's embedding and lm_head are shared. A row (hidden of token p,
id of token p+1) sits at position p and predicts token p+2; its output hidden is fed back, with
the id it drafted, for the next draft. Its KV lives in the same ModelCache as extra attention
layers (decoder layer id `num_hidden_layers`), at the same page ids as the target's.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ninfer.kernels import dispatch
from ninfer.model.batch import ForwardBatch
from ninfer.model.cache import ModelCache
from ninfer.model.errors import WeightError
from ninfer.model.layers.gated_attention import (
    AttentionWeights,
    build_attention_metadata,
    gated_attention,
)
from ninfer.model.layers.mlp import MlpWeights, mlp
from ninfer.model.layers.moe import MoeWeights, sparse_moe
from ninfer.model.qwen3_5 import (
    Qwen3_5Model,
    _bind_attention,
    _bind_mlp,
    _bind_moe,
    _Binder,
    _fused,
    _tiled,
)

NUM_LAYERS = 1  # every published Qwen3.5 / 3.6 checkpoint has one MTP layer


class MtpHead:
    """One-layer MTP head bound to `target` (shares its embedding, lm_head and rope tables)."""

    def __init__(
        self,
        target: Qwen3_5Model,
        weights: Mapping[str, torch.Tensor],
        *,
        strict: bool = True,
    ) -> None:
        """Bind `weights` (names relative to the `mtp.` prefix: `fc.weight`, `layers.0....`)."""
        self.target = target
        c = self.config = target.config
        h = c.hidden_size
        # its layer bound as the target binds a layer of its own: fp8 projections kept in fp8
        # and projections that read the same input fused, where the target does so. Why: the
        # head runs three times a round; dequantized and unfused it read twice the bytes of an
        # fp8 checkpoint's head and ran separate q/k/v, gate/up and router GEMVs.
        take = _Binder(weights, target.dtype, target.device, keep_fp8=target.fp8_weights)
        self.fc = take("fc.weight", (h, 2 * h))
        self.pre_fc_norm_embedding = take("pre_fc_norm_embedding.weight", (h,))
        self.pre_fc_norm_hidden = take("pre_fc_norm_hidden.weight", (h,))
        p = "layers.0."
        self.input_layernorm = take(p + "input_layernorm.weight", (h,))
        self.post_attention_layernorm = take(p + "post_attention_layernorm.weight", (h,))
        self.attention: AttentionWeights = _bind_attention(take, p + "self_attn.", c)
        self.ffn: MlpWeights | MoeWeights = (
            _bind_moe(take, p + "mlp.", c) if c.is_moe else _bind_mlp(take, p + "mlp.", c)
        )
        if target.fuse_projections:
            self.attention = _tiled(_fused(self.attention), target.decode_tiles)
            self.ffn = _tiled(_fused(self.ffn), target.decode_tiles)
        self.norm = take("norm.weight", (h,))
        if strict and (unused := sorted(set(weights) - take.used)):
            raise WeightError(f"{len(unused)} unexpected MTP weight(s), first '{unused[0]}'")
        self.layer_id = c.num_hidden_layers  # its KV: ModelCache extra attention layer 0

    @property
    def device(self) -> torch.device:
        return self.target.device

    @torch.no_grad()
    def forward_hidden(
        self, batch: ForwardBatch, cache: ModelCache, hidden: torch.Tensor
    ) -> torch.Tensor:
        """One MTP pass: `batch.input_ids` are the next tokens, `hidden` [T, H] the matching
        final-normed hidden states (the target's, or the head's own output when drafting on);
        writes the head's KV at the batch's positions. Returns its final-normed hidden [T, H]."""
        c, eps = self.config, self.config.rms_norm_eps
        x = dispatch.mtp_front(
            batch.input_ids,
            self.target.embed_tokens,
            hidden,
            self.pre_fc_norm_embedding,
            self.pre_fc_norm_hidden,
            eps,
        )  # [T, 2H]: the normed embedding, then the normed hidden
        x = dispatch.linear(x, self.fc)  # [T, H], the layer's residual stream
        cos, sin = batch.rope_angles or self.target.rope.cos_sin(batch.positions)
        meta = build_attention_metadata(batch, cache.page_size)
        k_pages, v_pages = cache.kv(self.layer_id)
        h = dispatch.rms_norm(x, self.input_layernorm, eps)
        h = gated_attention(
            h,
            self.attention,
            cos=cos,
            sin=sin,
            k_pages=k_pages,
            v_pages=v_pages,
            meta=meta,
            eps=eps,
        )
        h, x = dispatch.add_rms_norm(h, x, self.post_attention_layernorm, eps)
        if isinstance(self.ffn, MoeWeights):
            h = sparse_moe(
                h, self.ffn, top_k=c.num_experts_per_tok, norm_topk_prob=c.norm_topk_prob
            )
        else:
            h = mlp(h, self.ffn)
        return dispatch.add_rms_norm(h, x, self.norm, eps)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, H] -> [N, vocab] fp32 through the target's shared lm_head."""
        return self.target.compute_logits(hidden)
