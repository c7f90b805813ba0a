"""Prefix-cache candidates from the chat layer: explicit content marks mapped to exact token
offsets of the real prompt (or ignored when no token boundary or rendering allows it, never
changing the prompt), and the engine candidates of `prompt_checkpoints` (input checkpoint before
the generation prologue, implicit candidate before the latest content's closing token, at most
four explicit writes, the latest ones)."""

from __future__ import annotations

import pytest

from ninfer.chat.cache_hints import prompt_checkpoints
from ninfer.chat.template import TOOLS, ChatTemplate, ContentMark, load_default_template
from ninfer.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.qwen3_5()


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    return ChatTemplate(load_default_template())


def _ids(tokenizer, template, messages, marks, **kw):
    ids, offsets = template.render_ids_marked(tokenizer, messages, marks, **kw)
    assert ids == template.render_ids(tokenizer, messages, **kw)  # marks never change a prompt
    return ids, offsets


CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hello world, how are you?  \n"},
    {"role": "assistant", "content": "Fine.", "reasoning_content": "ok"},
    {"role": "user", "content": "Tell me <b>more</b> please"},
]


def test_marks_at_content_ends_sit_before_the_closing_token(tokenizer, template) -> None:
    im_end = tokenizer.special_tokens["<|im_end|>"]
    marks = [ContentMark(0), ContentMark(1), ContentMark(3)]
    ids, offsets = _ids(tokenizer, template, CONVERSATION, marks)
    closings = [i for i, t in enumerate(ids) if t == im_end]
    # system, user (trailing whitespace trimmed by the template), last user
    assert offsets == [closings[0], closings[1], closings[3]]


def test_marks_inside_content_map_to_token_boundaries_only(tokenizer, template) -> None:
    text = CONVERSATION[3]["content"]
    marks = [
        ContentMark(3, text.index(" <b>")),  # a word boundary
        ContentMark(3, text.index("more") + 2),  # inside "more": no token boundary there
        ContentMark(3, text.index("<b>") + 1),  # after an escaped "<": still exact
        ContentMark(9),  # no such message
        ContentMark(1, 1000),  # beyond the content
    ]
    ids, offsets = _ids(tokenizer, template, CONVERSATION, marks)
    start = len(ids) - 1 - ids[::-1].index(tokenizer.special_tokens["<|im_start|>"], 6)
    head = tokenizer.encode_text("Tell me")
    assert offsets[0] is not None and ids[offsets[0] - len(head) : offsets[0]] == head
    assert offsets[0] - len(head) > start
    assert offsets[1] is None and offsets[3] is None and offsets[4] is None
    if offsets[2] is not None:  # "<" alone may or may not be a token of its own
        assert tokenizer.decode(ids[offsets[0] : offsets[2]]).endswith("<")


def test_a_mark_that_changes_rendering_is_ignored(tokenizer, template) -> None:
    # The template trims contents: a sentinel before leading whitespace would keep it.
    messages = [
        {"role": "user", "content": "  \n q"},
        {"role": "assistant", "content": "a", "reasoning_content": "r"},
        {"role": "user", "content": "next"},
    ]
    ids, offsets = _ids(tokenizer, template, messages, [ContentMark(0, 0), ContentMark(2)])
    assert offsets[0] is None  # the disturbing mark alone is dropped ...
    assert offsets[1] is not None  # ... the other one still placed
    assert ids[offsets[1]] == tokenizer.special_tokens["<|im_end|>"]


def test_prompt_checkpoints_precedence(tokenizer, template) -> None:
    specials = tokenizer.special_tokens
    im_start, im_end = specials["<|im_start|>"], specials["<|im_end|>"]
    ids = template.render_ids(tokenizer, CONVERSATION)
    prologue = len(ids) - 1 - ids[::-1].index(im_start)
    closing = prologue - 2  # "<|im_end|>" "\n" before "<|im_start|>"
    assert ids[closing] == im_end and tokenizer.decode(ids[prologue:]).startswith("<|im_start|>")
    kw = {"im_start": im_start, "im_end": im_end}
    assert prompt_checkpoints(ids, **kw) == (closing, prologue)
    assert prompt_checkpoints(ids, implicit=False, **kw) == (prologue,)
    assert prompt_checkpoints(ids, markers=[5, None, 9], **kw) == (5, 9, closing, prologue)
    # five explicit markers: the latest four stay, and they leave no slot for the implicit one
    assert prompt_checkpoints(ids, markers=[3, 4, 5, 6, 7], **kw) == (4, 5, 6, 7, prologue)
    # offsets outside the prompt are not candidates
    assert prompt_checkpoints(ids, markers=[0, len(ids)], implicit=False, **kw) == (prologue,)


def test_the_tools_mark_ends_the_tool_declarations(tokenizer, template) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    user = [{"role": "user", "content": "hi"}]
    ids, offsets = _ids(tokenizer, template, user, [ContentMark(TOOLS)], tools=tools)
    assert offsets[0] == ids.index(tokenizer.special_tokens["<|im_end|>"])  # tools-only turn
    system = [{"role": "system", "content": "Rules."}] + user
    ids, offsets = _ids(tokenizer, template, system, [ContentMark(TOOLS)], tools=tools)
    assert offsets[0] is not None
    assert tokenizer.decode(ids[: offsets[0]]).endswith("</IMPORTANT>\n\n")
    assert tokenizer.decode(ids[offsets[0] :]).startswith("Rules.<|im_end|>")
    _, offsets = _ids(tokenizer, template, user, [ContentMark(TOOLS)])  # no tools: no boundary
    assert offsets == [None]
