"""run_bench's `--compare hf` options: checked without a GPU; ninfer's matrix holds HF's cells."""

from __future__ import annotations

import pytest

from ninfer.bench.run import BenchError, BenchOptions, check_compare, widened_matrix


def test_ninfer_matrix_is_widened_to_every_hf_cell() -> None:
    opts = BenchOptions(
        synthetic="tiny-dense",
        prefill_sizes=(8192, 512),
        decode_batches=(2, 1),
        compare="hf",
        hf_prefill_sizes=(2048, 512),
        hf_decode_batches=(8, 1),
    )
    assert widened_matrix(opts) == ((512, 2048, 8192), (1, 2, 8))


def test_without_compare_the_matrix_is_untouched() -> None:
    opts = BenchOptions(synthetic="tiny-dense", prefill_sizes=(8192, 512), decode_batches=(4,))
    assert widened_matrix(opts) == ((8192, 512), (4,))
    check_compare(opts)  # nothing to check


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"compare": "HF"}, "--compare takes 'hf'"),
        ({"compare": "hf", "weights": "fp8"}, "bf16 only"),
        ({"compare": "hf", "hf_decode_steps": 0}, "must be positive"),
        ({"compare": "hf", "hf_prefill_sizes": (0,)}, "must be positive"),
        ({"compare": "hf", "hf_decode_batches": ()}, "at least one positive HF decode batch"),
    ],
)
def test_bad_compare_options_are_bench_errors(changes: dict[str, object], message: str) -> None:
    opts = BenchOptions(synthetic="tiny-dense", **changes)  # type: ignore[arg-type]
    with pytest.raises(BenchError, match=message):
        check_compare(opts)


def test_defaults_are_the_small_hf_matrix() -> None:
    opts = BenchOptions(synthetic="qwen3.6-27b", compare="hf")
    assert (opts.hf_prefill_sizes, opts.hf_decode_batches) == ((2048,), (1, 8))
    check_compare(opts)
