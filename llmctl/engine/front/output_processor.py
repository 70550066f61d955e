"""The output processor: per request, each sequence's detokenized text, stop strings and the
RequestOutput users receive. The scheduler asks it, token by token, whether a stop string
has appeared (TokenText); everything else about a request's output is decided here."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import torch

from llmctl.engine.core.sequence import Sequence
from llmctl.engine.front.detokenizer import IncrementalDetokenizer
from llmctl.engine.front.outputs import CompletionOutput, RequestMetrics, RequestOutput
from llmctl.engine.lora.adapter import LoRAAdapter
from llmctl.engine.multimodal.items import MultimodalItem
from llmctl.engine.multimodal.mrope import MRopePositions
from llmctl.engine.pooling.config import PoolerConfig
from llmctl.engine.pooling.outputs import finish_pooled
from llmctl.engine.pooling.params import PoolingOutput, PoolingParams, PoolingRequestOutput
from llmctl.engine.sampling_params import SamplingParams
from llmctl.engine.structured.matcher import GrammarMatcher


@dataclass
class SeqText:
    detokenizer: IncrementalDetokenizer
    text: str = ""  # after stop handling
    searched: int = 0  # text length already searched for stop strings
    flushed: bool = False  # finished by length: the held-back characters were emitted


@dataclass
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    lora: LoRAAdapter | None = None
    grammar: GrammarMatcher | None = None  # structured outputs: the first sequence's matcher
    seqs: list[Sequence] = field(default_factory=list)
    texts: dict[int, SeqText] = field(default_factory=dict)  # by seq_id
    mm_items: list[MultimodalItem] = field(default_factory=list)  # the prompt's images (llmctl.engine.multimodal)
    mrope: MRopePositions | None = None  # M-RoPE models: the prompt's (t, h, w) positions
    pooling: PoolingParams | None = None  # a pooling request (llmctl.engine.pooling): one output, no tokens

    @property
    def finished(self) -> bool:
        return len(self.seqs) == self.params.n and all(s.is_finished for s in self.seqs)


class OutputProcessor:
    def __init__(self, tokenizer: Any, pooler: PoolerConfig | None = None) -> None:
        self.tokenizer = tokenizer
        self.pooler = pooler
        self.requests: dict[str, Request] = {}
        self._seq_ids = itertools.count()

    def add(self, request: Request) -> Sequence:
        """Register a request; returns its first sequence (its siblings come when the prompt is done)."""
        self.requests[request.request_id] = request
        return self.new_sequence(request, index=0)

    def new_sequence(self, request: Request, index: int) -> Sequence:
        seq = Sequence(seq_id=next(self._seq_ids), request_id=request.request_id, index=index,
                       prompt_token_ids=request.prompt_token_ids, params=request.params, lora=request.lora,
                       mm_items=request.mm_items, mrope=request.mrope, pooling=request.pooling)
        if request.grammar is not None:
            seq.grammar = request.grammar if index == 0 else request.grammar.fresh()
        if request.params.seed is not None:
            seq.generator = torch.Generator().manual_seed((request.params.seed + index) % 2**63)
        request.seqs.append(seq)
        request.texts[seq.seq_id] = SeqText(IncrementalDetokenizer(
            self.tokenizer, request.prompt_token_ids, request.params.skip_special_tokens))
        return seq

    def new_sibling(self, first: Sequence, index: int) -> Sequence:
        """Sequence `index` of an n > 1 request, created when its first sequence's prompt is done."""
        return self.new_sequence(self.requests[first.request_id], index)

    def pop(self, request_id: str) -> Request | None:
        return self.requests.pop(request_id, None)

    @property
    def has_requests(self) -> bool:
        return bool(self.requests)

    def finished_request_ids(self) -> set[str]:
        return {rid for rid, request in self.requests.items() if request.finished}

    # -- TokenText, for the scheduler ---------------------------------------------------
    def add_token(self, seq: Sequence, search_stop_strings: bool) -> str | None:
        state = self.requests[seq.request_id].texts[seq.seq_id]
        state.detokenizer.add(seq.output_token_ids)
        state.text = state.detokenizer.text
        return _cut_at_stop_string(state, seq.params) if search_stop_strings else None

    # -- outputs --------------------------------------------------------------------------
    def outputs(self, request_ids: set[str]) -> list[RequestOutput | PoolingRequestOutput]:
        """One output per request that advanced; finished requests are forgotten after theirs."""
        outputs = []
        for rid in request_ids:
            request = self.requests.get(rid)
            if request is None:
                continue
            outputs.append(self._output(request))
            if request.finished:
                del self.requests[rid]
        return outputs

    def _output(self, request: Request) -> RequestOutput | PoolingRequestOutput:
        if request.pooling is not None:
            return self._pooling_output(request)
        completions = [self._completion(request, seq) for seq in request.seqs]
        first = request.seqs[0]
        return RequestOutput(
            request_id=request.request_id, prompt=request.prompt, prompt_token_ids=request.prompt_token_ids,
            outputs=sorted(completions, key=lambda c: c.index), finished=request.finished,
            prompt_logprobs=list(first.prompt_logprobs) if request.params.prompt_logprobs is not None else None,
            num_cached_tokens=first.num_cached_tokens, metrics=_metrics(request),
        )

    def _pooling_output(self, request: Request) -> PoolingRequestOutput:
        seq, pooler, params = request.seqs[0], self.pooler, request.pooling
        assert pooler is not None and params is not None  # only a pooling engine takes pooling requests
        data = finish_pooled(seq.pooled, pooler, params, request.prompt_token_ids) if isinstance(seq.pooled, torch.Tensor) else None
        return PoolingRequestOutput(request.request_id, request.prompt_token_ids, PoolingOutput(data),
                                    finished=request.finished)

    def _completion(self, request: Request, seq: Sequence) -> CompletionOutput:
        state = request.texts[seq.seq_id]
        if seq.finish_reason == "length" and not state.flushed:  # nothing more is coming: emit what was held back
            state.detokenizer.flush(seq.output_token_ids)
            state.text, state.flushed = state.detokenizer.text, True
        text = state.text
        longest_stop = max((len(s) for s in request.params.stop), default=0)
        if not seq.is_finished and longest_stop > 1:
            text = text[: max(0, len(text) - (longest_stop - 1))]  # a stop string may be forming
        logprobs = list(seq.output_logprobs) if request.params.logprobs is not None else None
        return CompletionOutput(
            index=seq.index, text=text, token_ids=list(seq.output_token_ids),
            finish_reason=seq.finish_reason, stop_reason=seq.stop_reason, logprobs=logprobs,
            cumulative_logprob=sum(lp.logprob for lp in logprobs) if logprobs else None,
        )


def _cut_at_stop_string(state: SeqText, params: SamplingParams) -> str | None:
    """The first stop string in the text not searched before (the text is cut there), or None."""
    searched, state.searched = state.searched, len(state.text)  # no stop string ended before `searched`
    for stop in params.stop:
        at = state.text.find(stop, max(0, searched - len(stop) + 1))
        if at != -1:
            end = at + len(stop) if params.include_stop_str_in_output else at
            state.text = state.text[:end]
            return stop
    return None


def _metrics(request: Request) -> RequestMetrics:
    first = request.seqs[0]
    timings = [s.timings for s in request.seqs]
    return RequestMetrics(
        arrival_time=first.timings.arrival,
        first_scheduled_time=first.timings.first_scheduled,
        first_token_time=min((t.first_token for t in timings if t.first_token), default=None),
        last_token_time=max((t.last_token for t in timings if t.last_token), default=None),
        finished_time=max((t.finished for t in timings if t.finished), default=None) if request.finished else None,
        model_forward_time=max((t.model_forward for t in timings if t.model_forward is not None), default=None),
        model_execute_time=max((t.model_execute for t in timings if t.model_execute is not None), default=None),
    )
