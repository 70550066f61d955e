"""`pythonic`: the answer is a Python list of calls, [get_weather(city="Paris"), f(x=1)] (Llama 3.2
and Llama 4 when prompted so, ToolACE), optionally inside <|python_start|> … <|python_end|>. The
arguments are Python literals, written out as JSON, so a call is sent whole once the list ends."""

from __future__ import annotations

import ast
import json

from llmctl.server.tool_parsers.base import ParsedText, ToolCallDraft, ToolParser, ToolParserManager

START, END = "<|python_start|>", "<|python_end|>"


@ToolParserManager.register_module(["pythonic", "llama4_pythonic"])
class PythonicToolParser(ToolParser):
    def parse(self, text: str, final: bool) -> ParsedText:
        body = text.strip()
        body = body[len(START):] if body.startswith(START) else body
        body = body[:-len(END)] if body.endswith(END) else body
        body = body.strip()
        if not body.startswith("["):
            undecided = not final and (START.startswith(text.strip()) or not body)
            return ParsedText("" if undecided else text)
        calls = _calls(body)
        if calls is None:  # not (yet) a list of calls
            return ParsedText(text if final else "")
        return ParsedText("", calls)


def _calls(body: str) -> list[ToolCallDraft] | None:
    try:
        tree = ast.parse(body, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(tree, ast.List) or not all(isinstance(e, ast.Call) for e in tree.elts):
        return None
    calls = []
    for call in tree.elts:
        assert isinstance(call, ast.Call)  # checked above, for the type checker
        try:
            arguments = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
        except ValueError:
            return None
        name = call.func.id if isinstance(call.func, ast.Name) else None
        if name is None or call.args or any(kw.arg is None for kw in call.keywords):
            return None
        try:  # bytes, sets or an overflow to inf are not JSON: the answer is no list of calls
            calls.append(ToolCallDraft(name, json.dumps(arguments, ensure_ascii=False, allow_nan=False), True))
        except (TypeError, ValueError):
            return None
    return calls
