"""`python -m support.scripted_serve`: a live server whose engine runs a ScriptedRunner.

The engine, tokenizer, template, output decoder and HTTP server are the real ones loaded from the
demo artifact; only the model runner is replaced. Scripts (see SCRIPTS) are selected by a trigger
string in the prompt. Used by the e2e protocol tests; not part of the CLI.
"""

from __future__ import annotations

import argparse
import re
import sys

from ninfer.api import Engine
from ninfer.artifact.demo import ensure_demo
from ninfer.server.config import ServerConfig
from ninfer.server.logs import configure_logging
from ninfer.server.request_log import RequestLog
from ninfer.server.run import run_server
from support.scripted_runner import ScriptedRunner

WEATHER_CALL = (
    "<think>\nThe user wants the weather; call the tool.\n</think>\n\n"
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)


def _echo_client(prompt: str) -> str:
    tag = re.search(r"client-\d+", prompt)
    word = tag.group(0) if tag else "nobody"
    return "<think>\nok\n</think>\n\n" + " ".join([word] * 12)


PROBE_MARKERS = ("SECRET_INSTR", "NEW_INSTR", "FIRST_TURN", "THOUGHT_MARK")
NAMESPACED_CALL = (
    "<think>\nns\n</think>\n\n<tool_call>\n<function=mcp__weather__get_current>\n<parameter=city>\nOslo\n</parameter>\n"
    "</function>\n</tool_call>"
)


# Agent tests (tests/e2e/test_serve_agents.py): a freeform apply_patch call, a local_shell call,
# two calls in one turn (parallel_tool_calls), and Claude Code's Bash tool.
PATCH_TEXT = "*** Begin Patch\n*** Add File: hello.txt\n+hello\n*** End Patch"
CODEX_PATCH = (
    "<think>\nTHOUGHT_MARK: add the file with apply_patch.\n</think>\n\n<tool_call>\n"
    f"<function=apply_patch>\n<parameter=input>\n{PATCH_TEXT}\n</parameter>\n</function>\n"
    "</tool_call>"
)
CODEX_SHELL = (
    "<think>\nlist first\n</think>\n\n<tool_call>\n<function=local_shell>\n"
    '<parameter=command>\n["ls", "-la"]\n</parameter>\n<parameter=working_directory>\n/tmp\n'
    "</parameter>\n</function>\n</tool_call>"
)
TWO_CALLS = (
    "<think>\ntwo\n</think>\n\n<tool_call>\n<function=shell>\n<parameter=command>\n"
    '["ls"]\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=shell>\n'
    '<parameter=command>\n["pwd"]\n</parameter>\n</function>\n</tool_call>'
)
CLAUDE_BASH = (
    "<think>\nTHOUGHT_MARK run it\n</think>\n\nRunning the tests.\n\n<tool_call>\n"
    "<function=Bash>\n<parameter=command>\npytest -q\n</parameter>\n<parameter=description>\n"
    "Run tests\n</parameter>\n</function>\n</tool_call>"
)


def _probe_history(prompt: str) -> str:
    # lower-case names, so a probe answer replayed in history never reads as a marker
    found = [f"{m.lower()}={'yes' if m in prompt else 'no'}" for m in PROBE_MARKERS]
    return "<think>\nprobe\n</think>\n\n" + " ".join(found)


SCRIPTS = [
    ("TOOL_RESULT_SUNNY", lambda p: "<think>\nGot it.\n</think>\n\nIt is sunny in Paris."),
    ("WEATHER?", lambda p: WEATHER_CALL),
    ("REASON", lambda p: "<think>\nLet me think about it.\n</think>\n\nThe answer is 42."),
    ("STOPWORD", lambda p: "<think>\nx\n</think>\n\nalpha beta STOP gamma delta"),
    ("client-", _echo_client),
    ("SLOW", lambda p: "<think>\nslow\n</think>\n\ndone"),
    ("LONG", lambda p: "<think>\nlong\n</think>\n\n" + " ".join(["word"] * 2000)),
    # Responses tests: which markers reached the prompt (history, instructions, kept reasoning)
    ("PROBE_HISTORY", _probe_history),
    ("FIRST_TURN", lambda p: "<think>\nTHOUGHT_MARK\n</think>\n\nfirst answer"),
    ("FORECAST_NS", lambda p: NAMESPACED_CALL),
    # Thinking-budget tests: reasoning far longer than any budget they set
    ("BUDGETED", lambda p: "<think>\n" + " ".join(["step"] * 1500) + "\n</think>\n\ndone"),
    # Assistant-prefill tests: the continuation of an open assistant turn (no thinking block)
    ("CONTINUE_ME", lambda p: " and continued."),
    ("CODEX_PATCH", lambda p: CODEX_PATCH),
    ("CODEX_SHELL", lambda p: CODEX_SHELL),
    ("TWO_CALLS", lambda p: TWO_CALLS),
    ("CLAUDE_BASH", lambda p: CLAUDE_BASH),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--max-concurrency", type=int, default=2)
    ap.add_argument("--max-pending-requests", type=int, default=4)
    ap.add_argument("--step-delay", type=float, default=0.0)
    ap.add_argument("--first-token-delay", type=float, default=0.0)
    # observability knobs (ServerConfig fields; the keep-alive and delivery ones are not CLI flags)
    ap.add_argument("--keepalive-ms", type=int, default=5000)
    ap.add_argument("--delivery-timeout-ms", type=int, default=30000)
    ap.add_argument("--request-log-jsonl", default=None)
    ap.add_argument("--log-stats-interval-ms", type=int, default=0)
    ap.add_argument("--pending-timeout-ms", type=int, default=30000)
    ap.add_argument("--max-request-mib", type=int, default=ServerConfig.max_request_mib)
    args = ap.parse_args()
    configure_logging("info")
    engine = Engine.load(
        ensure_demo(),
        dtype="fp32",
        max_context=2048,
        max_concurrency=args.max_concurrency,
        max_pending_requests=args.max_pending_requests,
        pending_timeout_ms=args.pending_timeout_ms,
    )
    engine.core.runner = ScriptedRunner(
        engine.tokenizer,
        SCRIPTS,
        step_delay_s=args.step_delay,
        first_token_delay_s=args.first_token_delay,
    )
    config = ServerConfig(
        port=args.port,
        keepalive_s=args.keepalive_ms / 1000.0,
        delivery_timeout_s=args.delivery_timeout_ms / 1000.0,
        request_log_jsonl=args.request_log_jsonl,
        log_stats_interval_ms=args.log_stats_interval_ms,
        argv=tuple(sys.argv),
        max_request_mib=args.max_request_mib,
    )
    request_log = RequestLog.open(args.request_log_jsonl) if args.request_log_jsonl else None
    try:
        run_server(engine, config, request_log)
    finally:
        engine.close()


if __name__ == "__main__":
    main()
