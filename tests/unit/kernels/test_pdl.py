"""Programmatic dependent launch (kernels/pdl.py): every kernel waits before it touches memory,
the driver structs have the driver's layout, arguments pack as CuPy packs them, and on the GPU a
chain of dependent kernels gives bit-identical results with PDL on and off, eager and in a
CUDA graph (a kernel reading its predecessor's output too early would differ)."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from ninfer.kernels import dispatch, pdl
from support.gpu_checks import capture_graph

KERNELS = Path(pdl.__file__).resolve().parent


def _kernel_bodies(source: str) -> list[tuple[str, str]]:
    """(name, body) of every `__global__` function in `source`."""
    found = []
    for match in re.finditer(r"__global__\s", source):
        depth, i = 0, match.end()
        # the parameter list is the last parenthesized group before the body's opening brace
        while source[i] != "{" or depth:
            depth += {"(": 1, ")": -1}.get(source[i], 0)
            i += 1
        name = re.findall(r"(\w+)\s*\(", source[match.end() : i])[-1]
        start, depth = i, 0
        while True:  # to the matching closing brace
            depth += {"{": 1, "}": -1}.get(source[i], 0)
            i += 1
            if depth == 0:
                break
        found.append((name, source[start + 1 : i - 1]))
    return found


def _waits_first(body: str) -> bool:
    """pdl_begin() first; or pdl_trigger() first, then only declarations, arithmetic, L2
    prefetches, the tensor-core GEMVs' weight copies (`issue_tile`) and weight loads
    (`ld_weight16`, `ld_weight_scale`: weights are never a predecessor's output) before
    pdl_wait(): no other loads or stores through pointers."""
    first = body.lstrip().split(";")[0]
    if first == "pdl_begin()":
        return True
    if first != "pdl_trigger()" or "pdl_wait();" not in body:
        return False
    before = body[: body.index("pdl_wait();")]
    touches = re.findall(r"(?:ld_\w+|__ldg|atomic\w*|\w+\s*\[[^\]]*\]\s*=[^=])", before)
    # registers being filled (accumulators, row pointers, weight scales) and the weight loads
    allowed = ("acc[", "wrow[", "wscale[", "ld_weight16", "ld_weight_scale")
    return not [t for t in touches if not t.startswith(allowed)]


def test_every_kernel_begins_with_the_dependency_wait():
    """A kernel launched with the PDL attribute but without the wait would race its
    predecessor: runtime.launch gives every kernel the attribute."""
    sources = sorted(KERNELS.glob("*/*.cu"))
    bodies = [(f.name, *body) for f in sources for body in _kernel_bodies(f.read_text())]
    assert len(bodies) >= 40
    late = [f"{f}:{name}" for f, name, body in bodies if not _waits_first(body)]
    assert late == []
    assert "griddepcontrol.wait" in (KERNELS / "common.cu").read_text()


def test_the_check_catches_a_kernel_that_reads_first():
    assert not _waits_first("  int i = 0;\n  pdl_begin();")
    assert not _waits_first("pdl_trigger(); float v = __ldg(x); pdl_wait();")
    assert not _waits_first("pdl_trigger(); out[0] = 1; pdl_wait();")
    assert _waits_first("pdl_trigger(); prefetch_l2(w + 8); pdl_wait(); out[0] = x[0];")
    assert _waits_first("pdl_trigger(); v = ld_weight16(w + 16); pdl_wait(); out[0] = x[0];")
    assert not _waits_first("pdl_trigger(); v = ld_stream16(x + 16); pdl_wait();")


def test_driver_struct_layouts():
    """CUlaunchAttribute is 72 bytes with its value at 8; CUlaunchConfig has the stream at 32."""
    assert ctypes.sizeof(pdl._Attribute) == 72
    assert pdl._Attribute.value.offset == 8
    assert pdl._Config.shared_mem.offset == 24
    assert pdl._Config.stream.offset == 32
    assert pdl._Config.attrs.offset == 40
    assert pdl._Config.num_attrs.offset == 48
    assert pdl._ATTRIBUTE.id == 6 and pdl._ATTRIBUTE.value.flag == 1
    # PDL, then the cluster scheduling policy preference (5) set to load balancing (2)
    assert ctypes.sizeof(pdl._BALANCED) == 2 * 72
    assert [(a.id, a.value.flag) for a in pdl._BALANCED] == [(6, 1), (5, 2)]


@pytest.mark.parametrize(
    ("value", "ctype", "expected"),
    [
        (np.uint64(2**63 + 5), ctypes.c_uint64, 2**63 + 5),
        (np.int64(-3), ctypes.c_int64, -3),
        (np.int32(-7), ctypes.c_int32, -7),
        (np.float32(0.25), ctypes.c_float, 0.25),
        (np.float64(1.5), ctypes.c_double, 1.5),
        (7, ctypes.c_int64, 7),
        (2.5, ctypes.c_double, 2.5),
        (True, ctypes.c_bool, True),
    ],
)
def test_arguments_pack_as_cupy_packs_them(value, ctype, expected):
    packed = pdl.param(value)
    assert type(packed) is ctype and packed.value == expected


def test_tensor_arguments_pass_their_address_and_odd_types_are_refused():
    t = torch.zeros(3)
    assert pdl.param(t).value == t.data_ptr()
    with pytest.raises(TypeError, match="float16"):
        pdl.param(np.float16(1))
    with pytest.raises(TypeError, match="str"):
        pdl.param("x")


def test_switch(monkeypatch):
    monkeypatch.setenv("NINFER_KERNELS_OFF", "silu_mul, pdl")
    assert pdl.switched_off()
    monkeypatch.setenv("NINFER_KERNELS_OFF", "silu_mul")
    assert not pdl.switched_off()


def _chain(x: torch.Tensor, weights: list[torch.Tensor], norm: torch.Tensor) -> torch.Tensor:
    """One-row GEMVs and residual norms, each reading the previous kernel's output."""
    residual = x
    for w in weights:
        h = dispatch.linear(x, w)
        x, residual = dispatch.add_rms_norm(h, residual, norm, 1e-6)
        x = dispatch.silu_mul(torch.cat([x, x], dim=-1))
    return x


@pytest.mark.gpu
def test_dependent_chain_is_bit_identical_with_and_without_pdl(gen, monkeypatch):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90")
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    assert pdl.enabled(torch.cuda.current_device())
    x = torch.randn(1, 2048, device="cuda", generator=gen).to(torch.bfloat16)
    weights = [
        (torch.randn(2048, 2048, device="cuda", generator=gen) * 0.03).to(torch.bfloat16)
        for _ in range(24)
    ]
    norm = torch.randn(2048, device="cuda", generator=gen).to(torch.bfloat16)
    monkeypatch.setenv("NINFER_KERNELS_OFF", "pdl")
    want = _chain(x, weights, norm)
    monkeypatch.delenv("NINFER_KERNELS_OFF")
    assert torch.equal(_chain(x, weights, norm), want)
    graph, out = capture_graph(lambda: _chain(x, weights, norm))
    for _ in range(5):
        out.zero_()
        graph.replay()
        assert torch.equal(out, want)


@pytest.mark.gpu
def test_load_balanced_clusters_give_the_same_bits_eager_and_in_a_graph(gen, monkeypatch):
    """`NINFER_KERNELS_ON=cluster_balance` only changes where the tensor-core GEMVs' clusters
    are placed: the fp8 ring and the bf16 tensor-core GEMV at every cluster size give the bits of
    the default placement, eagerly and replayed from a graph."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("thread-block clusters need sm_90")
    from ninfer.kernels.bf16_tc_gemv import launch as bf16_tc
    from ninfer.kernels.fp8_gemv import launch_tc as fp8_tc
    from support.gpu_checks import fp8_hard_rows, fp8_weight

    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    monkeypatch.delenv("NINFER_KERNELS_ON", raising=False)
    weight = fp8_weight(1024, 4096)
    x = fp8_hard_rows(4, 4096, gen, torch.bfloat16)
    w16 = (torch.randn(1024, 4096, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
    runs = [(lambda s=s: fp8_tc.fp8_linear(x, weight, splits=s)) for s in fp8_tc.SPLITS] + [
        (lambda s=s: bf16_tc.bf16_linear(x, w16, splits=s)) for s in bf16_tc.SPLITS
    ]
    wants = [run() for run in runs]
    monkeypatch.setenv("NINFER_KERNELS_ON", "cluster_balance")
    for run, want in zip(runs, wants, strict=True):
        assert torch.equal(run(), want)
        graph, out = capture_graph(run)
        out.zero_()
        graph.replay()
        assert torch.equal(out, want)
