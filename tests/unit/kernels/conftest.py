"""Kernel tests: a fresh CUDA generator per test, so every GPU run draws new random inputs.

A test module that needs fixed inputs defines its own `gen` fixture, which takes precedence.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator("cuda").manual_seed(torch.seed() % 2**31)
