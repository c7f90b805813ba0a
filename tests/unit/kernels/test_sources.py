"""Checks on the kernel sources that NVRTC would only report on a GPU machine.

Every op is compiled as common.cu + its headers + its own source in one translation unit, so a
device function an op defines under a name common.cu already defines fails that op's compile
(this happened with `prefetch_l2`, which only the paged attention had defined before).
"""

from __future__ import annotations

import re
from pathlib import Path

from ninfer.kernels import runtime

DEFINITION = re.compile(r"^__device__[^;{(]*?\b(\w+)\s*\(", re.M)


def _defined(path: Path) -> set[str]:
    return set(DEFINITION.findall(path.read_text()))


def test_no_op_redefines_a_common_device_function():
    common = _defined(runtime.KERNEL_DIR / "common.cu")
    assert {"pdl_begin", "prefetch_l2", "to_float"} <= common
    clashes = {
        f.relative_to(runtime.KERNEL_DIR).as_posix(): sorted(_defined(f) & common)
        for f in sorted(runtime.KERNEL_DIR.glob("*/*.cu"))
    }
    assert {f: names for f, names in clashes.items() if names} == {}


def test_the_pattern_sees_a_clash():
    assert DEFINITION.findall("__device__ __forceinline__ void prefetch_l2(const void* p) {") == [
        "prefetch_l2"
    ]
