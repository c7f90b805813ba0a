"""q/k norm + RoPE with the step's KV store in one launch (`qk_norm_rope_store`, on by default,
`NINFER_KERNELS_OFF=qk_rope_store` off): operand checks and routing on the CPU, the kernel against
the separate ops on the GPU (the same bits: the same rounding, then plain copies)."""

from __future__ import annotations

import pytest
import torch
from tests.support.kernel_sources import parameter_count

from ninfer.kernels import dispatch
from ninfer.kernels.kv_quant import formats as kvf
from ninfer.kernels.kv_quant import reference as kv_ref
from ninfer.kernels.qk_norm_rope import launch as qk_cuda
from ninfer.kernels.qk_norm_rope import reference as qk_ref
from support.gpu_checks import capture_graph


def _operands(tokens: int, hq: int, hk: int, d: int, rotary: int, dtype: torch.dtype,
              device: str, gen: torch.Generator | None = None) -> tuple:  # fmt: skip
    """The model's views into one fused projection (q every other D-slice of q+gate, then k,
    v), norm weights, cos/sin, 8-token pages with stale data, and shuffled distinct slots."""
    width = hq * 2 * d + 2 * hk * d
    proj = torch.randn(tokens, width, device=device, generator=gen).to(dtype)
    q = proj[:, : hq * 2 * d].view(tokens, hq, 2, d)[:, :, 0]
    k = proj[:, hq * 2 * d : hq * 2 * d + hk * d].view(tokens, hk, d)
    v = proj[:, hq * 2 * d + hk * d :].view(tokens, hk, d)
    qw = (torch.randn(d, device=device, generator=gen) * 0.1).to(dtype)
    kw = (torch.randn(d, device=device, generator=gen) * 0.1).to(dtype)
    angles = torch.rand(tokens, rotary // 2, device=device, generator=gen) * 1000
    angles = torch.cat((angles, angles), dim=-1)
    num_pages, page = -(-tokens // 8) + 2, 8
    k_pages = torch.randn(num_pages, page, hk, d, device=device, generator=gen).to(dtype)
    v_pages = torch.randn(num_pages, page, hk, d, device=device, generator=gen).to(dtype)
    slots = torch.randperm(num_pages * page, device=device, generator=gen)[:tokens]
    return q, k, v, qw, kw, angles.cos(), angles.sin(), 1e-6, k_pages, v_pages, slots


def test_store_problem_takes_the_model_operands_and_names_what_it_refuses() -> None:
    ops = _operands(3, 24, 4, 256, 64, torch.bfloat16, "cpu")
    q, k, v, _, _, cos, _, _, k_pages, v_pages, slots = ops
    assert qk_cuda.store_problem(q, k, v, cos, k_pages, v_pages, slots) is None
    assert "warp kernel" in qk_cuda.store_problem(q[..., :96], k[..., :96], v[..., :96],
                                                  cos[:, :32], k_pages, v_pages, slots)  # fmt: skip
    assert "does not match k" in qk_cuda.store_problem(q, k, v[:, :2], cos, k_pages, v_pages,
                                                        slots)  # fmt: skip
    assert "v pages" in qk_cuda.store_problem(q, k, v, cos, k_pages, v_pages.float(), slots)
    assert "k pages" in qk_cuda.store_problem(q, k, v, cos, k_pages[:, :, :2], v_pages, slots)
    assert "slot_mapping" in qk_cuda.store_problem(q, k, v, cos, k_pages, v_pages, slots.int())
    assert "slot_mapping" in qk_cuda.store_problem(q, k, v, cos, k_pages, v_pages, slots[:2])
    # quantized pages keep store_kv's kernels (dispatch routes on this answer alone)
    fp8 = kvf.QuantPages(kvf.FP8, *kv_ref.quantize(k_pages, kvf.FP8))
    assert "k pages" in qk_cuda.store_problem(q, k, v, cos, fp8, v_pages, slots)
    assert "v pages" in qk_cuda.store_problem(q, k, v, cos, k_pages, fp8, slots)


def test_twin_is_the_separate_norm_rope_and_store() -> None:
    """The twin writes what `qk_norm_rope` then the plain-page `store_kv` of both K and V write."""
    ops = _operands(5, 4, 2, 64, 16, torch.float32, "cpu")
    q, k, v, qw, kw, cos, sin, eps, k_pages, v_pages, slots = ops
    before = k_pages.clone()
    k_want, v_want = k_pages.clone(), v_pages.clone()
    q_want, k_rows = qk_ref.qk_norm_rope(q, k, qw, kw, cos, sin, eps)
    kv_ref.store_kv(k_rows, k_want, slots)
    kv_ref.store_kv(v, v_want, slots)
    got_q, got_k = qk_ref.qk_norm_rope_store(*ops)
    assert torch.equal(got_q, q_want) and torch.equal(got_k, k_rows)
    assert torch.equal(k_pages, k_want) and torch.equal(v_pages, v_want)
    written = torch.zeros(k_pages.shape[0] * k_pages.shape[1], dtype=torch.bool)
    written[slots] = True
    flat, old = k_pages.flatten(0, 1), before.flatten(0, 1)
    assert torch.equal(flat[~written], old[~written])  # only the step's slots change
    assert torch.equal(flat[slots], k_rows) and not torch.equal(flat[written], old[written])


@pytest.mark.parametrize(("off", "fused"), [("", True), ("qk_rope_store", False)])
def test_dispatch_runs_the_fused_form_unless_switched_off(
    monkeypatch: pytest.MonkeyPatch, off: str, fused: bool
) -> None:
    """As on a GPU (the device checks stubbed): plain pages go to the one-launch kernel;
    with `NINFER_KERNELS_OFF=qk_rope_store` the separate ops run, with the same results."""
    ops = _operands(2, 4, 2, 64, 16, torch.float32, "cpu")
    calls: list[str] = []
    monkeypatch.setenv("NINFER_KERNELS_OFF", off)
    monkeypatch.setattr(dispatch, "use_cuda_kernels", lambda t, op=None: op == "qk_norm_rope")

    def fused_kernel(*a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append("fused")
        return qk_ref.qk_norm_rope_store(*a)

    def norm_kernel(*a: torch.Tensor, **kw: object) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append("norm")
        return qk_ref.qk_norm_rope(*a)

    monkeypatch.setattr(qk_cuda, "qk_norm_rope_store", fused_kernel)
    monkeypatch.setattr(qk_cuda, "qk_norm_rope", norm_kernel)
    k_pages, v_pages = ops[8].clone(), ops[9].clone()
    want_q, want_k = qk_ref.qk_norm_rope_store(*ops[:8], k_pages, v_pages, ops[10])
    got_q, got_k = dispatch.qk_norm_rope_store(*ops)
    assert calls == (["fused"] if fused else ["norm"])
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    assert torch.equal(ops[8], k_pages) and torch.equal(ops[9], v_pages)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    "tokens,hq,hk,d,rotary",
    [(1, 24, 4, 256, 64), (8, 24, 4, 256, 64), (33, 16, 2, 256, 64), (5, 4, 2, 32, 16)],
    ids=["27b-b1", "27b-b8", "35b-t33", "tiny"],
)  # fmt: skip
def test_kernel_equals_the_separate_ops(dtype, tokens, hq, hk, d, rotary, gen) -> None:
    """q, k and both page tensors bit-equal to `qk_norm_rope` then index_copy (the twin, whose
    norm and RoPE run on the same kernel's rounding), eager and in a graph replay."""
    ops = _operands(tokens, hq, hk, d, rotary, dtype, "cuda", gen)
    k_pages, v_pages, slots = ops[8], ops[9], ops[10]
    k_want, v_want = k_pages.clone(), v_pages.clone()
    q_want, k_rows = qk_cuda.qk_norm_rope(ops[0], ops[1], *ops[3:8])  # no v: norm + RoPE only
    k_want.view(-1, hk, d).index_copy_(0, slots, k_rows)
    v_want.view(-1, hk, d).index_copy_(0, slots, ops[2])
    twin_k, twin_v = k_pages.clone(), v_pages.clone()
    twin = qk_ref.qk_norm_rope_store(*ops[:8], twin_k, twin_v, slots)
    got_q, got_k = qk_cuda.qk_norm_rope_store(*ops)
    assert torch.equal(got_q, q_want) and torch.equal(got_k, k_rows)
    assert torch.equal(k_pages, k_want) and torch.equal(v_pages, v_want)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-4
    assert (got_q.float() - twin[0].float()).norm() <= tol * twin[0].float().norm()
    k_pages.zero_(), v_pages.zero_()
    graph, out = capture_graph(lambda: qk_cuda.qk_norm_rope_store(*ops))
    k_pages.zero_(), v_pages.zero_()
    graph.replay()
    assert torch.equal(out[0], q_want) and torch.equal(out[1], k_rows)
    assert torch.equal(k_pages.view(-1, hk, d)[slots], k_rows)
    assert torch.equal(v_pages.view(-1, hk, d)[slots], ops[2])


def test_launchers_on_mocked_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both launchers (device checks and launches stubbed): the instance, grid and block each
    kernel needs, as many arguments as the kernel has parameters, and dense outputs of q's and
    k's shapes even when q is a strided view."""
    from ninfer.kernels import runtime as rt

    calls: list[tuple] = []
    monkeypatch.setattr(rt, "check_cuda", lambda *t: torch.device("cpu"))
    monkeypatch.setattr(rt, "get_kernel", lambda op, instance, device: instance)
    monkeypatch.setattr(rt, "launch", lambda *a, **kw: calls.append(a))
    ops = _operands(3, 24, 4, 256, 64, torch.bfloat16, "cpu")
    q, k = ops[0], ops[1]
    plain = qk_cuda.qk_norm_rope(q, k, *ops[3:8])
    stored = qk_cuda.qk_norm_rope_store(*ops)
    (k1, grid1, block1, args1, _), (k2, grid2, block2, args2, _) = calls
    assert (k1, grid1, block1) == ("qk_norm_rope_warp<bf16, 8>", (4, 3), (256,))  # 28 rows
    assert (k2, grid2, block2) == ("qk_norm_rope_store<bf16, 8>", (4, 3), (256,))  # 32 rows
    assert len(args1) == parameter_count("qk_norm_rope", "qk_norm_rope_warp")
    assert len(args2) == parameter_count("qk_norm_rope", "qk_norm_rope_store")
    for q_out, k_out in (plain, stored):
        assert q_out.shape == q.shape and k_out.shape == k.shape
        assert q_out.is_contiguous() and k_out.is_contiguous() and q_out.dtype == q.dtype
