"""Shared pytest configuration: GPU tests skip cleanly where CUDA is absent, and a bare `pytest`
(the CI command) runs on two xdist workers where pytest-xdist is installed (the `[test]` extra).

A run that names paths, or passes `-n`/`--dist`/`-p no:xdist`, is left as given: a targeted run
stays in one process. Workers take whole files (`--dist loadfile`, in collection order), so each
module-scoped live server still starts once. Each worker runs torch on one intra-op thread (two
workers already fill the two CI cores; OpenMP spin-waiting on a busy core made tiny ops many times
slower), and passes OMP_NUM_THREADS=1 on to the servers and CLI commands it starts.
"""

from __future__ import annotations

import os

import pytest

WORKERS = 2


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    opt = config.option
    if (
        not config.pluginmanager.hasplugin("xdist")
        or hasattr(config, "workerinput")
        or config.args_source != pytest.Config.ArgsSource.TESTPATHS
        or getattr(opt, "numprocesses", None) is not None
        or getattr(opt, "dist", "no") != "no"
        or opt.collectonly
        or opt.usepdb
    ):
        return
    opt.numprocesses = WORKERS
    opt.dist = "loadfile"
    # files in collection order (tests/e2e first: few tests, long server-bound files); xdist's
    # default reorder by test count would leave those for last and one worker idle at the end
    opt.loadscopereorder = False


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the servers and CLIs a test starts
        import torch

        torch.set_num_threads(1)
    elif getattr(config.option, "dist", "no") != "no":
        _build_demo_once()


def _build_demo_once() -> None:
    """Workers must not both build the missing demo artifact: they would write one partial file."""
    from ninfer.artifact.demo import demo_path, ensure_demo

    if not demo_path().is_file():
        ensure_demo()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
