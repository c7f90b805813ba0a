"""Tile-major copies of decode weights for the tensor-core GEMVs' weight rings.

Imports torch only. The ring kernels (`fp8_tc_gemv_ring`, tc_common.cu) copy a weight k block at
a time: 128 bytes of each of a 128-row block's rows, rows K bytes apart in the row-major matrix.
A packed weight holds each (row block, k block) as one contiguous 16 KiB tile in the order the
ring slot itself uses (piece j of thread tid at [j][tid]; thread tid = 32 w + 4 g + t holds bytes
[16 t, 16 t + 16) and [64 + 16 t, 80 + 16 t) of rows 16 w + g and 16 w + g + 8 of the block), the
k blocks of a row block consecutive: a warp's copy reads 512 consecutive bytes and a thread block
streams one contiguous run, which DRAM serves with fewer row activations than 128-byte pieces of
rows K bytes apart. Rows past N and bytes past K are zeros, so the kernel checks nothing.

fp8 weights carry their tiles in `Fp8Weight.tiles`; a plain bf16 weight (a torch.Tensor the
model passes around as is) carries them as an attribute of that tensor object (`attach_tiles`),
which lives and dies with it: views and copies of it have none.
"""

from __future__ import annotations

import torch

ROWS = 128  # rows of a tile (the ring kernels' row block)
ROW_BYTES = 128  # bytes of each row in a tile (one k block)
THREADS = 256  # the ring kernels' block: 8 warps


def _lane_map(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(row in the tile, 16-byte piece of that row) of every [j][tid] slot of a tile."""
    tid = torch.arange(THREADS, device=device)
    j = torch.arange(4, device=device)
    warp, lane = tid // 32, tid % 32
    g, t = lane // 4, lane % 4
    row = (warp * 16 + g)[None, :] + 8 * (j[:, None] >= 2).long()
    piece = t[None, :] + 4 * (j[:, None] % 2)
    return row, piece


def pack_tiles(weight: torch.Tensor) -> torch.Tensor:
    """The tiles of a [N, K]-element weight of 1- or 2-byte elements, as uint8
    [ceil(N / 128), ceil(K bytes / 128), 4, 256, 16] (row blocks, k blocks, ring slot)."""
    if weight.dim() != 2:
        raise ValueError(f"pack_tiles takes a 2-D weight, got {tuple(weight.shape)}")
    raw = weight.contiguous().view(torch.uint8)  # [N, K bytes]
    n, nbytes = raw.shape
    row_blocks, k_blocks = -(-n // ROWS), -(-nbytes // ROW_BYTES)
    pad_rows, pad_bytes = row_blocks * ROWS - n, k_blocks * ROW_BYTES - nbytes
    if pad_rows or pad_bytes:
        raw = torch.nn.functional.pad(raw, (0, pad_bytes, 0, pad_rows))
    blocks = raw.view(row_blocks, ROWS, k_blocks, 8, 16).permute(0, 2, 1, 3, 4)
    row, piece = _lane_map(raw.device)
    return blocks[:, :, row, piece].contiguous()


def tiles_match(tiles: torch.Tensor, n: int, nbytes: int) -> bool:
    """Whether `tiles` is a dense packing of a weight of `n` rows of `nbytes` bytes (a row-block
    slice of one is), 16-byte aligned: what the ring kernels read."""
    return (
        tiles.dtype == torch.uint8
        and tuple(tiles.shape) == (-(-n // ROWS), -(-nbytes // ROW_BYTES), 4, THREADS, 16)
        and tiles.is_contiguous()
        and tiles.data_ptr() % 16 == 0
    )


def tiles_mismatch(tiles: torch.Tensor, n: int, nbytes: int) -> str | None:
    """Why `tiles` cannot stand for a weight of `n` rows of `nbytes` bytes (`tiles_match`),
    as both ring launchers word it; None where it can."""
    if tiles_match(tiles, n, nbytes):
        return None
    return (
        f"the weight's tiles {tuple(tiles.shape)} {tiles.dtype} are not a dense packing of its "
        f"{n} x {nbytes} bytes (fp8_gemv.tiles.pack_tiles)"
    )


_ATTRIBUTE = "_ninfer_tiles"


def attach_tiles(weight: torch.Tensor) -> None:
    """Pack `weight` (a plain 2-D tensor) and keep the tiles on the tensor object itself."""
    setattr(weight, _ATTRIBUTE, pack_tiles(weight))


def attached_tiles(weight: torch.Tensor) -> torch.Tensor | None:
    """The tiles `attach_tiles` kept on this very tensor object, else None."""
    return getattr(weight, _ATTRIBUTE, None)


def unpack_tiles(tiles: torch.Tensor, n: int, nbytes: int) -> torch.Tensor:
    """The row-major uint8 [n, nbytes] a `pack_tiles` result came from (tests)."""
    row_blocks, k_blocks = tiles.shape[:2]
    row, piece = _lane_map(tiles.device)
    blocks = tiles.new_zeros((row_blocks, k_blocks, ROWS, 8, 16))
    blocks[:, :, row, piece] = tiles
    raw = blocks.permute(0, 2, 1, 3, 4).reshape(row_blocks * ROWS, k_blocks * ROW_BYTES)
    return raw[:n, :nbytes]
