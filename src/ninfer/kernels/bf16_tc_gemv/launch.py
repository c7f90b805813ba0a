"""CUDA launcher of the tensor-core bf16 GEMV (`bf16_tc_gemv.cu`): 1..8 bf16 x rows against a
bf16 weight, the same results as `bf16_gemv.reference.bf16_linear` to bf16 output rounding.

Imports torch and kernels.runtime. The grid is one 128-row block per k split, the split count
planned exactly as the fp8 tensor-core GEMV's (`fp8_gemv.launch_tc.choose_splits`: a k block is
128 bytes of every row in both); the splits of a row block form a thread-block cluster (sm_90+).
Routing: `tc_preferred` (dispatch asks it before the CUDA-core GEMV and cuBLAS): the long-row
projections where it measured faster than cuBLAS.
"""

from __future__ import annotations

import torch

from ninfer.kernels import runtime as rt
from ninfer.kernels.fp8_gemv.launch_tc import MAX_ROWS, SPLITS, choose_splits, tc_operands_ok
from ninfer.kernels.fp8_gemv.tiles import attached_tiles, tiles_mismatch
from ninfer.kernels.switches import switched_off, switched_on

OP = "bf16_tc_gemv"
HEADERS = ("fp8_gemv/tc_common.cu",)  # the cluster reduction and the cp.async ring
THREADS = 256  # 8 warps x 16 weight rows = 128 rows per block
# MAX_ROWS (imported): x rows per launch, the mma's n = 8, as the fp8 kernel's
ROWS_PER_BLOCK = 128
K_PER_BLOCK = 64  # k per ring stage: 128 bytes of each weight row
STAGES = (2, 3, 4)  # ring depths compiled (16 KiB of weights each per block)
DEFAULT_STAGES = 4  # 64 KiB: three blocks per SM still fit (the launch bounds' 3)
# opt-in shallower rings for an in-model A/B (`NINFER_KERNELS_ON=tc_stages3` / `tc_stages2`): the
# H200 batch-8 profile (S36F) has this kernel at 3.37 TB/s inside the step against 3.72 per shape
# (X1); a 48 or 32 KiB ring leaves shared memory for the PDL-launched neighbours to stay resident.
# On an H100 both lose (run S37C: the 27B batch-8 step 1.003 and 1.015)
STAGE_SWITCHES = {3: "tc_stages3", 2: "tc_stages2"}
LONG_ROW_RATIO = 3  # tc_preferred: K / N from which the kernel beats cuBLAS
# tc_preferred: the fewest output rows of a K >= N projection it takes. The 27B's 6,144 -> 5,120
# projections: -0.5 to -0.7 % a step at 4 and 8 rows on the H200 (runs S36C, S36E: three A/B
# rounds each way), even on an H100 (S35G); the 35B-A3B's 4,096 -> 2,048 (16 row blocks: one
# block per SM at 8 splits) lost 1.2 % at 8 rows (S35E, H100)
SQUARE_MIN_ROWS = 4096


class Bf16TcError(rt.KernelInputError):
    """Operands the tensor-core bf16 GEMV does not take (check `supports` first)."""


def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the kernel takes these operands: 1..MAX_ROWS bf16 x rows with dense 16-byte-aligned
    rows, a contiguous 16-byte-aligned bf16 weight [N, K] with K % 8 == 0, an sm_90+ GPU."""
    if x.dim() != 2 or weight.dim() != 2 or not x.is_cuda:
        return False
    if x.dtype != torch.bfloat16 or weight.dtype != torch.bfloat16:
        return False
    return tc_operands_ok(x, weight, k_multiple=8)


def tc_preferred(num_rows: int, out_features: int, in_features: int) -> bool:
    """Whether dispatch should run this kernel for a plain bf16 projection of this shape.

    Measured (`kernel_bench --bf16-tc-shapes`, docs/perf.md run X1, H200, cold L2): the kernel
    beats cuBLAS on long rows, K >= LONG_ROW_RATIO * N (the 27B's down projection 5,120 x 17,408:
    46.7 against 50.5 µs at 4 rows, 47.9 against 51.0 at 8), where cuBLAS's split of K leaves it
    at ~3.5 TB/s; on the wide K = 5,120 projections cuBLAS wins by 20-25 %. One row keeps the
    CUDA-core GEMV (the down projection's fused SwiGLU form). `NINFER_KERNELS_OFF=bf16_tc_gemv`
    routes nothing, `NINFER_KERNELS_ON=bf16_tc_gemv` every 1..MAX_ROWS-row shape (A/B runs; run
    S32C measured every 2..8-row shape on it: the 27B batch-8 step 23.01 against 21.72 ms).
    """
    if not 1 <= num_rows <= MAX_ROWS:
        return False
    if switched_on("bf16_tc_gemv"):
        return True
    if num_rows < 2:
        return False
    if in_features >= LONG_ROW_RATIO * out_features:
        return True
    # K >= N with at least SQUARE_MIN_ROWS output rows: the 27B's out_proj / o_proj (6,144 ->
    # 5,120), which cuBLAS runs without PDL overlap (2.16 TB/s inside an H100 batch-8 step);
    # `NINFER_KERNELS_OFF=tc_square` leaves them to cuBLAS
    return (
        in_features >= out_features
        and out_features >= SQUARE_MIN_ROWS
        and not switched_off("tc_square")
    )


def planned_stages() -> int:
    """The ring depth dispatch runs: DEFAULT_STAGES unless an opt-in A/B switch names another."""
    for stages, name in STAGE_SWITCHES.items():
        if switched_on(name):
            return stages
    return DEFAULT_STAGES


def ring_bytes(stages: int) -> int:
    """Dynamic shared memory: a ring of `stages` k blocks of every row."""
    return stages * K_PER_BLOCK * 2 * ROWS_PER_BLOCK


def bf16_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    splits: int | None = None,
    stages: int | None = None,
) -> torch.Tensor:
    """x @ weight.T (see `bf16_gemv.reference.bf16_linear`); `splits` (1, 2, 4 or 8) and `stages`
    (STAGES) override the plan: tests and kernel_bench."""
    if stages is None:
        stages = planned_stages()
    device = rt.check_cuda(x, weight)
    if not supports(x, weight):
        raise Bf16TcError(
            f"tensor-core bf16 GEMV needs 1..{MAX_ROWS} dense 16-byte-aligned bf16 x rows, a "
            f"contiguous bf16 weight with K % 8 == 0 and an sm_90+ GPU; got x {tuple(x.shape)} "
            f"{x.dtype}, weight {tuple(weight.shape)} {weight.dtype}"
        )
    if stages not in STAGES:
        raise Bf16TcError(f"ring stages must be one of {STAGES}, got {stages}")
    n, k = weight.shape
    num_rows = x.shape[0]
    row_blocks = -(-n // ROWS_PER_BLOCK)
    k_blocks = -(-k // K_PER_BLOCK)
    if splits is None:
        splits = choose_splits(row_blocks, k_blocks, rt.num_sms(device))
    elif splits not in SPLITS:
        raise Bf16TcError(f"k splits must be one of {SPLITS}, got {splits}")
    # tiles attached at load (`NINFER_KERNELS_ON=bf16_tiles`) unless switched off at launch
    tiles = attached_tiles(weight)
    if tiles is not None and switched_off("bf16_tiles"):
        tiles = None
    if tiles is not None and (why := tiles_mismatch(tiles, n, 2 * k)):
        raise Bf16TcError(why)
    out = torch.empty((num_rows, n), dtype=x.dtype, device=device)
    args = (rt.ptr(out), rt.ptr(x), rt.i64(x.stride(0)), rt.ptr(weight if tiles is None else tiles))
    args += (rt.i32(n), rt.i32(k), rt.i32(k_blocks))
    packed = "false" if tiles is None else "true"
    instance = f"bf16_tc_gemv<{num_rows}, {splits}, {stages}, {packed}>"
    shared = ring_bytes(stages)
    rt.allow_shared(OP, instance, rt.device_index(device), shared, HEADERS)
    kernel = rt.get_kernel(OP, instance, device, HEADERS)
    grid = (row_blocks * splits,)
    rt.launch(kernel, grid, (THREADS,), args, device, shared_mem=shared, clustered=splits > 1)
    return out
