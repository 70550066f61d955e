"""A remote replica's outputs travel as what is new (llmctl.engine.front.output_deltas): the API server's
side rebuilds exactly the RequestOutputs the engine made — text, token ids and logprobs growing, a
request with two completions, an output that does not extend the last (sent whole) — and what crosses
is only the new part."""

from __future__ import annotations

import pickle

from llmctl.engine.core.sequence import TokenLogprob
from llmctl.engine.front.output_deltas import DeltaDecoder, DeltaEncoder
from llmctl.engine.front.outputs import CompletionOutput, RequestOutput


def output(request_id: str, texts: list[str], finished: bool = False, logprobs: bool = True) -> RequestOutput:
    completions = [CompletionOutput(index, text, [ord(c) for c in text],
                                    [TokenLogprob(ord(c), -0.5, 1) for c in text] if logprobs else None)
                   for index, text in enumerate(texts)]
    return RequestOutput(request_id, "a long prompt " * 50, list(range(300)), completions, finished)


def test_the_server_side_rebuilds_every_output_and_only_the_new_part_crosses():
    steps = [[output("a", ["H", "x"]), output("b", ["1"], logprobs=False)],
             [output("a", ["He", "xy"]), output("b", ["12"], logprobs=False)],
             [output("a", ["Hel", "xyz"]), output("b", ["0"], logprobs=False)],  # b not an extension: sent whole
             [output("a", ["Hello", "xyz"], finished=True), output("b", ["01"], finished=True, logprobs=False)]]
    encoder, decoder = DeltaEncoder(), DeltaDecoder()
    sizes = []
    for step in steps:
        deltas = encoder.encode(step)
        sizes.append(len(pickle.dumps(deltas)))
        assert decoder.decode(pickle.loads(pickle.dumps(deltas))) == step
        assert [d.whole for d in deltas] == [step is steps[0], step in (steps[0], steps[2])]
    assert sizes[1] < sizes[0] / 2  # the prompt and what was sent before do not cross again
    assert not encoder._sent and not decoder._held  # finished requests are forgotten on both sides
