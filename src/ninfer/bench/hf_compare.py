"""`ninfer bench --compare hf`: the same workload through HF transformers, over the same weights.

Imports torch, model/, kernels' Fp8Weight and bench.results; `transformers` only inside functions.
The HF model is built on the meta device and its parameters are then bound to the ninfer model's
own tensors (views into its merged projections), so both run identical weights with no second
copy: the 27B fits once on one GPU, and the two models' prefill logits can be compared.
"""

from __future__ import annotations

import importlib
import inspect
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ninfer.bench.results import DecodeResult, HfComparison, LogitCheck, PrefillResult
from ninfer.kernels.fp8_gemv.reference import Fp8Weight
from ninfer.model.batch import ForwardBatch
from ninfer.model.cache import ModelCache
from ninfer.model.layers.gated_attention import AttentionWeights
from ninfer.model.layers.mlp import MlpWeights
from ninfer.model.qwen3_5 import Qwen3_5Model

PAGE_SIZE = 64
DECODE_WARMUP = 2  # untimed steps per decode cell (first-call costs: allocator, cuBLAS plans)

# (modeling module, model class, configuration module, text config class) per family
_HF_CLASSES = {
    "dense": (
        "transformers.models.qwen3_5.modeling_qwen3_5",
        "Qwen3_5ForCausalLM",
        "transformers.models.qwen3_5.configuration_qwen3_5",
        "Qwen3_5TextConfig",
    ),
    "moe": (
        "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
        "Qwen3_5MoeForCausalLM",
        "transformers.models.qwen3_5_moe.configuration_qwen3_5_moe",
        "Qwen3_5MoeTextConfig",
    ),
}


class HfCompareError(RuntimeError):
    """`--compare hf` cannot run: transformers is missing or lacks the model, or the weights
    cannot be shared (fp8, a name or shape HF does not have)."""


def require_hf(moe: bool = False) -> tuple[type, type, str]:
    """HF's causal-LM class, text config class and transformers version, or HfCompareError.

    Checked before any timing starts, so a missing peer fails in a second, not after the
    minutes the ninfer matrix takes.
    """
    try:
        transformers = importlib.import_module("transformers")
    except ImportError as e:
        raise HfCompareError(
            f"`--compare hf` needs HF transformers, which does not import here ({e}); "
            "install it (pip install transformers) or drop --compare"
        ) from None
    version = str(getattr(transformers, "__version__", "?"))
    model_mod, model_cls, config_mod, config_cls = _HF_CLASSES["moe" if moe else "dense"]
    try:
        model_type = getattr(importlib.import_module(model_mod), model_cls)
        config_type = getattr(importlib.import_module(config_mod), config_cls)
    except (ImportError, AttributeError) as e:
        raise HfCompareError(
            f"`--compare hf` needs transformers with the Qwen3.5 model ({model_cls}); "
            f"transformers {version} lacks it ({e})"
        ) from None
    return model_type, config_type, version


def shared_tensors(model: Qwen3_5Model) -> dict[str, torch.Tensor]:
    """The model's bound tensors under HF's parameter names and shapes (views, never copies).

    HF's causal-LM names are the checkpoint's text names with `model.` in front (lm_head aside);
    the only reshaping is the depthwise conv, which ninfer binds as [C, K] and HF holds as
    [C, 1, K].
    """
    out: dict[str, torch.Tensor | Fp8Weight] = {
        "model.embed_tokens.weight": model.embed_tokens,
        "model.norm.weight": model.norm,
        "lm_head.weight": model.lm_head,
    }
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = layer.input_layernorm
        out[p + "post_attention_layernorm.weight"] = layer.post_attention_layernorm
        m = layer.mixer
        if isinstance(m, AttentionWeights):
            for f in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
                out[f"{p}self_attn.{f}.weight"] = getattr(m, f)
        else:
            a = p + "linear_attn."
            for f in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj", "norm"):
                out[f"{a}{f}.weight"] = getattr(m, f)
            out[a + "conv1d.weight"] = m.conv1d.unsqueeze(1)  # [C, K] -> [C, 1, K]
            out[a + "dt_bias"] = m.dt_bias
            out[a + "A_log"] = m.A_log
        f = layer.ffn
        if isinstance(f, MlpWeights):
            for name in ("gate_proj", "up_proj", "down_proj"):
                out[f"{p}mlp.{name}.weight"] = getattr(f, name)
        else:
            out |= {
                p + "mlp.gate.weight": f.router,
                p + "mlp.experts.gate_up_proj": f.experts_gate_up,
                p + "mlp.experts.down_proj": f.experts_down,
                p + "mlp.shared_expert.gate_proj.weight": f.shared_gate_proj,
                p + "mlp.shared_expert.up_proj.weight": f.shared_up_proj,
                p + "mlp.shared_expert.down_proj.weight": f.shared_down_proj,
                p + "mlp.shared_expert_gate.weight": f.shared_gate,
            }
    if fp8 := sorted(n for n, t in out.items() if isinstance(t, Fp8Weight)):
        raise HfCompareError(
            f"`--compare hf` shares the model's weights with HF, which cannot run fp8 weights "
            f"({fp8[0]} is fp8); run it with --weights bf16"
        )
    return {n: t for n, t in out.items() if isinstance(t, torch.Tensor)}


def build_hf_model(model: Qwen3_5Model, hf_config: Mapping[str, Any]) -> torch.nn.Module:
    """HF's causal LM for `hf_config`, built on the meta device, every parameter bound to the
    ninfer model's tensor of the same name (checked by name and shape: nothing missing or left
    over), rotary buffers computed on the model's device. Eval mode, no gradients."""
    model_type, config_type, _ = require_hf(model.config.is_moe)
    config = config_type(**dict(hf_config))
    with torch.device("meta"):
        hf = model_type(config)
    tensors = shared_tensors(model)
    names = {n for n, _ in hf.named_parameters()}
    if missing := sorted(names - set(tensors)):
        raise HfCompareError(f"ninfer has no tensor for HF parameter '{missing[0]}'")
    if extra := sorted(set(tensors) - names):
        raise HfCompareError(f"HF has no parameter '{extra[0]}' (transformers naming changed?)")
    for name in sorted(names):
        owner, _, leaf = name.rpartition(".")
        module = hf.get_submodule(owner)
        tensor = tensors[name]
        expected = tuple(getattr(module, leaf).shape)
        if tuple(tensor.shape) != expected:
            raise HfCompareError(
                f"HF parameter '{name}' is {list(expected)}, ninfer's is {list(tensor.shape)}"
            )
        setattr(module, leaf, torch.nn.Parameter(tensor, requires_grad=False))
    for name, module in list(hf.named_modules()):
        if type(module).__name__.endswith("RotaryEmbedding"):
            owner, _, leaf = name.rpartition(".")
            with torch.device(model.device):  # inv_freq is computed in __init__
                setattr(hf.get_submodule(owner), leaf, type(module)(config))
    for name, t in [*hf.named_parameters(), *hf.named_buffers()]:
        if t.device.type != model.device.type or model.device.index not in (None, t.device.index):
            raise HfCompareError(f"HF tensor '{name}' is on {t.device}, not on {model.device}")
    return hf.eval().requires_grad_(False)


def ninfer_prefill_logits(
    model: Qwen3_5Model, token_ids: Sequence[int], num_last: int
) -> torch.Tensor:
    """[num_last, vocab] fp32 logits of the last prompt positions, one prefill in a fresh cache."""
    num_pages = -(-len(token_ids) // PAGE_SIZE)
    cache = ModelCache.allocate(
        model.config,
        num_pages=num_pages,
        num_slots=1,
        page_size=PAGE_SIZE,
        dtype=model.dtype,
        device=model.device,
    )
    batch = ForwardBatch.prefill(
        token_ids,
        num_computed=0,
        page_ids=list(range(num_pages)),
        state_slot=0,
        device=model.device,
    )
    hidden = model.forward_hidden(batch, cache)  # [T, H]
    return model.compute_logits(hidden[-num_last:])


def compare_logits(ninfer: torch.Tensor, hf: torch.Tensor, num_tokens: int) -> LogitCheck:
    """Both [N, vocab]; HF's is the reference the differences are measured against."""
    a, b = ninfer.float(), hf.float()
    diff = a - b
    return LogitCheck(
        num_tokens=num_tokens,
        num_positions=a.shape[0],
        max_abs_diff=float(diff.abs().max()),
        max_abs_logit=float(b.abs().max()),
        rel_l2=float(diff.norm() / b.norm().clamp_min(1e-30)),
        argmax_agree=float((a.argmax(-1) == b.argmax(-1)).float().mean()),
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class HfBench:
    """Drives an HF causal LM as its users do: one forward per step over a DynamicCache, greedy
    token ids back on the host every step (what ninfer's bench does too), no CUDA graphs."""

    def __init__(self, hf: torch.nn.Module, *, seed: int = 0) -> None:
        self.hf = hf
        self.device = next(hf.parameters()).device
        self.vocab_size = int(hf.config.vocab_size)
        # transformers renamed `past_key_values` to `cache` (5.2x); take what this one has
        params = inspect.signature(hf.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._gen = torch.Generator().manual_seed(seed)

    def new_cache(self) -> object:
        """An empty HF cache (KV for attention layers, conv and recurrent state for DeltaNet)."""
        from transformers import DynamicCache

        return DynamicCache(config=self.hf.config)

    def token_ids(self, batch: int, num_tokens: int) -> torch.Tensor:
        """[batch, num_tokens] random ids on the model's device."""
        ids = torch.randint(0, self.vocab_size, (batch, num_tokens), generator=self._gen)
        return ids.to(self.device)

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, cache: object, start: int, keep: int) -> torch.Tensor:
        """[B, T] ids at positions start.. -> [B, keep, vocab] logits of the last positions."""
        b, t = ids.shape
        positions = torch.arange(start, start + t, device=self.device).expand(b, t)
        out = self.hf(
            input_ids=ids,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=keep,
            **{self._cache_kw: cache},
        )
        return out.logits

    def prefill(self, num_tokens: int, *, repeats: int) -> PrefillResult:
        """Best of `repeats` prefills of a fresh random prompt, prompt in to first token on host."""
        best = float("inf")
        for _ in range(repeats):
            ids = self.token_ids(1, num_tokens)
            cache = self.new_cache()
            _sync(self.device)
            start = time.perf_counter()
            logits = self.forward(ids, cache, 0, 1)
            int(logits[0, -1].argmax().item())
            best = min(best, time.perf_counter() - start)
            del cache, logits
        return PrefillResult(num_tokens, num_tokens, best, num_tokens / best, best * 1000.0)

    def greedy(self, ids: torch.Tensor, num_steps: int) -> tuple[list[list[int]], list[float]]:
        """Prefill `ids` [B, T], then `num_steps` greedy decode steps.

        Returns:
            per row the prefill's token then each step's; the wall time of each step.
        """
        cache = self.new_cache()
        batch, context = ids.shape
        nxt = self.forward(ids, cache, 0, 1)[:, -1].argmax(-1)  # [B]
        tokens = [[t] for t in nxt.tolist()]
        times = []
        for i in range(num_steps):
            start = time.perf_counter()
            logits = self.forward(nxt[:, None], cache, context + i, 1)
            nxt = logits[:, -1].argmax(-1)
            host = nxt.tolist()
            times.append(time.perf_counter() - start)
            for row, t in zip(tokens, host, strict=True):
                row.append(t)
        return tokens, times

    def decode(self, batch: int, context: int, *, steps: int) -> DecodeResult:
        """Median of `steps` timed greedy steps of `batch` rows after a real `context` prefill."""
        _, times = self.greedy(self.token_ids(batch, context), DECODE_WARMUP + steps)
        step_s = statistics.median(times[DECODE_WARMUP:])
        return DecodeResult(batch, context, False, step_s * 1000.0, batch / step_s)


def run_hf_compare(
    model: Qwen3_5Model,
    hf_config: Mapping[str, Any],
    *,
    prefill_sizes: Sequence[int],
    decode_batches: Sequence[int],
    decode_context: int,
    decode_steps: int,
    check_positions: int = 16,
    seed: int = 0,
    on_progress: Callable[[str], None],
) -> HfComparison:
    """The HF matrix (prefills, then each decode batch at `decode_context`) and the logit check
    on a prefill of the first prefill size (the shortest decode context when there is none)."""
    _, _, version = require_hf(model.config.is_moe)
    on_progress(f"HF transformers {version}: building the model over ninfer's weight tensors")
    start = time.perf_counter()
    hf = build_hf_model(model, hf_config)
    result = HfComparison(
        transformers_version=version,
        attn_implementation=str(getattr(hf.config, "_attn_implementation", "?")),
        decode_steps=decode_steps,
        build_s=time.perf_counter() - start,
    )
    if model.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(model.device)
    bench = HfBench(hf, seed=seed)

    check_tokens = prefill_sizes[0] if prefill_sizes else decode_context
    on_progress(f"logit check: ninfer and HF on one {check_tokens}-token prefill")
    ids = bench.token_ids(1, check_tokens)
    num_last = min(check_positions, check_tokens)
    ninfer_logits = ninfer_prefill_logits(model, ids[0].tolist(), num_last)
    hf_logits = bench.forward(ids, bench.new_cache(), 0, num_last)[0]  # [num_last, vocab]
    result.logit_check = compare_logits(ninfer_logits, hf_logits, check_tokens)
    del ninfer_logits, hf_logits

    if prefill_sizes:
        on_progress("HF prefill warm-up")
        bench.prefill(min(prefill_sizes), repeats=1)
    for n in prefill_sizes:
        on_progress(f"HF prefill {n} tokens")
        result.prefill.append(bench.prefill(n, repeats=2 if n <= 2048 else 1))
    for b in decode_batches:
        on_progress(f"HF decode batch {b} at {decode_context} context (prefill, then steps)")
        result.decode.append(bench.decode(b, decode_context, steps=decode_steps))
    if model.device.type == "cuda":
        result.peak_memory_gib = torch.cuda.max_memory_allocated(model.device) / 2**30
    return result
