"""A live `ninfer serve` subprocess for e2e tests: start on a free port, wait for readiness, stop.

Readiness is the server's own "ready:" stderr record (no polling sleeps); stderr lines are kept so
tests can assert operational records.
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

START_TIMEOUT_S = 90.0
PORT_ATTEMPTS = 3
PORT_TAKEN = "already in use"  # the server's bind error (errno EADDRINUSE)
MODEL_ID = "ninfer-demo-random"
BASE_ARGS = ("--dtype", "fp32", "--max-context", "512")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ServeProcess:
    """`ninfer serve ARGS`, or with `scripted=True` the scripted-engine server of the tests."""

    def __init__(self, *args: str, scripted: bool = False) -> None:
        # free_port() only finds a port that was free a moment ago: another test process (xdist
        # workers run in parallel) may take it first, so a start that lost it tries a new one
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                self._start(args, scripted)
                return
            except AssertionError:
                self.stop()
                if attempt == PORT_ATTEMPTS or not any(PORT_TAKEN in line for line in self.log):
                    raise

    def _start(self, args: tuple[str, ...], scripted: bool) -> None:
        self.port = free_port()
        if scripted:
            cmd = [sys.executable, "-m", "support.scripted_serve", "--port", str(self.port)]
        else:
            cmd = [sys.executable, "-m", "ninfer.cli.app", "serve", *BASE_ARGS]
            cmd += ["--port", str(self.port)]
        path = os.pathsep.join(p for p in (TESTS_DIR, os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
        self.proc = subprocess.Popen(
            [*cmd, *args], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        self.wait_for_log("ready:", START_TIMEOUT_S)

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for_log(self, needle: str, timeout_s: float = 30.0) -> str:
        """The first not-yet-seen stderr line containing `needle`."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no stderr line with {needle!r}; got {self.log}") from None
            if line is None:
                raise AssertionError(f"server exited {self.proc.wait()}; stderr: {self.log}")
            self.log.append(line)
            if needle in line:
                return line

    def settled(self, request_id: str, timeout_s: float = 30.0) -> str:
        """The request's one operational terminal line (written after its JSONL terminal)."""
        needle = f"request {request_id} "
        for line in self.log:
            if needle in line:
                return line
        return self.wait_for_log(needle, timeout_s)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def connection(self, timeout: float = 60.0) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ) -> tuple[int, dict[str, str], Any]:
        conn = self.connection()
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        hdrs = {"content-type": "application/json", **(headers or {})}
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        payload = resp.read()
        conn.close()
        out_headers = {k.lower(): v for k, v in resp.getheaders()}
        try:
            parsed = json.loads(payload) if payload else None
        except json.JSONDecodeError:
            parsed = payload.decode()
        return resp.status, out_headers, parsed

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


@contextmanager
def serve(*args: str, scripted: bool = False) -> Iterator[ServeProcess]:
    server = ServeProcess(*args, scripted=scripted)
    try:
        yield server
    finally:
        server.stop()


def sse_events(resp: http.client.HTTPResponse) -> Iterator[str]:
    """The raw SSE lines (data and comments) of a streaming response, blank lines dropped."""
    while True:
        line = resp.readline()
        if not line:
            return
        text = line.decode().rstrip("\r\n")
        if text:
            yield text
