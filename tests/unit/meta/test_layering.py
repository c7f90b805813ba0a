"""The one-way layering of docs/architecture.md, checked on every module's imports (AST walk).

A rule names what a package must NOT import. Lazy imports inside functions count too: a layer
that reaches upward at run time breaks the design as surely as one that does so at import time.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[3] / "src" / "ninfer"

UPPER = {"ninfer.cli", "ninfer.server"}
FORBIDDEN: dict[str, set[str]] = {
    # pure codecs and text: no tensors, no HTTP framework, no engine internals
    "protocol": {"torch", "sanic", "cupy", "ninfer.engine", "ninfer.model", "ninfer.kernels"}
    | UPPER,
    "chat": {
        "torch",
        "sanic",
        "cupy",
        "ninfer.engine",
        "ninfer.model",
        "ninfer.kernels",
        "ninfer.protocol",
    }
    | UPPER,
    "tokenizer": {
        "torch",
        "sanic",
        "ninfer.engine",
        "ninfer.model",
        "ninfer.chat",
        "ninfer.protocol",
        "ninfer.artifact",
    }
    | UPPER,
    "engine": {"sanic", "ninfer.protocol", "ninfer.chat"} | UPPER,
    "model": {"sanic", "ninfer.engine", "ninfer.protocol", "ninfer.chat"} | UPPER,
    "kernels": {"sanic", "ninfer.engine", "ninfer.model", "ninfer.protocol", "ninfer.chat"} | UPPER,
    "artifact": {
        "sanic",
        "ninfer.engine",
        "ninfer.model",
        "ninfer.kernels",
        "ninfer.protocol",
        "ninfer.chat",
        "ninfer.tokenizer",
        "ninfer.media",
        "ninfer.testing",
    }
    | UPPER,
    "testing": {"sanic", "ninfer.server", "ninfer.protocol", "transformers"},
    "media": {"sanic", "ninfer.engine", "ninfer.model", "ninfer.protocol"} | UPPER,
    # `ninfer bench` drives model/engine/kernels directly (`--e2e`: the public Engine); no HTTP
    # or text layers
    "bench": {"sanic", "ninfer.protocol", "ninfer.chat"} | UPPER,
}
# artifact/ is a leaf with two named exceptions: the converter assembles an artifact from a
# checkpoint, the tokenizer and the packaged template, so it alone may read those two; the demo
# builds its tiny checkpoint with testing/. Keyed by module, so no other module inherits them.
ALLOWED_EXCEPTIONS = {
    ("artifact/convert.py", "ninfer.chat.template"),
    ("artifact/convert.py", "ninfer.tokenizer"),
    ("artifact/demo.py", "ninfer.testing"),
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def _violations(package: str, module: str, imported: set[str]) -> list[str]:
    bad = []
    for name in imported:
        for banned in FORBIDDEN[package]:
            if name == banned or name.startswith(banned + "."):
                if (module, name) in ALLOWED_EXCEPTIONS or (
                    module,
                    name.rsplit(".", 1)[0],
                ) in ALLOWED_EXCEPTIONS:
                    continue
                bad.append(f"{module} imports {name} (banned in {package}/: {banned})")
    return bad


MODULES = sorted(SRC.rglob("*.py"))


def test_every_package_has_a_rule_or_is_top_level() -> None:
    packages = {p.relative_to(SRC).parts[0] for p in MODULES if len(p.relative_to(SRC).parts) > 1}
    assert packages - set(FORBIDDEN) <= {"cli", "server"}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_module_respects_layering(path: Path) -> None:
    parts = path.relative_to(SRC).parts
    if len(parts) == 1 or parts[0] not in FORBIDDEN:
        return
    assert _violations(parts[0], str(path.relative_to(SRC)), _imports(path)) == []


def test_checker_catches_a_violation() -> None:
    assert _violations("chat", "chat/x.py", {"torch.nn"}) == [
        "chat/x.py imports torch.nn (banned in chat/: torch)"
    ]
    assert _violations("engine", "engine/x.py", {"ninfer.protocol.openai_chat"})
    assert not _violations("artifact", "artifact/convert.py", {"ninfer.chat.template"})
    # an exception belongs to its module, and covers only the module it names
    assert _violations("artifact", "artifact/reader.py", {"ninfer.chat.template"})
    assert _violations("artifact", "artifact/convert.py", {"ninfer.chat.output_decoder"})
    assert _violations("artifact", "artifact/demo.py", {"ninfer.media.layout"})
