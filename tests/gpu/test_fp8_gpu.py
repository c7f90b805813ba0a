"""fp8 artifacts on CUDA: weights stay e4m3 (the GEMV kernel for decode, the twin for prefill).

Tiny models converted with `--weights fp8`. Logits against the CPU fp32 model built from the same
artifact (dequantized at load): fp32 on the GPU, every row within 1e-3 (max |a - b| / max |b| per
row); bf16, the median row within 3e-2. There is no every-row bf16 bound: these decode rows feed
fixed (not greedy) tokens, whose flat logits put single rows at 0.17 (dense) and 0.51 (MoE) on
the CPU in bf16 alone, no GPU involved (checked 2026-12-02). Graphs must not change a token.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ninfer import Engine
from ninfer.artifact.reader import Artifact
from ninfer.engine.request import EventKind
from ninfer.kernels.fp8_gemv.reference import Fp8Weight
from ninfer.model.batch import ForwardBatch
from ninfer.model.cache import ModelCache
from ninfer.model.config import TextConfig
from ninfer.model.qwen3_5 import Qwen3_5Model
from support.tiny_artifacts import FP8_VARIANTS, convert_tiny, variant_spec

pytestmark = pytest.mark.gpu
VOCAB = 8192


@pytest.fixture(scope="module", params=FP8_VARIANTS)
def fp8_artifact(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp(f"fp8-{request.param}")
    spec = variant_spec(request.param, VOCAB)
    return convert_tiny(tmp, spec, seed=7, name="tiny-fp8", weights="fp8")[1]


def _row_errs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a, b = a.float().cpu(), b.float().cpu()
    return (a - b).abs().amax(-1) / b.abs().amax(-1)


def _logits(
    path: Path, dtype: torch.dtype, device: str, decode_tiles: bool = False
) -> tuple[torch.Tensor, Qwen3_5Model]:
    with Artifact(path) as art:
        config = TextConfig.from_hf(art.config["text"])
        model = Qwen3_5Model(
            config, art.load("text"), dtype=dtype, device=device, decode_tiles=decode_tiles
        )
    cache = ModelCache.allocate(
        config, num_pages=8, num_slots=2, page_size=16, dtype=dtype, device=device
    )
    prompt = torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    pages = [3, 1, 6]
    rows = [
        model.forward(
            ForwardBatch.prefill(
                prompt, num_computed=0, page_ids=pages, state_slot=1, device=device
            ),
            cache,
            all_logits=True,
        )
    ]
    for step, token in enumerate((5, 77, 901, 12)):
        batch = ForwardBatch.decode(
            [token], num_computed=[40 + step], page_tables=[pages], state_slots=[1], device=device
        )
        rows.append(model.forward(batch, cache))
    return torch.cat(rows), model


def test_fp8_weights_stay_fp8_on_cuda_and_match_the_cpu(fp8_artifact: Path) -> None:
    want, _ = _logits(fp8_artifact, torch.float32, "cpu")
    got32, model = _logits(fp8_artifact, torch.float32, "cuda:0")
    mixer = model.layers[0].mixer
    assert isinstance(getattr(mixer, "out_proj", getattr(mixer, "o_proj", None)), Fp8Weight)
    assert _row_errs(got32, want).max() < 1e-3
    got16, _ = _logits(fp8_artifact, torch.bfloat16, "cuda:0")
    assert _row_errs(got16, want).median() < 3e-2


def test_fp8_cuda_graphs_change_no_token(fp8_artifact: Path) -> None:
    base = {"max_concurrency": 4, "page_size": 16, "max_context": 256, "prefill_chunk": 32}
    prompts = [
        torch.randint(0, VOCAB, (9 + 11 * i,), generator=torch.Generator().manual_seed(i)).tolist()
        for i in range(3)
    ]

    def run(engine: Engine) -> list[list[int]]:
        out = []
        for p in prompts:
            events = engine.generate(p, max_tokens=16, ignore_eos=True, greedy=True)
            out.append([t for e in events if e.kind == EventKind.TOKENS for t in e.token_ids])
        return out

    with Engine.load(fp8_artifact, dtype="bf16", device="cuda:0", no_cuda_graph=True, **base) as e:
        want = run(e)
    with Engine.load(fp8_artifact, dtype="bf16", device="cuda:0", **base) as e:
        assert e.graph_status == "on"
        got = run(e)
    assert got == want and all(len(t) == 16 for t in got)


def test_packed_decode_tiles_change_no_logit(fp8_artifact: Path, monkeypatch) -> None:
    """`NINFER_KERNELS_ON=fp8_tiles` binds each whole fp8 projection's tiles beside its rows (the
    ring GEMV reads them at decode; prefill keeps the rows): bf16 logits equal bit for bit."""
    monkeypatch.delenv("NINFER_KERNELS_ON", raising=False)
    want, plain = _logits(fp8_artifact, torch.bfloat16, "cuda:0")
    assert all(w.tiles is None for w in _fp8_fields(plain))
    monkeypatch.setenv("NINFER_KERNELS_ON", "fp8_tiles")
    got, tiled = _logits(fp8_artifact, torch.bfloat16, "cuda:0")
    packed = [w for w in _fp8_fields(tiled) if w.tiles is not None]
    assert packed, "no fp8 projection got tiles"
    assert torch.equal(got, want)
    monkeypatch.delenv("NINFER_KERNELS_ON")
    got, tiled = _logits(fp8_artifact, torch.bfloat16, "cuda:0", decode_tiles=True)
    assert len([w for w in _fp8_fields(tiled) if w.tiles is not None]) == len(packed)
    assert torch.equal(got, want)  # the load option binds what the switch binds


def _fp8_fields(model: Qwen3_5Model) -> list[Fp8Weight]:
    out = []
    for layer in model.layers:
        for part in (layer.mixer, layer.ffn):
            out += [v for v in vars(part).values() if isinstance(v, Fp8Weight)]
    return out
