"""`--device`: the one spelling every command accepts (auto, cpu, cuda, cuda:N, N).

`parse_device` is pure, so a typo fails before anything heavy is imported; `check_device` asks
torch what `auto` means here and fails before a model is loaded when a named GPU is absent.
"""

from __future__ import annotations

from ninfer.cli.errors import UserError

DEVICE_FORMS = "auto, cpu, cuda, cuda:N or N"


def parse_device(text: str) -> str:
    """The engine's name for a `--device` value: auto, cpu, cuda or cuda:N."""
    value = text.strip().lower()
    if value in ("auto", "cpu", "cuda"):
        return value
    if value.isdigit():
        return f"cuda:{int(value)}"
    prefix, sep, index = value.partition(":")
    if prefix == "cuda" and sep and index.isdigit():
        return f"cuda:{int(index)}"
    raise UserError(f"--device {text!r}: expected {DEVICE_FORMS} (a CUDA device index)")


def check_device(device: str) -> str:
    """The concrete device for `device` (auto: cuda:0 when torch sees a GPU, else cpu); fails now
    when it names a CUDA device this machine does not have."""
    import torch

    if device == "auto":
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if not device.startswith("cuda"):
        return device

    if not torch.cuda.is_available():
        raise UserError(f"--device {device}: no CUDA device is available (try --device cpu)")
    index = int(device.partition(":")[2] or 0)
    count = torch.cuda.device_count()
    if index >= count:
        raise UserError(
            f"--device {device}: this machine has {count} CUDA device(s), 0..{count - 1}"
        )
    return device


def cuda_device(text: str) -> str:
    """`--device` for commands that need a GPU (bench): auto and cuda mean cuda:0."""
    device = parse_device(text)
    if device == "cpu":
        raise UserError("--device cpu: this command needs a CUDA device")
    return "cuda:0" if device in ("auto", "cuda") else device
