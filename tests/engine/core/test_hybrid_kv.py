"""The hybrid KV cache (vLLM's layout for models that mix sliding-window and full attention): KV groups
formed by vLLM's rule, one block table per group from one pool, sliding groups giving back what their
window passed, and plan counting what the engine holds."""

from __future__ import annotations

import torch

from helpers.families import WINDOW, gemma3_text_config
from helpers.models import save_random_model
from llmctl import LLM, SamplingParams
from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.core.block_manager import SLID_OUT, BlockManager
from llmctl.engine.core.sequence import Sequence
from llmctl.engine.sampling_params import SamplingParams as Params
from llmctl.sizing.kv import kv_groups

BS = 16


def layout(kinds: str, window: int = 8) -> ModelSpec:
    """A Gemma 3 spec of layers given as 'f' (full) and 's' (sliding)."""
    types = ["full_attention" if kind == "f" else "sliding_attention" for kind in kinds]
    return ModelSpec.from_config(dict(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", hidden_size=64,
                                      num_hidden_layers=len(kinds), num_attention_heads=4, num_key_value_heads=2,
                                      head_dim=16, intermediate_size=128, vocab_size=100, sliding_window=window,
                                      layer_types=types))


def test_groups_follow_vllms_rule():
    # vLLM's own example (kv_cache_utils): stage 0 holds full.0, sw.0, sw.1 and stage 1 full.1, sw.2, sw.3
    # -> (full.0, full.1), (sw.0, sw.2), (sw.1, sw.3)
    groups = kv_groups(layout("fssfss"))
    assert groups.groups == ((0, 3), (1, 4), (2, 5)) and groups.windows == (None, 8, 8) and groups.group_size == 2
    assert [groups.slot(layer) for layer in range(6)] == [0, 0, 0, 1, 1, 1]
    # 12 sliding + 13 full (vLLM's gpt-oss-20b + EAGLE example): under 1.5× apart, one group of each, padded to 13
    groups = kv_groups(layout("sf" * 12 + "f"))
    assert groups.group_size == 13 and [len(g) for g in groups.groups] == [13, 12]
    # Gemma 3 27B: 62 layers, every 6th full -> 10 full, 52 sliding in 6 groups (vLLM adds 8 padding layers)
    groups = kv_groups(layout("".join("f" if (i + 1) % 6 == 0 else "s" for i in range(62)), 1024))
    assert groups.group_size == 10 and [len(g) for g in groups.groups] == [10, 9, 9, 9, 9, 8, 8]
    # one kind: a single group of every layer, as before hybrid models
    assert kv_groups(layout("ffff")).groups == ((0, 1, 2, 3),) and kv_groups(layout("ss")).windows == (8,)


def running(manager: BlockManager, tokens: int) -> Sequence:
    seq = Sequence(0, "r", 0, list(range(tokens)), Params(max_tokens=1))
    manager.allocate(seq, tokens)
    seq.num_computed_tokens = tokens
    manager.register_full_blocks(seq)
    return seq


def test_sliding_groups_give_back_blocks_and_full_groups_keep_them():
    manager = BlockManager(num_blocks=40, block_size=BS, group_windows=(None, 32, 32))
    seq = running(manager, 100)  # 7 blocks of tokens in each of 3 groups
    assert [len(t) for t in seq.block_tables] == [7, 7, 7] and manager.num_free_blocks == 40 - 21
    manager.release_slid_out(seq)  # the next query (position 100) sees keys 69..100: blocks 4..6
    assert SLID_OUT not in seq.block_table
    for table in seq.group_tables:
        assert table[:4] == [SLID_OUT] * 4 and SLID_OUT not in table[4:]
    assert manager.num_free_blocks == 40 - 7 - 2 * 3
    manager.free(seq)
    assert manager.num_free_blocks == 40


def test_a_prefix_hit_needs_the_block_of_every_group():
    manager = BlockManager(num_blocks=40, block_size=BS, group_windows=(None, 32))
    first = running(manager, 64)
    manager.free(first)  # every group's 4 blocks stay cached
    again = Sequence(1, "s", 0, list(range(64)) + [7], Params(max_tokens=1))
    manager.match_prefix(again)
    assert again.num_computed_tokens == 64 and [len(t) for t in again.block_tables] == [4, 4]
    manager.free(again)
    # evict the sliding group's block of the first 16 tokens: no group may then reuse them
    key = next(k for k in manager.cached if k[0] == 1 and manager.blocks[manager.cached[k]].token_ids[0] == 0)
    manager._drop_hash(manager.blocks[manager.cached[key]])
    third = Sequence(2, "t", 0, list(range(64)) + [7], Params(max_tokens=1))
    manager.match_prefix(third)
    assert third.num_computed_tokens == 0 and third.block_table == []


def test_a_generation_longer_than_full_attention_could_hold(tmp_path, tokenizer):
    """Gemma 3 shape (two sliding layers, one full): 3 prompts × 200 tokens on a pool of 24 blocks, where one
    240-token sequence needs 15 + 2 × 3 = 21 (45 if every layer kept every token); tokens as transformers'."""
    folder = save_random_model(gemma3_text_config(len(tokenizer)), tmp_path / "gemma3", tokenizer)
    probe = LLM(str(folder), max_model_len=256, max_num_batched_tokens=16)
    geometry = probe.engine.loaded.kv_geometry
    assert (geometry.slots, geometry.full_groups, geometry.sliding_groups) == (1, 1, 2)
    assert geometry.sequence_bytes(240, 16) == (15 + 2 * 3) * geometry.block_bytes  # window 8 + a 16-token step
    llm = LLM(str(folder), max_model_len=256, max_num_batched_tokens=16, kv_cache_memory=24 * geometry.block_bytes)
    manager = llm.engine.block_manager
    assert manager.num_blocks == 24 and manager.group_windows == (None, WINDOW, WINDOW)
    prompts = ["The capital of France is", "Hello, my name is", "1, 2, 3, 4,"]
    max_tokens = 200
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, attn_implementation="eager").eval()
    for prompt, output in zip(prompts, outputs):
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            ref = hf.generate(ids, do_sample=False, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                              pad_token_id=0, eos_token_id=None)
        assert output.outputs[0].token_ids == ref[0, ids.shape[1]:].tolist(), prompt
    assert llm.engine.scheduler.num_preemptions > 0  # three sequences did not fit side by side all the time
    assert manager.num_free_blocks == manager.num_blocks
