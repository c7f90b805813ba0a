"""`NINFER_KERNELS_OFF` / `NINFER_KERNELS_ON`: comma-separated names that switch a kernel or a
kernel variant off (one on by default) or on (an opt-in variant that measured slower, kept for A/B).

Imports the standard library only, so the runtime, the launchers and dispatch can all ask it.
Read per call (an environment lookup), so a process can compare both sides of a switch.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


def switched_off(name: str) -> bool:
    """`name` begins an entry of NINFER_KERNELS_OFF (entries may carry a suffix, e.g. a test
    name, so a failing test's id switches its op off)."""
    return _named("NINFER_KERNELS_OFF", name)


def switched_on(name: str) -> bool:
    """`name` begins an entry of NINFER_KERNELS_ON: an opt-in variant, off unless named."""
    return _named("NINFER_KERNELS_ON", name)


def _named(variable: str, name: str) -> bool:
    entries = os.environ.get(variable, "").split(",")
    return any(e.strip().startswith(name) for e in entries if e.strip())


@contextlib.contextmanager
def setting(name: str, value: str) -> Iterator[None]:
    """Environment variable `name` = `value` inside, restored (or removed) after: one side of a
    switch A/B in a running process (benchmarks; kernels launched or captured inside see it)."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old
