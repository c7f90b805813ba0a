"""`ninfer bench --spec mtp`'s measuring core on the CPU with the tiny synthetic model: every
field of the report is there and consistent (the GPU numbers come from the integrator's run)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

import pytest
import torch

from ninfer.bench.spec_bench import run_spec_bench
from ninfer.bench.synthetic import random_mtp_weights, random_weights, synthetic_config
from ninfer.model.mtp import MtpHead
from ninfer.model.qwen3_5 import Qwen3_5Model


@pytest.fixture(autouse=True)
def _one_intra_op_thread() -> Iterator[None]:
    """Tiny ops on a 2-core machine: OpenMP spin-waiting costs more than it gains."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _tiny() -> tuple[Qwen3_5Model, MtpHead]:
    """The tiny dense synthetic model (fp32, CPU) and a random MTP head for it."""
    config = synthetic_config("tiny-dense")
    model = Qwen3_5Model(
        config, random_weights("tiny-dense", device="cpu", dtype=torch.float32), device="cpu"
    )
    head = random_mtp_weights("tiny-dense", device="cpu", dtype=torch.float32)
    return model, MtpHead(model, head)


def test_spec_bench_report_on_the_cpu() -> None:
    model, head = _tiny()
    report = run_spec_bench(
        model,
        head,
        architecture="qwen3_5",
        draft_tokens=2,
        batches=(2,),
        context=24,
        prompt_tokens=12,
        output_tokens=6,
        steps=1,
        profile=True,
    )
    assert [r["batch"] for r in report["rows"]] == [2]
    for r in report["rows"]:
        assert r["rounds"] > 0 and 1.0 <= r["acceptance_length"] <= 3.0
        assert len(r["accepted_per_position"]) == 2
        for key in ("plain_decode_ms", "verify_ms", "draft_step_ms", "round_ms", "round_sampled_ms",
                    "e2e_tok_s", "e2e_unchained_tok_s", "e2e_unchained_round_ms"):  # fmt: skip
            assert r[key] > 0, key
        assert r["projected_tok_s"]["3.2"] > r["projected_tok_s"]["1"]
        # a round end to end: the window over the rounds seen, so tokens per round = L
        committed = r["e2e_tok_s"] * r["e2e_round_ms"] / 1000.0 / 2  # per request (batch 2)
        assert committed == pytest.approx(r["acceptance_length"], rel=0.5)
        assert r["round_served_ms"] == r["round_ms"]  # the dense preset has no penalty
        assert r["e2e_round_over_round"] == pytest.approx(r["e2e_round_ms"] / r["round_ms"])
        assert r["eager_pieces"] == []  # nothing to capture on the CPU: nothing fell back
        # --profile: one eager round's ops (CPU time here), a verify's worth and more
        prof = r["round_profile"]
        assert (prof.kind, prof.batch, prof.context) == ("round", 2, 24)
        assert prof.kernel_us > 0 and prof.num_kernels > 0 and prof.top
        assert sum(k.us_per_step for k in prof.top) <= prof.kernel_us * (1 + 1e-9)
    saved = json.loads(json.dumps(report, default=dataclasses.asdict))
    assert saved["rows"][0]["round_profile"]["kind"] == "round"


def test_step_costs_feed_distinct_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every timed round sees distinct ids in its rows and fresh drafts: one id everywhere would
    route every MoE row and verify column to the same experts and time a fraction of a real
    round's expert reads (the 35B-A3B bench did so until 2026-12-06)."""
    from ninfer.bench import spec_bench
    from ninfer.engine.spec_step import SpecStep

    model, head = _tiny()
    seen: list[tuple[list[int], torch.Tensor]] = []
    run = SpecStep.run

    def spy(self: SpecStep, rows: list) -> torch.Tensor:
        seen.append(([r.token for r in rows], self.drafts[: len(rows)].clone()))
        return run(self, rows)

    monkeypatch.setattr(SpecStep, "run", spy)
    spec_bench._step_costs(model, head, 2, 2, 24, 3, False)
    assert len(seen) == 8  # warm-up + 3 timed, greedy and sampled
    for tokens, drafts in seen:
        assert tokens[0] != tokens[1]
        assert len(set(tokens) | set(drafts.flatten().tolist())) >= 4  # of 6 ids
    # the drafts are drawn again before every round, not left as the last round proposed
    assert all(not torch.equal(a[1], b[1]) for a, b in zip(seen, seen[1:], strict=False))


@pytest.mark.parametrize(
    ("architecture", "mode"), [("qwen3_5", "greedy"), ("qwen3_5_moe", "penalized_greedy")]
)
def test_served_round_is_the_round_the_e2e_requests_run(
    monkeypatch: pytest.MonkeyPatch, architecture: str, mode: str
) -> None:
    """`round_served_ms` times the acceptance that the end-to-end requests get: greedy keeps
    the thinking preset's penalties (the 35B-A3B's presence 1.5: the penalized argmax), so the
    e2e round is compared with that round, not the penalty-free one."""
    from ninfer.bench import spec_bench
    from ninfer.engine import spec_step

    model, head = _tiny()
    modes: list[str] = []
    pick = spec_step._acceptance_mode

    def spy(rows: list) -> str:
        modes.append(pick(rows))
        return modes[-1]

    monkeypatch.setattr(spec_step, "_acceptance_mode", spy)
    spec_bench._e2e(model, head, architecture, 2, 1, 10, 8, False, chained=True)
    assert modes and set(modes) == {mode}
    served = spec_bench.served_greedy_fields(architecture)
    assert (served == spec_bench.GREEDY_FIELDS) == (mode == "greedy")
    modes.clear()
    costs = spec_bench._step_costs(model, head, 2, 1, 24, 1, False, served=served)
    assert mode in modes  # the served rows' rounds, beside the greedy and sampled ones
    assert (costs["round_served_ms"] == costs["round_ms"]) == (mode == "greedy")


def test_ab_times_the_pieces_under_each_setting_then_the_base(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`--ab` with `--spec`: each setting is in the environment while its pieces are timed
    (switches are read at launch and capture), the base follows with it gone, every round."""
    import os

    from ninfer.bench import spec_bench

    model, head = _tiny()
    seen: list[tuple[str | None, bool]] = []
    step_costs = spec_bench._step_costs

    def spy(*args, **kwargs):
        seen.append((os.environ.get("NINFER_KERNELS_ON"), kwargs.get("pieces_only", False)))
        return step_costs(*args, **kwargs)

    monkeypatch.delenv("NINFER_KERNELS_ON", raising=False)
    monkeypatch.setattr(spec_bench, "_step_costs", spy)
    settings = (("NINFER_KERNELS_ON", "a"), ("NINFER_KERNELS_ON", "b"))
    report = run_spec_bench(
        model,
        head,
        architecture="qwen3_5",
        draft_tokens=2,
        batches=(1,),
        context=24,
        prompt_tokens=12,
        output_tokens=4,
        steps=1,
        ab=settings,
        ab_rounds=2,
    )
    # the row's own costs first, then (a, b, base) twice, each timing only the pieces
    assert seen == [(None, False)] + [("a", True), ("b", True), (None, True)] * 2
    ab = report["rows"][0]["ab"]
    labels = ["NINFER_KERNELS_ON=a", "NINFER_KERNELS_ON=b", ""] * 2
    assert [a["setting"] for a in ab] == labels
    assert all(a[p] > 0 for a in ab for p in spec_bench.AB_PIECES)
    assert "NINFER_KERNELS_ON" not in os.environ
