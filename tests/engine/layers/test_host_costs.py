"""The CPU step's small costs cut for issue 60's engine-overhead bar (benchmarks/engine_overhead.py), each
against the expression it replaces: numpy's argmax, the rotary table, and the LM head's own crossover."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from llmctl.engine.layers import cpu_gemm
from llmctl.engine.layers.positions import TABLE_MIN_POSITIONS, RotaryEmbedding
from llmctl.engine.sample.sampler import greedy_tokens
from llmctl.kernels import cpu as cpu_kernels


def test_greedy_tokens_are_torch_argmax_with_ties_infinities_and_nan():
    torch.manual_seed(0)
    logits = torch.randn(6, 49152)
    logits[1, 7] = logits[1, 9000] = 50.0  # a tie: the first index, as torch.argmax
    logits[2] = float("-inf")  # every token blocked
    logits[3, 123] = float("inf")
    logits[4, 77] = float("nan")  # torch.argmax takes a NaN as the maximum
    strided = logits[:, ::2]  # not contiguous
    for rows in (logits, strided):
        chosen = greedy_tokens(rows)
        assert chosen.dtype == torch.int64
        assert torch.equal(chosen, torch.argmax(rows, dim=-1))


def _rotary(**rope) -> RotaryEmbedding:
    from transformers import LlamaConfig

    return RotaryEmbedding(LlamaConfig(hidden_size=256, num_attention_heads=4, **rope), 64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rope", [{}, {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                         "high_freq_factor": 4.0,
                                                         "original_max_position_embeddings": 512}}])
def test_the_cpu_rotary_table_holds_the_computed_values_and_grows(dtype, rope):
    rotary = _rotary(**rope)
    for positions in (torch.tensor([0, 5, 1023]), torch.tensor([3, TABLE_MIN_POSITIONS * 3 + 7, 17])):
        cos, sin = rotary.cos_sin(positions, dtype, None)
        expected_cos, expected_sin = rotary._computed(positions, dtype, None)
        assert torch.equal(cos, expected_cos) and torch.equal(sin, expected_sin)
    assert rotary._table is not None and rotary._table[0].shape[0] == TABLE_MIN_POSITIONS * 4


@pytest.mark.skipif(not cpu_kernels.panel_isas(), reason="no float32 panel kernel is built on this CPU")
def test_the_lm_head_takes_its_own_crossover_from_its_own_timing(monkeypatch):
    """The timer is injected: the panels lose on the small linear at every batch and win on the head from one
    row (what a 64-wide model with a 49,152-token vocabulary measures on a Zen 4)."""
    from llmctl.engine.distributed.group import TPGroup
    from llmctl.engine.layers.linear import VocabParallelEmbedding

    model = nn.Module()
    model.proj = nn.Linear(64, 128, bias=False)
    model.head = VocabParallelEmbedding(4096, 64, TPGroup())
    nn.init.normal_(model.head.weight)
    last: dict = {}
    monkeypatch.setattr(cpu_gemm.F, "linear", lambda x, w, b=None: last.update(path="plain", n=w.shape[0]))
    monkeypatch.setattr(cpu_gemm.PackedWeight, "linear", lambda self, x, b: last.update(path="packed",
                                                                                        n=self.out_features))

    def timed(call) -> float:
        call()
        head = last["n"] == 4096
        return {"plain": 3.0, "packed": 1.0 if head else 9.0}[last["path"]]

    monkeypatch.setattr(cpu_gemm, "_fastest_seconds", timed)
    monkeypatch.setattr(cpu_gemm, "_measured", {})  # no crossover another test measured for these shapes
    cpu_gemm.pack_linears(model)
    assert cpu_gemm.small_batch() == cpu_gemm.MAX_SMALL_BATCH and cpu_gemm.head_small_batch() == 1
    assert model.head.packed_head.min_rows == 1
    monkeypatch.undo()
    hidden = torch.randn(1, 64)
    calls = []
    monkeypatch.setattr(cpu_kernels, "panel_linear", lambda *args, **kwargs: calls.append("panels") or
                        torch.zeros(1, 4096))
    model.head.logits(hidden)
    assert calls == ["panels"]  # one row through the packed head
