"""The serve ready line's option words: what a reader of the log learns of --spec and
--decode-tiles, and nothing for a plain server (its line stays as before)."""

from __future__ import annotations

from ninfer.engine.options import EngineOptions
from ninfer.server.run import _option_words


def test_plain_options_add_no_words() -> None:
    assert _option_words(EngineOptions()) == ""


def test_spec_and_tiles_are_named() -> None:
    spec = EngineOptions(spec="mtp", draft_tokens=2, lm_head_draft=True)
    assert _option_words(spec) == " spec=mtp draft_tokens=2 lm_head_draft"
    tiles = EngineOptions(device="cuda", decode_tiles=True)
    assert _option_words(tiles) == " decode_tiles"
    both = EngineOptions(device="cuda", spec="mtp", decode_tiles=True)
    assert _option_words(both) == " spec=mtp draft_tokens=3 decode_tiles"
