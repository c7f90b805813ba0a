"""Partial multimodal RoPE (MRoPE) of Qwen3.5 full attention.

Imports only torch. Each rotary frequency reads one of three position axes (t, h, w); with
interleaving, frequency i reads h when i % 3 == 1, w when i % 3 == 2 (within their section
lengths), else t. The axis map is built once per model; text tokens carry the same position on all
three axes, so for text this reduces to plain RoPE on the first `rotary_dim` dims (rotate-half).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def rope_inv_freq(
    rotary_dim: int, theta: float, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """[rotary_dim / 2] fp32 inverse frequencies `theta^(-2i / rotary_dim)`."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=device) / rotary_dim
    return 1.0 / (theta**exponents)


def mrope_axis_map(
    mrope_section: Sequence[int], interleaved: bool, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """[rotary_dim / 2] int64: which position axis (0 t, 1 h, 2 w) drives each frequency."""
    num_freqs = sum(mrope_section)
    axis = torch.zeros(num_freqs, dtype=torch.int64)
    if interleaved:
        for a in (1, 2):
            axis[a : 3 * mrope_section[a] : 3] = a
    else:
        t, h, _ = mrope_section
        axis[t : t + h] = 1
        axis[t + h :] = 2
    return axis.to(device)


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, axis_map: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables for rotate-half RoPE.

    Args:
        positions: [T] (text; all axes equal) or [3, T] int64.
        inv_freq: [R/2] fp32; axis_map: [R/2] int64 from `mrope_axis_map`.
    Returns:
        (cos, sin), each [T, R] fp32; the two halves repeat the same R/2 angles.
    """
    pos = positions.float()
    if pos.dim() == 1:
        freqs = pos[:, None] * inv_freq[None, :]  # [T, R/2]
    else:
        all_axes = pos[:, :, None] * inv_freq[None, None, :]  # [3, T, R/2]
        index = axis_map[None, None, :].expand(1, pos.shape[1], -1)
        freqs = all_axes.gather(0, index)[0]  # [T, R/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [T, R]
    return emb.cos(), emb.sin()


class Rope:
    """`rope_cos_sin` for one model's tables in fewer launches: the frequencies (and the MRoPE
    axis map) are stored twice over, once per rotate-half half, so the angles come out [T, R]
    from one multiply of the int64 positions (cast to fp32 inside it, exactly as `.float()`),
    with no separate cast or concatenation: 3 kernels for text positions instead of 5, which a
    CUDA graph runs once per forward (four times in a speculative round). The same bits as
    `rope_cos_sin`: each element is the same single fp32 product, then cos or sin."""

    def __init__(self, inv_freq: torch.Tensor, axis_map: torch.Tensor) -> None:
        """`inv_freq`, `axis_map`: [R / 2] as `rope_inv_freq` and `mrope_axis_map` give them."""
        self.freqs = torch.cat((inv_freq, inv_freq))  # [R] fp32
        self.axes = torch.cat((axis_map, axis_map))  # [R] int64

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """See `rope_cos_sin`: positions [T] or [3, T] int64 -> (cos, sin), each [T, R] fp32."""
        if positions.dim() == 1:
            emb = positions[:, None] * self.freqs[None, :]  # [T, R]
        else:
            all_axes = positions[:, :, None] * self.freqs[None, None, :]  # [3, T, R]
            index = self.axes[None, None, :].expand(1, positions.shape[1], -1)
            emb = all_axes.gather(0, index)[0]
        return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first R dims of each head (rotate-half pairing); the rest pass through.

    Args:
        x: [T, H, D]; cos, sin: [T, R] fp32 with R <= D.
    Returns:
        [T, H, D] in x's dtype.
    """
    rotary_dim = cos.shape[-1]
    half = rotary_dim // 2
    x_rot = x[..., :rotary_dim].float()
    x1, x2 = x_rot[..., :half], x_rot[..., half:]
    rotated = torch.cat((-x2, x1), dim=-1)
    out = x_rot * cos[:, None, :] + rotated * sin[:, None, :]
    return torch.cat((out.to(x.dtype), x[..., rotary_dim:]), dim=-1)
