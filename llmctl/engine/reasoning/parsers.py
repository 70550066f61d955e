"""The reasoning parsers vLLM ships for the families llmctl serves, on text as it grows: while it
grows (`final=False`) a split only ever extends the previous one — a piece that may be the start of a
marker is held back — so a stream sends each piece once.

- `deepseek_r1`: everything up to </think> is reasoning, with or without a leading <think> (DeepSeek-R1's
  template opens <think> in the prompt); an answer that never closes it is all reasoning.
- `qwen3` (vLLM's current one): a leading <think> is dropped (Qwen3 up to 2507 writes it; Qwen3-Thinking-2507 and
  Qwen3.5 templates put it in the prompt); text up to </think> is reasoning, the rest the answer. Without
  </think>, a <tool_call> ends the reasoning (Qwen3.5 calls tools from inside it); else everything so far is
  reasoning (cut off while thinking). With thinking off — the request's chat_template_kwargs say
  enable_thinking: false, or the prompt already ends with </think> (vLLM's prompt_is_reasoning_end) — text is
  answer unless it opens <think> itself.

The others (seed_oss, mistral, step3, ernie45, minimax_m2, deepseek_v3, olmo3, glm45, hunyuan_a13b, granite)
say their rule where they are defined.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from llmctl.errors import LlmctlError


@dataclass(frozen=True)
class ReasoningSplit:
    reasoning: str | None  # None: the text holds no reasoning
    content: str


def held_back(text: str, marker: str) -> int:
    """Characters at the end of text that could be the start of marker (held until the next token says)."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


class ReasoningParser:
    start_token = "<think>"
    end_token = "</think>"
    keep_special_tokens = False  # the markers are special tokens the detokenizer would otherwise drop

    def __init__(self, thinking: bool = True, template_kwargs: dict[str, Any] | None = None) -> None:
        self.thinking = thinking  # False: the prompt turned thinking off (qwen3 reads it)
        self.template_kwargs = template_kwargs or {}  # the request's chat_template_kwargs (deepseek_v3 reads them)

    def split(self, text: str, final: bool) -> ReasoningSplit:
        raise NotImplementedError

    def _in_block(self, text: str, final: bool) -> ReasoningSplit:
        """Reasoning only inside a block the model opens at its start (leading whitespace allowed); an empty
        block is no reasoning; text that does not open one is answer."""
        if text.lstrip().startswith(self.start_token):
            split = self._after_start(text.lstrip()[len(self.start_token):], final)
            return ReasoningSplit(split.reasoning or None, split.content)
        if not final and self.start_token.startswith(text.lstrip()):
            return ReasoningSplit(None, "")  # blank so far, or the start of the opening marker
        return ReasoningSplit(None, text)

    def _after_start(self, body: str, final: bool) -> ReasoningSplit:
        """body: the text after an opening <think> (or from the start where the prompt opened it)."""
        reasoning, marker, content = body.partition(self.end_token)
        if marker:
            return ReasoningSplit(reasoning, content)
        return ReasoningSplit(body if final else body[:len(body) - held_back(body, self.end_token)], "")


P = TypeVar("P", bound=type[ReasoningParser])
ReasoningFactory = Callable[[], ReasoningParser]  # a parser for one message (a class, or one with `thinking` set)


class ReasoningParserManager:
    parsers: dict[str, type[ReasoningParser]] = {}

    @classmethod
    def register_module(cls, name: str) -> Callable[[P], P]:
        def register(parser: P) -> P:
            cls.parsers[name] = parser
            return parser

        return register

    @classmethod
    def get_reasoning_parser(cls, name: str) -> type[ReasoningParser]:
        if name not in cls.parsers:
            raise LlmctlError(f"--reasoning-parser {name!r} is not known; choose one of {', '.join(sorted(cls.parsers))}")
        return cls.parsers[name]


@ReasoningParserManager.register_module("deepseek_r1")
class DeepSeekR1ReasoningParser(ReasoningParser):
    def split(self, text: str, final: bool) -> ReasoningSplit:
        _, opened, rest = text.partition(self.start_token)
        if not opened and not final and self.start_token.startswith(text.lstrip()):
            return ReasoningSplit("", "")  # may still become <think>
        return self._after_start(rest if opened else text, final)


@ReasoningParserManager.register_module("qwen3")
class Qwen3ReasoningParser(ReasoningParser):
    tool_call = "<tool_call>"

    def split(self, text: str, final: bool) -> ReasoningSplit:
        stripped = text.lstrip()
        if stripped.startswith(self.start_token):
            return self._thinking(stripped[len(self.start_token):], final)
        if not final and self.start_token.startswith(stripped):
            return ReasoningSplit("" if self.thinking else None, "")  # may still become <think>
        return self._thinking(text, final) if self.thinking else ReasoningSplit(None, text)

    def _thinking(self, body: str, final: bool) -> ReasoningSplit:
        """Reasoning up to whichever comes first, </think> (dropped) or <tool_call> (the answer's start)."""
        ends = [(i, marker) for marker in (self.end_token, self.tool_call) if (i := body.find(marker)) >= 0]
        if ends:
            at, marker = min(ends)
            return ReasoningSplit(body[:at], body[at + len(marker):] if marker == self.end_token else body[at:])
        hold = 0 if final else max(held_back(body, self.end_token), held_back(body, self.tool_call))
        return ReasoningSplit(body[:len(body) - hold], "")


@ReasoningParserManager.register_module("seed_oss")
class SeedOssReasoningParser(DeepSeekR1ReasoningParser):
    """Seed-OSS: deepseek_r1's rule with <seed:think> and </seed:think>."""

    start_token, end_token = "<seed:think>", "</seed:think>"


@ReasoningParserManager.register_module("mistral")
class MistralReasoningParser(DeepSeekR1ReasoningParser):
    """Magistral: deepseek_r1's rule with [THINK] and [/THINK], special tokens kept in the text for it."""

    start_token, end_token = "[THINK]", "[/THINK]"
    keep_special_tokens = True


@ReasoningParserManager.register_module("step3")
@ReasoningParserManager.register_module("ernie45")
class Step3ReasoningParser(ReasoningParser):
    """Step 3 and ERNIE-4.5-Thinking: the template opens the thinking, so everything up to </think> is
    reasoning."""

    def split(self, text: str, final: bool) -> ReasoningSplit:
        return self._after_start(text, final)


@ReasoningParserManager.register_module("minimax_m2")
class MiniMaxM2ReasoningParser(ReasoningParser):
    """MiniMax-M2: everything up to </think> is reasoning (the model writes no <think>); a </think> the
    model writes again inside its answer is dropped from the content (vLLM's rule)."""

    def split(self, text: str, final: bool) -> ReasoningSplit:
        split = self._after_start(text, final)
        content = split.content.replace(self.end_token, "")
        return ReasoningSplit(split.reasoning, content if final else content[:len(content) - held_back(
            content, self.end_token)])


@ReasoningParserManager.register_module("deepseek_v3")
class DeepSeekV3ReasoningParser(DeepSeekR1ReasoningParser):
    """DeepSeek-V3.1 / V3.2: deepseek_r1's rule when the request's chat_template_kwargs turn thinking on
    (`thinking` or `enable_thinking` true, as their templates read it); otherwise everything is answer."""

    def split(self, text: str, final: bool) -> ReasoningSplit:
        if self.template_kwargs.get("thinking") or self.template_kwargs.get("enable_thinking"):
            return super().split(text, final)
        return ReasoningSplit(None, text)


@ReasoningParserManager.register_module("olmo3")
class Olmo3ReasoningParser(DeepSeekR1ReasoningParser):
    """OLMo 3 Think: deepseek_r1's rule, an empty reasoning being none."""

    def split(self, text: str, final: bool) -> ReasoningSplit:
        split = super().split(text, final)
        return ReasoningSplit(split.reasoning or None, split.content)


@ReasoningParserManager.register_module("glm45")
class Glm45ReasoningParser(ReasoningParser):
    """GLM-4.5 / 4.6: reasoning only inside the <think>…</think> the model writes. An unclosed block is
    reasoning (vLLM's stream; its whole answer calls it content)."""

    def split(self, text: str, final: bool) -> ReasoningSplit:
        return self._in_block(text, final)


@ReasoningParserManager.register_module("hunyuan_a13b")
class HunyuanA13bReasoningParser(ReasoningParser):
    """Hunyuan-A13B: <think>\n reasoning \n</think>\n<answer>\n answer \n</answer>; the answer's closing
    marker is dropped."""

    start_token, end_token, answer_end = "<think>\n", "\n</think>\n<answer>\n", "\n</answer>"

    def split(self, text: str, final: bool) -> ReasoningSplit:
        split = self._in_block(text, final)
        if not text.lstrip().startswith(self.start_token):
            return split  # no thinking: all answer
        content, closed, _ = split.content.partition(self.answer_end)
        if not closed and not final:
            content = content[:len(content) - held_back(content, self.answer_end)]
        return ReasoningSplit(split.reasoning, content)


@ReasoningParserManager.register_module("granite")
class GraniteReasoningParser(ReasoningParser):
    """Granite 3.2: "Here is my thought process:" opens the reasoning and "Here is my response:" the answer
    (or "Here's …", which vLLM also matches); text that does not open with it is answer. A reasoning never
    answered is reasoning (vLLM's stream; its whole answer calls it content)."""

    starts = ("Here is my thought process:", "Here's my thought process:")
    ends = ("Here is my response:", "Here's my response:")
    start_token, end_token = starts[0], ends[0]

    def split(self, text: str, final: bool) -> ReasoningSplit:
        opening = next((start for start in self.starts if text.startswith(start)), None)
        if opening is None:
            undecided = not final and any(start.startswith(text) for start in self.starts)
            return ReasoningSplit(None, "" if undecided else text)
        body = text[len(opening):]
        found = [(at, end) for end in self.ends if (at := body.find(end)) >= 0]
        if found:
            at, end = min(found)
            return ReasoningSplit(body[:at], body[at + len(end):])
        hold = 0 if final else max(held_back(body, end) for end in self.ends)
        return ReasoningSplit(body[:len(body) - hold], "")
