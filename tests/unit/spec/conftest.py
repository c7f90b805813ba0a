"""Fixtures of the speculative tests: one bound tiny model per kind (tests/support/spec_engines)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from support.spec_engines import Tiny, bind_tiny


@pytest.fixture(autouse=True, scope="module")
def _one_intra_op_thread() -> Iterator[None]:
    """Tiny ops on a 2-core machine: OpenMP spin-waiting costs more than it gains."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session", params=["dense", "moe"])
def tiny(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Tiny]:
    t = bind_tiny(tmp_path_factory.mktemp(f"spec-{request.param}"), request.param)
    yield t
    t.artifact.close()


@pytest.fixture(scope="session")
def dense(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiny]:
    t = bind_tiny(tmp_path_factory.mktemp("spec-dense-only"), "dense")
    yield t
    t.artifact.close()
