"""`ninfer bench --synthetic MODEL`: prefill, decode, kernel and ceiling timings on one GPU.

Thin: parses options, runs `ninfer.bench.run`, prints a table (or JSON). Option combinations and
`--compare hf`'s peer (transformers with Qwen3.5) are checked before any GPU work starts.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from rich.console import Console

from ninfer.cli.device import cuda_device
from ninfer.cli.errors import UserError
from ninfer.cli.options import decode_tiles as decode_tiles_option
from ninfer.cli.options import opt
from ninfer.engine.options import KV_DTYPES


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UserError(f"{what} must be comma-separated integers, got {text!r}") from None
    if any(v <= 0 for v in values):
        raise UserError(f"{what} must be positive, got {text!r}")
    return values


def bench(
    synthetic: str = opt(
        ...,
        "--synthetic",
        help="qwen3.6-27b or qwen3.6-35b-a3b (tiny-dense, tiny-moe: smoke).",
        metavar="MODEL",
    ),
    device: str = opt(
        "auto", "--device", help="CUDA device: auto, cuda, cuda:N or N.", metavar="DEVICE"
    ),
    weights: str = opt(
        "bf16", "--weights", help="bf16 or fp8 (e4m3, 128x128 blocks).", metavar="bf16|fp8"
    ),
    decode_tiles: bool = decode_tiles_option(),
    prefill: str = opt(
        "512,2048,8192,32768",
        "--prefill",
        help="Prompt lengths, each timed twice: the best run, and the first (cold) beside it.",
        metavar="N,N,...",
    ),
    prefill_chunk: int = opt(
        8192, "--prefill-chunk", min=1, help="Tokens per forward.", metavar="N"
    ),
    batches: str = opt("1,2,4,8", "--batches", help="Decode batch sizes.", metavar="N,N,..."),
    contexts: str = opt("1024,32768", "--contexts", help="Decode contexts.", metavar="N,N,..."),
    steps: int = opt(16, "--steps", min=1, help="Timed decode steps per cell.", metavar="N"),
    no_kernels: bool = opt(False, "--no-kernels", help="Skip the kernel timings."),
    no_ceilings: bool = opt(False, "--no-ceilings", help="Skip copy/GEMM ceilings."),
    ab: str = opt(
        "",
        "--ab",
        help="Also time the decode batches (first --contexts value; with --spec: the round's "
        "plain step, verify, draft step and round) again under each of these switch settings, "
        "NAME=VALUE;NAME=VALUE (e.g. NINFER_KERNELS_OFF=fp8_ring), then the base again: an A/B "
        "in one process.",
        metavar="SETTINGS",
    ),
    ab_rounds: int = opt(
        1,
        "--ab-rounds",
        min=1,
        max=10,
        help="--ab: run the cycle (each setting, then the base) this many times; the table "
        "gives each side's median and the base's spread.",
        metavar="N",
    ),
    profile: bool = opt(
        False,
        "--profile",
        help="Profile an eager decode step (with --spec: an eager speculative round).",
    ),
    as_json: bool = opt(False, "--json", help="Print JSON instead of tables."),
    save: Path | None = opt(
        None, "--save", help="Also write the JSON report here.", metavar="FILE"
    ),
    compare: str | None = opt(
        None,
        "--compare",
        help="hf: also run HF transformers (bf16 only) in this process over the same weight "
        "tensors, on its own small matrix (by default a 2048-token prefill and decode at batch "
        "1 and 8 at the first --contexts value: HF decodes the 27B at ~8 tok/s); ninfer's matrix "
        "is widened to hold every HF cell; reports ninfer / HF per cell and a logit check.",
        metavar="hf",
    ),
    hf_prefill: str = opt("2048", "--hf-prefill", help="HF prompt lengths.", metavar="N,N,..."),
    hf_batches: str = opt(
        "1,8",
        "--hf-batches",
        help="HF decode batch sizes, at the first --contexts value.",
        metavar="N,N,...",
    ),
    hf_steps: int = opt(
        8, "--hf-steps", min=1, help="Timed HF decode steps per cell.", metavar="N"
    ),
    e2e: bool = opt(False, "--e2e", help="Also run the decode batches through the Engine API."),
    e2e_prompt: int = opt(1000, "--e2e-prompt", min=1, help="--e2e prompt tokens.", metavar="N"),
    e2e_output: int = opt(256, "--e2e-output", min=2, help="--e2e output tokens.", metavar="N"),
    e2e_long: int = opt(
        8192,
        "--e2e-long-prompt",
        min=0,
        help="--e2e: a prompt arriving while streams decode (0: skip).",
        metavar="N",
    ),
    vision: bool = opt(
        False,
        "--vision",
        help="Instead of the text matrix: the Qwen3.5-27B vision tower (random weights) on "
        "--vision-size images (images/s, merged tokens/s per --vision-batches) and the "
        "image-plus-text time to first token with the --synthetic text model.",
    ),
    vision_size: int = opt(1024, "--vision-size", min=32, help="Image side (pixels).", metavar="N"),
    vision_batches: str = opt(
        "1,4,8", "--vision-batches", help="Images per call.", metavar="N,N,..."
    ),
    no_ttft: bool = opt(False, "--no-ttft", help="--vision: skip the TTFT run."),
    context_cache: bool = opt(
        False,
        "--context-cache",
        help="Also time a second turn's TTFT with a prefix hit against a cold run, and one "
        "sequence's snapshot to pinned host memory and restore.",
    ),
    cache_turn: int = opt(
        16384, "--cache-turn-tokens", min=64, help="--context-cache: first turn.", metavar="N"
    ),
    cache_snapshot: int = opt(
        32768, "--cache-snapshot-tokens", min=1, help="--context-cache: context.", metavar="N"
    ),
    kv_dtype: str = opt(
        "bf16",
        "--kv-dtype",
        help="KV cache of the prefill/decode matrix: bf16, int8, fp8, nvfp4 or k8v4.",
        metavar="bf16|int8|fp8|nvfp4|k8v4",
    ),
    kv_dtype_quality: bool = opt(
        False,
        "--kv-dtype-quality",
        help="Instead of the matrix: logits of every quantized KV dtype against bf16 KV (top-1 "
        "agreement, KL) at --kv-quality-contexts, and batch-1 decode tok/s per dtype there.",
    ),
    kv_quality_contexts: str = opt(
        "4096,32768", "--kv-quality-contexts", help="Contexts.", metavar="N,N,..."
    ),
    spec: str | None = opt(
        None,
        "--spec",
        help="Instead of the text matrix: speculative decoding with a random MTP head per "
        "--batches: e2e tok/s and acceptance, and the cost of a plain decode step, a verify "
        "step, a draft step and a round at the first --contexts value, with the tok/s a round "
        "implies at stated acceptance lengths (random weights accept almost nothing).",
        metavar="mtp",
    ),
    draft_tokens: int = opt(
        3, "--draft-tokens", min=1, max=5, help="--spec: drafts per round.", metavar="N"
    ),  # fmt: skip
    lm_head_draft: bool = opt(
        False,
        "--lm-head-draft",
        help="--spec: draft through the 4-bit shortlist head (as `serve --lm-head-draft`).",
    ),
) -> None:
    """Benchmark prefill and decode of a real-shape model with random weights (needs a GPU)."""
    if kv_dtype not in KV_DTYPES:
        raise UserError(f"--kv-dtype must be one of {'|'.join(KV_DTYPES)}, got {kv_dtype!r}")
    from ninfer.bench.ab import AbSettingError, parse_settings

    try:
        ab_settings = parse_settings(ab)
    except AbSettingError as e:
        raise UserError(str(e)) from None
    if ab_rounds > 1 and not ab_settings:
        raise UserError("--ab-rounds needs --ab")
    if ab_settings and (kv_dtype_quality or vision):
        raise UserError("--ab applies to the text matrix and --spec rounds; it is not "
                        "supported with --kv-dtype-quality or --vision")  # fmt: skip
    if decode_tiles and (kv_dtype_quality or vision):
        raise UserError("--decode-tiles applies to the text matrix and --spec rounds; it is not "
                        "supported with --kv-dtype-quality or --vision")  # fmt: skip
    if profile and (kv_dtype_quality or vision):
        raise UserError("--profile covers the text matrix and --spec rounds; it is not "
                        "supported with --kv-dtype-quality or --vision")  # fmt: skip
    if kv_dtype_quality:
        from ninfer.bench.kv_quality_cmd import run_kv_quality_cmd

        try:
            run_kv_quality_cmd(synthetic, cuda_device(device), weights,
                               _ints(kv_quality_contexts, "--kv-quality-contexts"), steps,
                               as_json, save)  # fmt: skip
        except ValueError as e:
            raise UserError(str(e)) from None
        return
    if lm_head_draft and spec is None:
        raise UserError("--lm-head-draft needs --spec mtp")
    if spec is not None:
        if spec != "mtp":
            raise UserError(f"--spec {spec}: only mtp is built")
        _spec(
            synthetic=synthetic,
            device=cuda_device(device),
            weights=weights,
            draft_tokens=draft_tokens,
            batches=_ints(batches, "--batches"),
            context=_ints(contexts, "--contexts")[0],
            prompt_tokens=e2e_prompt,
            output_tokens=e2e_output,
            steps=steps,
            as_json=as_json,
            save=save,
            lm_head_draft=lm_head_draft,
            profile=profile,
            ab=ab_settings,
            ab_rounds=ab_rounds,
            decode_tiles=decode_tiles,
        )
        return
    if vision:
        _vision(synthetic, cuda_device(device), vision_size,
                _ints(vision_batches, "--vision-batches"), not no_ttft, as_json, save)  # fmt: skip
        return
    from ninfer.bench.hf_compare import HfCompareError, require_hf
    from ninfer.bench.report import emit_json, print_report
    from ninfer.bench.run import BenchError, BenchOptions, check_compare, run_bench
    from ninfer.bench.synthetic import UnknownSyntheticModel, synthetic_config

    opts = BenchOptions(
        synthetic=synthetic,
        device=cuda_device(device),
        prefill_sizes=_ints(prefill, "--prefill"),
        prefill_chunk=prefill_chunk,
        decode_batches=_ints(batches, "--batches"),
        decode_contexts=_ints(contexts, "--contexts"),
        decode_steps=steps,
        kernels=not no_kernels,
        ceilings=not no_ceilings,
        profile=profile,
        weights=weights,
        decode_tiles=decode_tiles,
        kv_dtype=kv_dtype,
        command=shlex.join(["ninfer", *sys.argv[1:]]),
        compare=compare,
        hf_prefill_sizes=_ints(hf_prefill, "--hf-prefill"),
        hf_decode_batches=_ints(hf_batches, "--hf-batches"),
        hf_decode_steps=hf_steps,
        e2e=e2e,
        e2e_prompt_tokens=e2e_prompt,
        e2e_output_tokens=e2e_output,
        e2e_long_prompt=e2e_long,
        context_cache=context_cache,
        cache_turn_tokens=cache_turn,
        cache_snapshot_tokens=cache_snapshot,
        ab=ab_settings,
        ab_rounds=ab_rounds,
    )
    err = Console(stderr=True)
    try:
        check_compare(opts)
        if compare == "hf":
            require_hf(synthetic_config(synthetic).is_moe)
        with err.status("starting") as status:
            report = run_bench(opts, lambda msg: (status.update(msg), err.print(msg, style="dim")))
    except (BenchError, HfCompareError, UnknownSyntheticModel) as e:
        raise UserError(str(e)) from None
    if not emit_json(report, save, as_json):
        print_report(report, Console())


def _spec(
    *,
    synthetic: str,
    device: str,
    weights: str,
    draft_tokens: int,
    batches: tuple[int, ...],
    context: int,
    prompt_tokens: int,
    output_tokens: int,
    steps: int,
    as_json: bool,
    save: Path | None,
    lm_head_draft: bool,
    profile: bool,
    ab: tuple[tuple[str, str], ...] = (),
    ab_rounds: int = 1,
    decode_tiles: bool = False,
) -> None:
    import torch

    from ninfer.bench.report import emit_json, print_profile
    from ninfer.bench.spec_bench import run_spec_bench
    from ninfer.bench.synthetic import random_mtp_weights, synthetic_model
    from ninfer.model.mtp import MtpHead

    if not torch.cuda.is_available():
        raise UserError("`ninfer bench --spec` needs a CUDA GPU; none is visible to torch")
    err = Console(stderr=True)
    try:
        model = synthetic_model(synthetic, device=device, weights=weights,
                                say=lambda msg: err.print(msg, style="dim"),
                                decode_tiles=decode_tiles)  # fmt: skip
    except ValueError as e:  # an unknown model name or --weights
        raise UserError(str(e)) from None
    head = MtpHead(model, random_mtp_weights(synthetic, device=device, fp8=weights == "fp8"))
    architecture = "qwen3_5_moe" if model.config.is_moe else "qwen3_5"
    report = run_spec_bench(
        model,
        head,
        architecture=architecture,
        draft_tokens=draft_tokens,
        batches=batches,
        context=context,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        steps=steps,
        lm_head_draft=lm_head_draft,
        profile=profile,
        ab=ab,
        ab_rounds=ab_rounds,
        on_progress=lambda msg: err.print(msg, style="dim"),
    )
    report |= {"synthetic": synthetic, "weights": weights, "decode_tiles": decode_tiles,
               "command": shlex.join(["ninfer", *sys.argv[1:]])}  # fmt: skip
    if emit_json(report, save, as_json):
        return
    con = Console()
    shortlist = ", lm-head-draft" if lm_head_draft else ""
    tiles = " with decode tiles" if decode_tiles else ""
    con.print(f"MTP k={draft_tokens}{shortlist}, {synthetic} {weights}{tiles} ({report['note']})")
    for r in report["rows"]:
        proj = ", ".join(f"L={k}: {v:.0f}" for k, v in r["projected_tok_s"].items())
        served = (
            f"greedy with the preset's penalties {r['round_served_ms']:.2f} ms, "
            if r["round_served_ms"] != r["round_ms"]
            else ""
        )
        con.print(
            f"batch {r['batch']}: e2e {r['e2e_tok_s']:.1f} tok/s ({r['e2e_round_ms']:.2f} ms a "
            f"round, {r['e2e_round_over_round']:.2f}x its round's graph; unchained "
            f"{r['e2e_unchained_tok_s']:.1f} tok/s, {r['e2e_unchained_round_ms']:.2f} ms), "
            f"acceptance length "
            f"{r['acceptance_length']:.2f}, per position {r['accepted_per_position']}; "
            f"plain step {r['plain_decode_ms']:.2f} ms ({r['plain_tok_s']:.0f} tok/s), verify "
            f"{r['verify_ms']:.2f} ms ({r['verify_over_plain_decode']:.2f}x), draft step "
            f"{r['draft_step_ms']:.2f} ms, round {r['round_ms']:.2f} ms ({served}sampled "
            f"rows {r['round_sampled_ms']:.2f} ms) -> tok/s {proj}"
        )
        if r.get("eager_pieces"):
            con.print(f"  timed eagerly (capture failed): {', '.join(r['eager_pieces'])}")
        for a in r.get("ab", []):
            con.print(
                f"  A/B {a['setting'] or 'base again'}: round {a['round_ms']:.3f} ms, verify "
                f"{a['verify_ms']:.3f}, plain step {a['plain_decode_ms']:.3f}, draft step "
                f"{a['draft_step_ms']:.3f}"
            )
        if "round_profile" in r:
            print_profile(r["round_profile"], con)


def _vision(
    synthetic: str,
    device: str,
    size: int,
    batches: tuple[int, ...],
    ttft: bool,
    as_json: bool,
    save: Path | None,
) -> None:
    import torch

    from ninfer.bench.report import emit_json
    from ninfer.bench.synthetic import synthetic_model
    from ninfer.bench.vision_bench import run_vision_bench

    if not torch.cuda.is_available():
        raise UserError("`ninfer bench --vision` needs a CUDA GPU; none is visible to torch")
    err = Console(stderr=True)
    cuda = device
    model = None
    if ttft:
        try:
            model = synthetic_model(synthetic, device=cuda,
                                    say=lambda msg: err.print(msg, style="dim"))  # fmt: skip
        except ValueError as e:  # an unknown model name
            raise UserError(str(e)) from None
    report = run_vision_bench(
        device=cuda,
        image_size=size,
        batches=batches,
        text_model=model,
        on_progress=lambda msg: err.print(msg, style="dim"),
    )
    report["command"] = shlex.join(["ninfer", *sys.argv[1:]])
    if emit_json(report, save, as_json):
        return
    con = Console()
    for row in report["tower"]:
        con.print(
            f"tower {row['image_size']}px x{row['batch']}: {row['images_per_s']:.1f} images/s, "
            f"{row['tokens_per_s']:.0f} merged tokens/s ({row['merged_tokens']} tokens/image)"
        )
    if "ttft" in report:
        t = report["ttft"]
        con.print(
            f"TTFT image + text ({t['prompt_tokens']} tokens): {t['ttft_ms']:.1f} ms "
            f"(preprocess {t['preprocess_ms']:.1f}, tower {t['tower_ms']:.1f}, "
            f"prefill {t['prefill_ms']:.1f})"
        )
