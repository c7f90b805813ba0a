"""What the GPU's clocks, power and temperature were while a benchmark ran (read only).

Imports only the standard library. Two machines of the same kind measured the same code 3-5 %
apart (docs/perf.md, runs U2/U3), and an 8k prefill's GEMMs ran at ~690 TFLOP/s sustained
against ~790 in a 2k one: the reports carry the SM clock, power draw, temperature and the
driver's active clock-event reasons (power cap, thermal) at the start and the end of the matrix
so such spreads can be told apart from code changes. It only asks `nvidia-smi`; it never
changes a setting. No `nvidia-smi`, or an answer it cannot read: None.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

FIELDS = (
    "clocks.sm",
    "clocks.max.sm",
    "clocks.mem",
    "power.draw",
    "power.limit",
    "temperature.gpu",
    "clocks_event_reasons.active",
)
# bits of clocks_event_reasons.active (nvidia-smi --help-query-gpu) worth naming in a report
REASONS = {
    0x1: "idle",
    0x4: "SW power cap",
    0x8: "HW slowdown",
    0x20: "SW thermal",
    0x40: "HW thermal",
    0x80: "HW power brake",
}


@dataclass(frozen=True)
class GpuState:
    sm_mhz: float
    max_sm_mhz: float
    mem_mhz: float
    power_w: float
    power_limit_w: float
    temperature_c: float
    reasons: int  # clocks_event_reasons.active bit mask

    @property
    def reason_names(self) -> list[str]:
        return [name for bit, name in REASONS.items() if self.reasons & bit]

    def describe(self) -> str:
        why = ", ".join(self.reason_names) or "none"
        return (
            f"SM {self.sm_mhz:.0f} of {self.max_sm_mhz:.0f} MHz, memory {self.mem_mhz:.0f} MHz, "
            f"{self.power_w:.0f} of {self.power_limit_w:.0f} W, {self.temperature_c:.0f} °C, "
            f"clock-event reasons: {why}"
        )


def parse(line: str) -> GpuState | None:
    """One CSV line of FIELDS (noheader, nounits), or None if it does not read as one."""
    parts = [p.strip() for p in line.strip().split(",")]
    if len(parts) != len(FIELDS):
        return None
    try:
        *values, reasons = parts
        numbers = [float(v) for v in values]
        mask = int(reasons, 16) if reasons.lower().startswith("0x") else int(reasons)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None
    return GpuState(*numbers, reasons=mask)


def query(uuid: str | None = None, *, timeout_s: float = 5.0) -> GpuState | None:
    """The state of the GPU with this UUID (torch's `get_device_properties(i).uuid`), else GPU 0.

    Older drivers call the last field `clocks_throttle_reasons.active`: asked again under that
    name if the first query fails.
    """
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    target = ["-i", uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"] if uuid else ["-i", "0"]
    for reasons in (FIELDS[-1], "clocks_throttle_reasons.active"):
        fields = ",".join((*FIELDS[:-1], reasons))
        cmd = [exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits", *target]
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return None
        if done.returncode == 0 and done.stdout.strip():
            return parse(done.stdout.strip().splitlines()[0])
    return None
