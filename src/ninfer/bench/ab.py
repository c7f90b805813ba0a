"""`ninfer bench --ab 'NAME=VALUE;...'`: the decode batches again in the same process with a
kernel switch set (e.g. `NINFER_KERNELS_OFF=fp8_ring`), then once more without it.

Why in one process: a device call that compares two settings in two `ninfer bench` runs pays the
27B's weight draw, fusion and graph capture twice (~40 s), and the two sides may land on two
machines. Here the model and cache are shared; only the decode graphs are captured again under
each setting, since the switches (kernels/switches.py) are read when a kernel is launched or
captured. The base is timed again at the end, so drift over the run shows beside the A/B.
`rounds` > 1 repeats the whole cycle (each setting, then the base) so that each side has several
timings spread over the run: a step moves by 1-1.5 % between two timings of the same setting on
one card (docs/perf.md, runs S35E / S35G), as much as the effects an A/B is usually after.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Sequence

import torch

from ninfer.bench.model_bench import ModelBench
from ninfer.bench.results import AbResult, DecodeResult
from ninfer.kernels.switches import setting

PREFIX = "NINFER_"  # only ninfer's own switches: read per launch, so a recapture applies them


class AbSettingError(ValueError):
    """An `--ab` setting that is not NAME=VALUE with a NINFER_ name."""


def parse_settings(text: str) -> tuple[tuple[str, str], ...]:
    """'NAME=VALUE;NAME=VALUE' (';' between settings: values such as switch lists hold commas)
    as (name, value) pairs; an empty text gives none."""
    settings = []
    for part in text.split(";"):
        part = part.strip()
        if not part:
            continue
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or not name.startswith(PREFIX) or not name[len(PREFIX) :]:
            raise AbSettingError(
                f"--ab takes NAME=VALUE settings of ninfer's switches ({PREFIX}...; ';' between "
                f"settings), got {part!r}"
            )
        settings.append((name, value.strip()))
    return tuple(settings)


def run_ab(
    bench: ModelBench,
    settings: Sequence[tuple[str, str]],
    *,
    decode_batches: Sequence[int],
    context: int,
    decode_steps: int,
    on_progress: Callable[[str], None],
    rounds: int = 1,
) -> list[AbResult]:
    """Each setting's decode rows, then the base's again (setting ''), each with fresh graphs;
    the cycle `rounds` times (the list always ends with the base)."""
    return [
        AbResult(label, _rows(bench, decode_batches, context, decode_steps, on_progress, text))
        for label, text in cycle(settings, rounds)
    ]


def cycle(settings: Sequence[tuple[str, str]], rounds: int) -> Iterator[tuple[str, str]]:
    """The A/B order: each setting, then the base, the whole cycle `rounds` times. Yields
    (label: NAME=VALUE, '' for the base; a progress text) with the setting in the environment
    while the caller times that side (`ninfer bench --ab`, and `--spec` rounds' pieces)."""
    for r in range(rounds):
        of = f" (round {r + 1} of {rounds})" if rounds > 1 else ""
        for name, value in settings:
            label = f"{name}={value}"
            with setting(name, value):
                yield label, label + of
        yield "", f"the base again{of}"


def _rows(
    bench: ModelBench,
    decode_batches: Sequence[int],
    context: int,
    steps: int,
    on_progress: Callable[[str], None],
    label: str,
) -> list[DecodeResult]:
    bench.recapture()
    gc.collect()
    torch.cuda.empty_cache()
    rows = []
    for b in decode_batches:
        on_progress(f"A/B, {label}: decode batch {b} at {context} context")
        rows.append(bench.decode(b, context, steps=steps, use_graphs=bench.graphs is not None))
    return rows
