"""`python -m support.body_memory`: peak server memory per MiB of request body, by body shape.

Starts `ninfer serve` on the demo artifact (CPU), then for each body shape and endpoint posts one
body of --mib MiB and reads the server's peak RSS growth over that request (Linux: VmHWM is reset
through /proc/PID/clear_refs before each request). The numbers back the --max-request-mib default
in docs/serving.md; run from the repository's tests/ directory (PYTHONPATH=../src:.).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from e2e.serve_process import MODEL_ID, serve

MiB = 1 << 20


def _long_text(n: int) -> dict:
    line = "The quick brown fox jumps over the lazy dog; the tokenizer counts words here.\n"
    return {"messages": [{"role": "user", "content": line * (n // len(line))}]}


def _many_messages(n: int) -> dict:
    one = {"role": "user", "content": "short message number one"}
    size = len(json.dumps(one)) + 2
    roles = ["user", "assistant"]
    return {
        "messages": [
            {"role": roles[i % 2], "content": one["content"]} for i in range((n // size) | 1)
        ]
    }


def _digits(n: int) -> dict:
    return {"messages": [{"role": "user", "content": "1234567890" * (n // 10)}]}


def _one_word(n: int) -> dict:  # no cut point: the tokenizer's worst case
    return {"messages": [{"role": "user", "content": "ab" * (n // 2)}]}


def _escaped(n: int) -> dict:  # 6 body bytes per character
    return {"messages": [{"role": "user", "content": "é\u4e2d" * (n // 12)}]}


SHAPES: dict[str, Callable[[int], dict]] = {
    "long-text": _long_text,
    "many-messages": _many_messages,
    "digits": _digits,
    "one-word": _one_word,
    "escaped": _escaped,
}
ENDPOINTS = {
    "count_tokens": ("/v1/messages/count_tokens", {"model": MODEL_ID}),
    "chat": ("/v1/chat/completions", {"model": MODEL_ID, "max_tokens": 1}),
}


def _status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=16)
    args = ap.parse_args()
    limit = str(args.mib * 2 + 1)
    with serve("--max-request-mib", limit, "--max-context", "8192") as server:
        pid = server.proc.pid
        print(f"{'shape':14s} {'endpoint':13s} {'body MiB':>8s} {'status':>6s} "
              f"{'peak +MiB':>9s} {'per MiB':>7s} {'kept +MiB':>9s}")  # fmt: skip
        for shape, build in SHAPES.items():
            for name, (path, extra) in ENDPOINTS.items():
                raw = json.dumps({**extra, **build(args.mib * MiB)}).encode()
                before = _status(pid)["VmRSS"]
                Path(f"/proc/{pid}/clear_refs").write_text("5")  # reset VmHWM to VmRSS
                conn = server.connection(timeout=1200)
                conn.request("POST", path, body=raw, headers={"content-type": "application/json"})
                response = conn.getresponse()
                status = response.status
                response.read()
                conn.close()
                after = _status(pid)
                peak = (after["VmHWM"] - before) / MiB
                size = len(raw) / MiB
                print(f"{shape:14s} {name:13s} {size:8.1f} {status:6d} {peak:9.0f} "
                      f"{peak / size:7.1f} {(after['VmRSS'] - before) / MiB:9.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
