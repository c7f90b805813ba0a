"""ModelCache: the device buffers a forward reads and writes (paged KV, per-slot DeltaNet state).

Imports torch, model.config and the KV formats of kernels/kv_quant. Buffers only: which page or
slot belongs to whom is the engine's business (allocation, refcounts, eviction live in engine/).
Buffers are zero-filled once at allocation so a gathered-but-masked page never holds NaN bit
patterns that 0 * NaN would leak.
The KV pages of a layer are a plain tensor (`kv_dtype` bf16: the model dtype) or a `QuantPages`
(int8, fp8, nvfp4, k8v4: coded values plus per-(token, head) scales); `page_tensors` lists every
page-indexed tensor, which is what page copies move.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ninfer.kernels.kv_quant import formats
from ninfer.kernels.kv_quant.formats import KvPages
from ninfer.model.config import TextConfig
from ninfer.model.errors import BatchError


@dataclass
class ModelCache:
    """Per full-attention layer KV pages and per linear-attention layer state slots.

    k_pages[i], v_pages[i]: [num_pages, page_size, Hk, D] (model dtype), i-th full-attention layer,
        or a `QuantPages` of that logical shape when `kv_dtype` quantizes; an MTP head's layers
        follow the model's (decoder layer ids `num_hidden_layers + j`), sharing the page ids: its
        KV of token t sits where the model's does, so page copies, snapshots and prefix
        checkpoints carry it without knowing it is there.
    conv_state[j]: [num_slots, conv_dim, K-1] (model dtype), the last K-1 conv inputs.
    ssm_state[j]: [num_slots, Hv, Dk, Dv] fp32, the gated delta rule state, j-th linear layer.
    """

    page_size: int
    k_pages: list[KvPages]
    v_pages: list[KvPages]
    conv_state: list[torch.Tensor]
    ssm_state: list[torch.Tensor]
    layer_index: dict[int, int]  # decoder layer id -> index into its kind's lists
    kv_dtype: str = "bf16"  # --kv-dtype: bf16 (the model dtype), int8, fp8, nvfp4 or k8v4
    # slot -> (its row in that step, one gated_deltanet.VerifyRecord per linear layer) of the
    # slot's latest speculative verify step: what a fold replays (engine/copies.py)
    verify_records: dict[int, tuple[int, list[Any]]] = field(default_factory=dict)

    @classmethod
    def allocate(
        cls,
        config: TextConfig,
        *,
        num_pages: int,
        num_slots: int,
        page_size: int = 64,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        kv_dtype: str = "bf16",
        extra_attention_layers: int = 0,
    ) -> ModelCache:
        """`extra_attention_layers`: KV for that many MTP layers beside the model's."""
        k_fmt, v_fmt = formats.kv_formats(kv_dtype)
        if num_pages <= 0 or num_slots <= 0 or page_size <= 0:
            raise ValueError(
                f"num_pages ({num_pages}), num_slots ({num_slots}) and page_size ({page_size}) "
                "must be > 0"
            )
        kv_shape = (num_pages, page_size, config.num_key_value_heads, config.head_dim)
        conv_shape = (num_slots, config.conv_dim, config.linear_conv_kernel_dim - 1)
        ssm_shape = (
            num_slots,
            config.linear_num_value_heads,
            config.linear_key_head_dim,
            config.linear_value_head_dim,
        )
        full, linear = config.full_attention_layers, config.linear_attention_layers
        mtp = range(config.num_hidden_layers, config.num_hidden_layers + extra_attention_layers)
        full = (*full, *mtp)
        layer_index = {layer: i for i, layer in enumerate(full)}
        layer_index.update({layer: j for j, layer in enumerate(linear)})
        return cls(
            page_size=page_size,
            k_pages=[formats.allocate(k_fmt, kv_shape, dtype=dtype, device=device) for _ in full],
            v_pages=[formats.allocate(v_fmt, kv_shape, dtype=dtype, device=device) for _ in full],
            conv_state=[torch.zeros(conv_shape, dtype=dtype, device=device) for _ in linear],
            ssm_state=[torch.zeros(ssm_shape, dtype=torch.float32, device=device) for _ in linear],
            layer_index=layer_index,
            kv_dtype=kv_dtype,
        )

    @staticmethod
    def bytes_per_page(
        config: TextConfig,
        page_size: int,
        dtype: torch.dtype,
        kv_dtype: str = "bf16",
        extra_attention_layers: int = 0,
    ) -> int:
        """K and V of one page over every full-attention layer (MTP layers included), scales
        included (what `--kv-capacity auto` divides free memory by and what a page costs on the
        host)."""
        per_token = formats.bytes_per_token(
            kv_dtype, config.num_key_value_heads, config.head_dim, dtype
        )
        layers = len(config.full_attention_layers) + extra_attention_layers
        return layers * page_size * per_token

    @staticmethod
    def bytes_per_slot(config: TextConfig, dtype: torch.dtype) -> int:
        """One sequence's conv state (model dtype) and fp32 delta-rule state, every linear layer."""
        item = torch.empty((), dtype=dtype).element_size()
        conv = config.conv_dim * (config.linear_conv_kernel_dim - 1) * item
        ssm = config.linear_num_value_heads * config.linear_key_head_dim
        ssm *= config.linear_value_head_dim * 4
        return len(config.linear_attention_layers) * (conv + ssm)

    @property
    def num_pages(self) -> int:
        return self.k_pages[0].shape[0] if self.k_pages else 0

    @property
    def num_slots(self) -> int:
        return self.ssm_state[0].shape[0] if self.ssm_state else 0

    def page_tensors(self) -> list[torch.Tensor]:
        """Every page-indexed KV tensor (values and scales, K and V, all layers)."""
        pages = [*self.k_pages, *self.v_pages]
        return [t for p in pages for t in formats.page_tensors(p)]

    def kv(self, layer: int) -> tuple[KvPages, KvPages]:
        """The (k_pages, v_pages) of full-attention decoder layer `layer`."""
        i = self.layer_index[layer]
        return self.k_pages[i], self.v_pages[i]

    def state(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The (conv_state, ssm_state) of linear-attention decoder layer `layer`."""
        j = self.layer_index[layer]
        return self.conv_state[j], self.ssm_state[j]

    def reset_slot(self, slot: int) -> None:
        """Zero a slot's conv and recurrent state: a new sequence starts from nothing."""
        self._check_slot(slot)
        for conv, ssm in zip(self.conv_state, self.ssm_state, strict=True):
            conv[slot].zero_()
            ssm[slot].zero_()

    def copy_slot(self, src: int, dst: int) -> None:
        """Copy a whole StateImage (all linear layers) from one slot to another."""
        self._check_slot(src)
        self._check_slot(dst)
        if src == dst:
            return
        for conv, ssm in zip(self.conv_state, self.ssm_state, strict=True):
            conv[dst].copy_(conv[src])
            ssm[dst].copy_(ssm[src])

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots:
            raise BatchError(f"state slot {slot} out of range 0..{self.num_slots - 1}")
