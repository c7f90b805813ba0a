"""Scrape /metrics in a loop while N chat streams decode, and print the scrape latencies.

    ninfer serve --max-concurrency 8 --greedy &
    python examples/metrics_under_load.py http://127.0.0.1:8080 --streams 8 --max-tokens 64

The scrape reads the engine's last published snapshot; it never waits for the engine worker.
What it costs is the handler's formatting plus whatever the event loop and the CPU are busy with.
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import threading
import time
from urllib.parse import urlparse

import openai


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("base_url", help="the server, e.g. http://127.0.0.1:8080")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--api-key", default="unused")
    args = ap.parse_args()
    url = urlparse(args.base_url)
    client = openai.OpenAI(base_url=args.base_url + "/v1", api_key=args.api_key, max_retries=0)
    model = client.models.list().data[0].id
    start = threading.Barrier(args.streams + 1)

    def stream(i: int) -> None:
        start.wait()
        messages = [{"role": "user", "content": f"Count to {i + 3}."}]
        for _ in client.chat.completions.create(
            model=model, messages=messages, max_tokens=args.max_tokens, stream=True
        ):
            pass

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(args.streams)]
    for t in threads:
        t.start()
    start.wait()
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port or 80)
    headers = {"authorization": f"Bearer {args.api_key}"}
    latencies, widest = [], 0
    while any(t.is_alive() for t in threads):
        t0 = time.perf_counter()
        conn.request("GET", "/metrics", headers=headers)
        body = conn.getresponse().read().decode()
        latencies.append((time.perf_counter() - t0) * 1e3)
        for line in body.splitlines():
            if line.startswith("ninfer_requests_decode_ready "):
                widest = max(widest, int(float(line.split()[1])))
    for t in threads:
        t.join()
    latencies.sort()
    p = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))]  # noqa: E731
    print(
        f"{len(latencies)} scrapes while up to {widest} streams decoded together: "
        f"median {statistics.median(latencies):.2f} ms, p90 {p(0.9):.2f} ms, "
        f"p99 {p(0.99):.2f} ms, max {latencies[-1]:.2f} ms"
    )


if __name__ == "__main__":
    main()
