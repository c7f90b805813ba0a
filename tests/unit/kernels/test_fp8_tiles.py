"""The decode GEMV's tile-major weights (fp8_gemv/tiles.py), checked on the CPU.

The ring kernels copy k block kb of row block rb as thread tid's four 16-byte pieces (tc_common.cu
`issue_tile`: rows 16w + g and 16w + g + 8, bytes 16t and 64 + 16t of the block, tid = 32w +
4g + t) into ring slot [j][tid]; `issue_packed` copies tile (rb, kb) piece by piece into the same
slots. So tile (rb, kb), piece [j][tid] must hold exactly the bytes issue_tile would have copied,
zeros where it zero-fills (rows past N, bytes past K). Written here from that rule, not from
pack_tiles.
"""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels.fp8_gemv.reference import Fp8Weight
from ninfer.kernels.fp8_gemv.tiles import (
    attach_tiles,
    attached_tiles,
    pack_tiles,
    tiles_match,
    tiles_mismatch,
    unpack_tiles,
)
from ninfer.model.qwen3_5 import _tiled


def _issue_tile_bytes(raw: torch.Tensor, rb: int, kb: int, j: int, tid: int) -> torch.Tensor:
    n, nbytes = raw.shape
    warp, lane = divmod(tid, 32)
    g, t = divmod(lane, 4)
    row = rb * 128 + warp * 16 + g + (8 if j >= 2 else 0)
    off = kb * 128 + 16 * t + (64 if j % 2 else 0)
    if row >= n or off >= nbytes:
        return torch.zeros(16, dtype=torch.uint8)
    return raw[row, off : off + 16]


SHAPES = [(256, 384, torch.uint8), (300, 272, torch.uint8), (130, 40, torch.bfloat16)]


@pytest.mark.parametrize("n,k,dtype", [*SHAPES, (48, 64, torch.uint8)])
def test_every_piece_holds_what_the_row_major_copy_reads(n: int, k: int, dtype) -> None:
    gen = torch.Generator().manual_seed(n * 1000 + k)
    if dtype == torch.uint8:
        w = torch.randint(0, 256, (n, k), generator=gen, dtype=torch.uint8)
    else:
        w = torch.randn(n, k, generator=gen).to(dtype)
    tiles = pack_tiles(w)
    raw = w.view(torch.uint8)
    rbs, kbs = -(-n // 128), -(-raw.shape[1] // 128)
    assert tuple(tiles.shape) == (rbs, kbs, 4, 256, 16)
    assert tiles_match(tiles, n, raw.shape[1])
    for rb in range(rbs):
        for kb in range(kbs):
            for j in range(4):
                for tid in range(0, 256, 7):
                    want = _issue_tile_bytes(raw, rb, kb, j, tid)
                    assert torch.equal(tiles[rb, kb, j, tid], want), (rb, kb, j, tid)
    assert torch.equal(unpack_tiles(tiles, n, raw.shape[1]), raw)


def test_tile_rows_follow_row_views_and_mismatches_are_named() -> None:
    w = torch.randint(0, 256, (512, 256), dtype=torch.uint8)
    weight = Fp8Weight(w.view(torch.float8_e4m3fn), torch.ones(4, 2), pack_tiles(w))
    view = weight.rows(256, 400)  # a part ending inside a row block keeps that whole block
    assert view.tiles is not None and view.tiles.shape[0] == 2
    assert torch.equal(view.tiles, pack_tiles(w[256:512]))
    assert tiles_match(view.tiles, 144, 256)
    assert not tiles_match(view.tiles, 400, 256)  # three row blocks' worth of rows
    assert tiles_mismatch(view.tiles, 144, 256) is None
    assert "not a dense packing of its 400 x 256 bytes" in tiles_mismatch(view.tiles, 400, 256)
    assert not tiles_match(pack_tiles(w).float(), 512, 256)
    with pytest.raises(ValueError, match="2-D"):
        pack_tiles(w[0])


def test_tiles_are_opt_in_and_gpu_only(monkeypatch) -> None:
    """`_tiled` binds tiles only under NINFER_KERNELS_ON=fp8_tiles and only on CUDA weights: on
    the CPU (the twin reads rows) the weights come back untouched, switch or not."""
    from ninfer.model.layers.mlp import MlpWeights

    fp8 = Fp8Weight(torch.zeros(256, 128, dtype=torch.float8_e4m3fn), torch.ones(2, 1))
    mlp = MlpWeights(gate_proj=fp8, up_proj=fp8, down_proj=fp8)
    monkeypatch.delenv("NINFER_KERNELS_ON", raising=False)
    assert _tiled(mlp) is mlp
    monkeypatch.setenv("NINFER_KERNELS_ON", "fp8_tiles")
    assert _tiled(mlp) is mlp  # CPU tensors: nothing packed


def test_plain_tiles_live_on_the_tensor_object(monkeypatch) -> None:
    w = torch.randn(256, 200).to(torch.bfloat16)
    assert attached_tiles(w) is None
    attach_tiles(w)
    assert torch.equal(attached_tiles(w), pack_tiles(w))
    assert attached_tiles(w.clone()) is None and attached_tiles(w[:128]) is None
    from ninfer.model.layers.mlp import MlpWeights

    down = torch.zeros(128, 512, dtype=torch.bfloat16)  # K >= 3N: the tensor-core GEMV's shape
    monkeypatch.setenv("NINFER_KERNELS_ON", "bf16_tiles")
    _tiled(MlpWeights(gate_proj=down, up_proj=down, down_proj=down))
    assert attached_tiles(down) is None  # CPU tensors: nothing packed


def test_long_k_rule_covers_the_27b_long_rows_only(monkeypatch) -> None:
    from ninfer.kernels.fp8_gemv.launch_tc import LONG_K_TILES, tiles_wanted

    assert 5120 < LONG_K_TILES <= 6144  # out_proj / o_proj (6,144) and down (17,408), not K = 5,120
    monkeypatch.delenv("NINFER_KERNELS_ON", raising=False)
    assert tiles_wanted(5120) and tiles_wanted(17408)
    monkeypatch.setenv("NINFER_KERNELS_ON", "fp8_tiles,long_k_tiles")
    assert not tiles_wanted(5120) and tiles_wanted(6144) and tiles_wanted(17408)


def test_tiles_bytes_counts_each_bound_tile_storage_once() -> None:
    """The startup log's decode-tiles cost: fp8 tiles and attached bf16 tiles, a storage shared
    by two fields counted once, weights without tiles nothing."""
    from dataclasses import replace

    from ninfer.model.layers.mlp import MlpWeights
    from ninfer.model.qwen3_5 import tiles_bytes

    fp8 = Fp8Weight(torch.zeros(256, 128, dtype=torch.float8_e4m3fn), torch.ones(2, 1))
    plain = MlpWeights(gate_proj=fp8, up_proj=fp8, down_proj=torch.zeros(128, 512).bfloat16())
    assert tiles_bytes([plain]) == 0
    tiled = replace(fp8, tiles=pack_tiles(fp8.weight))
    down = torch.zeros(200, 512, dtype=torch.bfloat16)
    attach_tiles(down)
    parts = [MlpWeights(gate_proj=tiled, up_proj=tiled, down_proj=down)]
    want = tiled.tiles.nbytes + attached_tiles(down).nbytes
    assert want == 2 * 1 * 16384 + 2 * 8 * 16384  # fp8: 2 row blocks x 1 k block; bf16: 2 x 8
    assert tiles_bytes(parts) == want
    assert tiles_bytes([*parts, plain]) == want
