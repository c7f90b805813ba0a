"""Test support: tiny speculative engines sharing one bound model, MTP head and tokenizer.

Loading the tokenizer dominates `Engine.load` on the CPU (seconds), so the tests bind each tiny
checkpoint once and assemble engines over it (`build.assemble`, the path `Engine.load` takes).
`OracleDrafts` replaces the head's proposals by the sequence's known greedy continuation with
some positions corrupted, so rounds accept every length from 0 to k: random MTP weights accept
almost nothing, which would leave the acceptance and rollback paths untested.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ninfer import Engine
from ninfer.artifact.reader import Artifact
from ninfer.chat.template import ChatTemplate
from ninfer.engine.build import assemble, presets_of
from ninfer.engine.handles import RequestHandle
from ninfer.engine.options import EngineOptions
from ninfer.engine.request import EngineEvent, EventKind
from ninfer.model.config import TextConfig
from ninfer.model.mtp import MtpHead
from ninfer.model.qwen3_5 import Qwen3_5Model
from ninfer.testing import TinySpec
from ninfer.tokenizer import Tokenizer
from support.tiny_artifacts import convert_tiny

VOCAB = 1024
BASE: dict[str, Any] = {"dtype": "fp32", "page_size": 16, "max_context": 128, "prefill_chunk": 16}


@dataclass
class Tiny:
    artifact: Artifact
    model: Qwen3_5Model
    head: MtpHead
    tokenizer: Tokenizer
    template: ChatTemplate
    presets: Any

    def engine(self, *, static_rounds: bool = False, **options: Any) -> Engine:
        opts = EngineOptions.from_kwargs(**{**BASE, **options})
        parts = assemble(
            self.model,
            self.tokenizer,
            opts,
            presets=self.presets,
            eos_token_ids=frozenset(),
            mtp=self.head if opts.spec else None,
            static_rounds=static_rounds,
        )
        return Engine(parts, opts, self.template, "tiny")


_TOKENIZERS: dict[str, Tokenizer] = {}


def bind_tiny(tmp: Path, kind: str, seed: int = 5) -> Tiny:
    spec = TinySpec(kind=kind, vocab_size=VOCAB, with_vision=False)
    _, path = convert_tiny(tmp, spec, seed=seed, name="tiny")
    return bind_artifact(path)


def bind_artifact(path: Path) -> Tiny:
    """Bind an artifact's text model and MTP head once (fp32, CPU)."""
    artifact = Artifact(path)
    config = TextConfig.from_hf(artifact.config["text"])
    model = Qwen3_5Model(config, artifact.load("text"), dtype=torch.float32)
    head = MtpHead(model, artifact.load("mtp"))
    tok = _TOKENIZERS.get("qwen")
    if tok is None:
        tok = _TOKENIZERS["qwen"] = Tokenizer.from_json(artifact.tokenizer_json)
    presets = presets_of(artifact.header.generation, str(artifact.metadata.get("architecture")))
    return Tiny(artifact, model, head, tok, ChatTemplate(artifact.chat_template()), presets)


def run_requests(engine: Engine, requests: dict[str, tuple[list[int], dict]]) -> dict[str, list]:
    """Submit every (prompt, options) at once under its id and drain them: id -> its events.
    `stop_token_ids` in the options replaces the request's stop ids (no public option sets
    them)."""
    handles = {}
    for rid, (p, kw) in requests.items():
        kw = dict(kw)
        stop_ids = kw.pop("stop_token_ids", None)
        request = engine.make_request(p, request_id=rid, **kw)
        if stop_ids is not None:
            request = dataclasses.replace(request, stop_token_ids=stop_ids)
        handles[rid] = RequestHandle(engine.core, request)
    return {rid: list(h) for rid, h in handles.items()}


def tokens(events: list[EngineEvent]) -> list[int]:
    return [t for e in events if e.kind == EventKind.TOKENS for t in e.token_ids]


def prompt(i: int, length: int | None = None) -> list[int]:
    g = torch.Generator().manual_seed(100 + i)
    return torch.randint(0, VOCAB, (length or 9 + 5 * i,), generator=g).tolist()


class OracleDrafts:
    """Make `engine`'s proposals the known continuation of each running sequence (`truth`:
    request id -> its full token list), wrong where `wrong(position, j)` says, so rounds accept
    a mix of lengths. The head still runs (its KV and drafts are computed, then overwritten)."""

    def __init__(
        self,
        engine: Engine,
        truth: dict[str, list[int]],
        wrong: Callable[[int, int], bool] = lambda pos, j: (pos * 7 + j * 3) % 5 == 0,
    ) -> None:
        spec = engine.core.runner.spec
        assert spec is not None
        self.spec, self.truth, self.wrong = spec, truth, wrong
        self.scheduler = engine.core.scheduler
        previous = spec.on_drafts

        def oracle(slots, positions) -> None:
            if previous is not None:
                previous(slots, positions)
            by_slot = {s.slot: s for s in self.scheduler.running}
            for slot, pos in zip(slots.tolist(), positions.tolist(), strict=True):
                seq = by_slot.get(slot)
                if seq is None or seq.request_id not in self.truth:
                    continue
                ref = self.truth[seq.request_id]
                for j in range(spec.k):
                    at = pos + 2 + j  # the head's row at `pos` predicts position pos + 2
                    if at < len(ref):
                        token = ref[at]
                        spec.drafts[slot, j] = (token + 1) % VOCAB if self.wrong(pos, j) else token

        spec.on_drafts = oracle


class ChainCount:
    """Counts the chained rounds (`Row.chained`) that `engine`'s runner launches."""

    def __init__(self, engine: Engine) -> None:
        self.rows = 0
        runner = engine.core.runner
        launch = runner.launch

        def counting(plan):
            self.rows += sum(1 for r in plan.decode if r.chained)
            return launch(plan)

        runner.launch = counting
