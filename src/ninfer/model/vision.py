"""The Qwen3.5 vision tower over bound weights: patches -> merged tokens for the text model.

Imports torch and model.errors only. As transformers' `qwen3_5` vision model defines it: a
linear patch embedding (the stride = kernel Conv3d), the learned square position table resampled
bilinearly (align-corners) to each grid, LayerNorm blocks with full 2-D rotary self-attention
(theta 1e4, rows then columns) inside each frame, a GELU-tanh MLP, and the 2x2 patch merger
(LayerNorm, GELU-exact MLP). Qwen3.5 has no deepstack injections: the merged tokens replace the
pad embeddings and nothing else reaches the text layers. Items are encoded together; only
attention runs per item (all frames of one item in one batched call).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ninfer.model.errors import WeightError

_ACTIVATIONS = {
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "silu": F.silu,
}
LAYER_NORM_EPS = 1e-6


@dataclass(frozen=True)
class VisionConfig:
    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    out_hidden_size: int
    num_position_embeddings: int
    in_channels: int = 3
    rope_theta: float = 10000.0
    hidden_act: str = "gelu_pytorch_tanh"

    @classmethod
    def from_dict(cls, v: Mapping[str, Any]) -> VisionConfig:
        """From an artifact's `config.vision` (the converter made every field explicit)."""
        rope = v.get("rope_parameters") or {}
        act = str(v.get("hidden_act", "gelu_pytorch_tanh"))
        if act not in _ACTIVATIONS:
            raise WeightError(f"vision hidden_act {act!r} is not supported")
        return cls(
            depth=int(v["depth"]),
            hidden_size=int(v["hidden_size"]),
            num_heads=int(v["num_heads"]),
            intermediate_size=int(v["intermediate_size"]),
            patch_size=int(v["patch_size"]),
            temporal_patch_size=int(v["temporal_patch_size"]),
            spatial_merge_size=int(v["spatial_merge_size"]),
            out_hidden_size=int(v["out_hidden_size"]),
            num_position_embeddings=int(v.get("num_position_embeddings", 2304)),
            in_channels=int(v.get("in_channels", 3)),
            rope_theta=float(v.get("rope_theta", rope.get("rope_theta", 10000.0))),
            hidden_act=act,
        )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size**2


@dataclass(frozen=True)
class _Block:
    norm1: tuple[torch.Tensor, torch.Tensor]
    norm2: tuple[torch.Tensor, torch.Tensor]
    qkv: tuple[torch.Tensor, torch.Tensor]
    proj: tuple[torch.Tensor, torch.Tensor]
    fc1: tuple[torch.Tensor, torch.Tensor]
    fc2: tuple[torch.Tensor, torch.Tensor]


class VisionTower:
    """Bound vision weights (names after `model.visual.`, as the artifact's `vision.` component)."""

    def __init__(
        self,
        config: VisionConfig,
        weights: Mapping[str, torch.Tensor],
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        self.config = c = config
        self.dtype = dtype
        self.device = torch.device(device)
        used: set[str] = set()

        def take(name: str, shape: tuple[int, ...]) -> torch.Tensor:
            if name not in weights:
                raise WeightError(f"missing vision weight '{name}'")
            t = weights[name]
            if tuple(t.shape) != shape:
                raise WeightError(
                    f"vision weight '{name}' has shape {list(t.shape)}, expected {list(shape)}"
                )
            used.add(name)
            return t.detach().to(device=self.device, dtype=dtype)

        def linear(name: str, out_f: int, in_f: int) -> tuple[torch.Tensor, torch.Tensor]:
            return take(f"{name}.weight", (out_f, in_f)), take(f"{name}.bias", (out_f,))

        def norm(name: str, size: int) -> tuple[torch.Tensor, torch.Tensor]:
            return take(f"{name}.weight", (size,)), take(f"{name}.bias", (size,))

        h, i = c.hidden_size, c.intermediate_size
        conv = take(
            "patch_embed.proj.weight",
            (h, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size),
        )
        self.patch_embed = (conv.reshape(h, c.patch_dim), take("patch_embed.proj.bias", (h,)))
        self.pos_embed = take("pos_embed.weight", (c.num_position_embeddings, h))
        self.blocks = [
            _Block(
                norm1=norm(f"blocks.{k}.norm1", h),
                norm2=norm(f"blocks.{k}.norm2", h),
                qkv=linear(f"blocks.{k}.attn.qkv", 3 * h, h),
                proj=linear(f"blocks.{k}.attn.proj", h, h),
                fc1=linear(f"blocks.{k}.mlp.linear_fc1", i, h),
                fc2=linear(f"blocks.{k}.mlp.linear_fc2", h, i),
            )
            for k in range(c.depth)
        ]
        merged = h * c.merge_unit
        self.merger_norm = norm("merger.norm", h)
        self.merger_fc1 = linear("merger.linear_fc1", merged, merged)
        self.merger_fc2 = linear("merger.linear_fc2", c.out_hidden_size, merged)
        if unused := sorted(set(weights) - used):
            raise WeightError(f"{len(unused)} unexpected vision weight(s), first '{unused[0]}'")
        side = math.isqrt(c.num_position_embeddings)
        if side * side != c.num_position_embeddings:
            raise WeightError("vision num_position_embeddings must be a perfect square")
        self.grid_side = side
        half = c.head_dim // 2
        exponents = torch.arange(0, half, 2, dtype=torch.float32, device=self.device) / half
        self.inv_freq = 1.0 / (c.rope_theta**exponents)  # [head_dim / 4]
        self._act = _ACTIVATIONS[c.hidden_act]

    # -- per-grid tables ------------------------------------------------------------------------
    def _block_order(self, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Row and column of each patch of an h x w frame, in merge-block order."""
        m = self.config.spatial_merge_size
        rows = torch.arange(h, device=self.device).view(h // m, m, 1, 1).expand(-1, -1, w // m, m)
        cols = torch.arange(w, device=self.device).view(1, 1, w // m, m).expand(h // m, m, -1, -1)
        return rows.transpose(1, 2).reshape(-1), cols.transpose(1, 2).reshape(-1)

    def position_embeddings(self, h: int, w: int) -> torch.Tensor:
        """[h*w, hidden] learned positions resampled bilinearly (align corners) to the grid."""
        rows, cols = self._block_order(h, w)
        side = self.grid_side

        def taps(index: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
            src = index.float() * (side - 1) / max(size - 1, 1)
            lo = src.floor()
            frac = src - lo
            lo = lo.long().clamp(0, side - 1)
            return torch.stack([lo, (lo + 1).clamp(max=side - 1)], 1), torch.stack(
                [1 - frac, frac], 1
            )

        row_idx, row_w = taps(rows, h)
        col_idx, col_w = taps(cols, w)
        index = (row_idx[:, :, None] * side + col_idx[:, None, :]).reshape(-1, 4)
        weight = (row_w[:, :, None] * col_w[:, None, :]).reshape(-1, 4)
        return (self.pos_embed[index].float() * weight[:, :, None]).sum(1).to(self.dtype)

    def rotary(self, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [h*w, head_dim] fp32: the first quarter-dims rotate by row, the next by
        column, and the two halves repeat (rotate-half pairing over the whole head)."""
        rows, cols = self._block_order(h, w)
        freqs = torch.cat([rows[:, None] * self.inv_freq, cols[:, None] * self.inv_freq], dim=-1)
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos(), emb.sin()

    # -- forward --------------------------------------------------------------------------------
    @torch.no_grad()
    def encode(
        self, patches: Sequence[torch.Tensor], grids: Sequence[tuple[int, int, int]]
    ) -> list[torch.Tensor]:
        """Each item's patches [t*h*w, patch_dim] -> its merged tokens [t*h*w / m^2, out]."""
        c = self.config
        if len(patches) != len(grids):
            raise ValueError("one grid per item")
        counts = [t * h * w for t, h, w in grids]
        for p, n in zip(patches, counts, strict=True):
            if tuple(p.shape) != (n, c.patch_dim):
                raise ValueError(f"patches {tuple(p.shape)} do not match a grid of {n} patches")
        x = torch.cat([p.to(device=self.device, dtype=self.dtype) for p in patches])
        x = F.linear(x, *self.patch_embed)
        pos, cos, sin = [], [], []
        for t, h, w in grids:
            pos.append(self.position_embeddings(h, w).repeat(t, 1))
            c_, s_ = self.rotary(h, w)
            cos.append(c_.repeat(t, 1))
            sin.append(s_.repeat(t, 1))
        x = x + torch.cat(pos)
        cos_all, sin_all = torch.cat(cos)[:, None, :], torch.cat(sin)[:, None, :]
        for block in self.blocks:
            x = x + self._attention(
                F.layer_norm(x, (c.hidden_size,), *block.norm1, LAYER_NORM_EPS),
                block,
                cos_all,
                sin_all,
                grids,
            )
            hidden = F.layer_norm(x, (c.hidden_size,), *block.norm2, LAYER_NORM_EPS)
            x = x + F.linear(self._act(F.linear(hidden, *block.fc1)), *block.fc2)
        x = F.layer_norm(x, (c.hidden_size,), *self.merger_norm, LAYER_NORM_EPS)
        x = x.reshape(-1, c.hidden_size * c.merge_unit)
        x = F.linear(F.gelu(F.linear(x, *self.merger_fc1)), *self.merger_fc2)
        return list(x.split([n // c.merge_unit for n in counts]))

    def _attention(
        self,
        x: torch.Tensor,
        block: _Block,
        cos: torch.Tensor,
        sin: torch.Tensor,
        grids: Sequence[tuple[int, int, int]],
    ) -> torch.Tensor:
        c = self.config
        n = x.shape[0]
        q, k, v = F.linear(x, *block.qkv).view(n, 3, c.num_heads, c.head_dim).unbind(1)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        out = []
        start = 0
        for t, h, w in grids:  # attention stays inside each frame: batch the frames of an item
            end = start + t * h * w
            shape = (t, h * w, c.num_heads, c.head_dim)
            qf, kf, vf = (z[start:end].view(shape).transpose(1, 2) for z in (q, k, v))
            o = F.scaled_dot_product_attention(qf, kf, vf)
            out.append(o.transpose(1, 2).reshape(t * h * w, c.hidden_size))
            start = end
        return F.linear(torch.cat(out), *block.proj)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE over the whole head, computed in fp32."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    return (xf * cos + torch.cat((-x2, x1), dim=-1) * sin).to(x.dtype)
