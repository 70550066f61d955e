"""How many segments a decode step's attention is split into (kernels/attention.py `choose_segments`): sized by
the GPU's SM count, the batch, the KV heads and the longest context, within the kernel's limits; the engine
plans eager steps by their own longest sequence and captured graphs by the longest they can meet."""

from __future__ import annotations

import pytest
import torch

from llmctl.kernels import attention
from llmctl.kernels.attention import MAX_SEGMENTS, MIN_SEGMENT_KEYS, SEGMENTS, choose_segments

H200_SMS = 132


@pytest.mark.parametrize("seqs", [1, 2, 16, 64, 256, 1024])
@pytest.mark.parametrize("context", [16, 1024, 4096, 32768, 131072])
def test_a_split_is_a_power_of_two_with_no_segment_under_its_minimum(seqs, context):
    segments = choose_segments(True, seqs, 8, H200_SMS, context)
    assert 1 <= segments <= MAX_SEGMENTS and segments & (segments - 1) == 0
    assert segments == 1 or context / segments >= MIN_SEGMENT_KEYS * 0.75  # the nearest power of two of the cap


def test_more_sequences_split_less_and_longer_contexts_more():
    by_batch = [choose_segments(True, seqs, 8, H200_SMS, 32768) for seqs in (1, 4, 16, 64, 256, 1024)]
    assert by_batch == sorted(by_batch, reverse=True) and by_batch[0] > by_batch[-1]
    by_context = [choose_segments(True, 1, 8, H200_SMS, context) for context in (256, 1024, 4096, 32768)]
    assert by_context == sorted(by_context) and by_context[0] < by_context[-1]


def test_one_long_sequence_splits_beyond_the_sixteen_that_read_at_twelve_percent():
    """The H200 run (docs/kernels.md): batch 1 × 32k over 16 segments — 128 programs on 132 SMs — read the KV at
    492 GB/s, 12 % of copy bandwidth."""
    assert choose_segments(True, 1, 8, H200_SMS, 32768) >= 64


def test_prefills_and_unknown_machines_keep_the_fixed_rule():
    assert choose_segments(False, 1, 8, H200_SMS, 32768) == 1
    assert choose_segments(True, 4, 8) == SEGMENTS  # the interpreter: no SM count
    assert choose_segments(True, 64, 8) == 1


def test_the_engine_plans_eager_steps_by_their_context_and_graphs_by_the_longest(monkeypatch):
    from llmctl.engine.layers.attention import AttentionMetadata, KVCache
    from llmctl.engine.layers.triton_attention import TritonAttention

    planned = []
    monkeypatch.setattr(attention, "sm_count", lambda device: H200_SMS)
    plan_step = attention.plan_step
    monkeypatch.setattr(attention, "plan_step", lambda *args, **kwargs: planned.append(kwargs.get("context"))
                        or plan_step(*args, **kwargs))
    backend = TritonAttention()
    assert backend.plan_uniform(2, 1, 8, 8, torch.device("cpu"), context=32768).num_segments >= 64
    meta = AttentionMetadata(slot_mapping=torch.tensor([40, 70]), query_start_loc=[0, 1, 2], seq_lens=[41, 600],
                             block_tables=[[0, 1, 2], list(range(3, 41))], block_size=16, sliding_window=None)
    backend.prepare(meta, torch.device("cpu"))
    cache = KVCache(torch.zeros(48, 16, 2, 8, 16))
    with torch.no_grad():
        backend.forward(torch.randn(2, 8, 16), torch.randn(2, 8, 16), torch.randn(2, 8, 16), cache, scale=0.25)
    assert planned == [32768, 600]
