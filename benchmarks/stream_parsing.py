"""What a streamed tool call costs the server's parser: one call whose argument holds N KB of code, streamed
in 4-character deltas (about one token each) through StreamedMessage, with the incremental JSON scanner
(each delta resumes where the last scan stopped) and without it (each delta re-reads the call from its
start, as before) — alternating in one run. Prints seconds of CPU per streamed call.

    python benchmarks/stream_parsing.py [--kb 18 72] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from unittest import mock

from alternating import alternate, median_ratios

from llmctl.server import chat_message
from llmctl.server.chat_message import StreamedMessage, ToolCalling
from llmctl.server.tool_parsers import ToolParserManager


def streamed_call(kb: int) -> str:
    code = "x = 1\n" * (kb * 1000 // 6)
    return "<tool_call>\n" + json.dumps({"name": "write_file", "arguments": {"path": "a.py", "content": code}}) + \
        "\n</tool_call>"


def stream_seconds(text: str, incremental: bool) -> float:
    calling = ToolCalling(lambda: ToolParserManager.get_tool_parser("hermes")(), True)
    message = StreamedMessage(calling)
    ends = list(range(4, len(text), 4)) + [len(text)]
    scanner = contextlib.nullcontext() if incremental else \
        mock.patch.object(chat_message, "incremental", lambda memo: contextlib.nullcontext())
    with scanner:
        start = time.process_time()
        for end in ends:
            message.delta(text[:end], final=end == len(text))
        return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kb", type=int, nargs="+", default=[18, 72])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for kb in args.kb:
        text = streamed_call(kb)
        figures = alternate(["incremental", "re-read"], args.rounds,
                            lambda name: stream_seconds(text, name == "incremental"))
        for name, (median, ratio) in median_ratios(figures, "incremental").items():
            print(f"{kb} KB call, {len(text) // 4} deltas, {name}: {median:.2f} s CPU ({ratio:.1f}× incremental)")


if __name__ == "__main__":
    main()
