"""The kernels' CUDA sources as text, for CPU tests that check a launcher against them."""

from __future__ import annotations

from ninfer.kernels import runtime as rt


def parameter_count(op_dir: str, kernel: str) -> int:
    """Parameters of `kernel`'s __global__ definition in kernels/<op_dir>/<op_dir>.cu (its
    parenthesised list): what a mocked launch's argument tuple must match."""
    source = (rt.KERNEL_DIR / op_dir / f"{op_dir}.cu").read_text()
    start = source.index("(", source.index(f" {kernel}("))
    depth, i = 0, start
    while True:
        depth += {"(": 1, ")": -1}.get(source[i], 0)
        i += 1
        if depth == 0:
            return source[start:i].count(",") + 1
