"""Scheduler.update_from_output on its own: what a step's tokens do to sequences and blocks.
The rules are vLLM's: EOS, stop ids and stop strings end a sequence (none before min_tokens),
tokens after a stop in a verified proposal are dropped, a stop string found at the last
allowed token is reported as a stop, and n > 1 siblings share their parent's prompt blocks."""

from __future__ import annotations

from llmctl.engine.core.block_manager import BlockManager
from llmctl.engine.core.scheduler import SampledSeq, Scheduler
from llmctl.engine.core.sequence import Sequence, SequenceStatus
from llmctl.engine.sampling_params import SamplingParams

BS = 4
EOS = 2


class CharText:
    """TokenText over a toy vocabulary: token t is the character chr(ord('a') + t)."""

    def __init__(self) -> None:
        self.text: dict[int, str] = {}

    def add_token(self, seq: Sequence, search_stop_strings: bool) -> str | None:
        text = self.text.get(seq.seq_id, "") + chr(ord("a") + seq.output_token_ids[-1])
        self.text[seq.seq_id] = text
        if search_stop_strings:
            return next((stop for stop in seq.params.stop if stop in text), None)
        return None


def scheduler() -> Scheduler:
    return Scheduler(BlockManager(16, BS), max_num_seqs=8, max_num_batched_tokens=64, eos_token_ids=[EOS],
                     max_model_len=64)


def prefilled(s: Scheduler, seq_id: int = 0, **params) -> tuple[Sequence, object]:
    """A sequence whose 6-token prompt is scheduled in one step (its first token comes next)."""
    seq = Sequence(seq_id=seq_id, request_id=str(seq_id), index=0, prompt_token_ids=[5, 6, 7, 8, 9, 10],
                   params=SamplingParams(**params))
    s.add(seq)
    return seq, s.schedule()


def test_a_step_advances_computed_tokens_and_registers_full_blocks():
    s = scheduler()
    seq, sched = prefilled(s)
    touched = s.update_from_output(sched, [SampledSeq(seq, [(11, None)])], CharText())
    assert touched == {"0"} and seq.output_token_ids == [11] and seq.num_computed_tokens == 6
    assert len(seq.block_hashes) == 1  # one full block of 4 prompt tokens is findable by later prompts
    assert s.counts.prompt_tokens == 6 and s.counts.generation_tokens == 1


def test_eos_stops_and_frees_but_not_before_min_tokens():
    s = scheduler()
    early, sched = prefilled(s, 0, min_tokens=2)
    s.update_from_output(sched, [SampledSeq(early, [(EOS, None)])], CharText())
    assert early.status == SequenceStatus.RUNNING  # one token is fewer than min_tokens
    s2 = scheduler()
    seq, sched = prefilled(s2)
    s2.update_from_output(sched, [SampledSeq(seq, [(EOS, None)])], CharText())
    assert (seq.finish_reason, seq.stop_reason) == ("stop", None) and seq.is_finished
    assert s2.block_manager.num_free_blocks == 16 and not s2.running


def test_tokens_after_a_stop_in_a_verified_proposal_are_dropped():
    s = scheduler()
    seq, sched = prefilled(s, stop_token_ids=[4])
    verified = SampledSeq(seq, [(11, None), (4, None), (12, None)], verified=True)
    s.update_from_output(sched, [verified], CharText())
    assert seq.output_token_ids == [11, 4] and (seq.finish_reason, seq.stop_reason) == ("stop", 4)
    assert s.counts.generation_tokens == 2


def test_a_stop_string_at_the_last_allowed_token_is_a_stop():
    s = scheduler()
    seq, sched = prefilled(s, max_tokens=2, stop=["lm"])  # tokens 11, 12 read "lm"
    text = CharText()
    s.update_from_output(sched, [SampledSeq(seq, [(11, None)])], text)
    s.update_from_output(s.schedule(), [SampledSeq(seq, [(12, None)])], text)
    assert (seq.finish_reason, seq.stop_reason) == ("stop", "lm")


def test_max_tokens_and_max_model_len_end_with_length():
    s = scheduler()
    seq, sched = prefilled(s, max_tokens=1)
    s.update_from_output(sched, [SampledSeq(seq, [(11, None)])], CharText())
    assert seq.finish_reason == "length"
    s.max_model_len = 7
    long, sched = prefilled(s, 1)
    s.update_from_output(sched, [SampledSeq(long, [(11, None)])], CharText())
    assert long.finish_reason == "length"  # 6 prompt tokens + 1 reach the context length


def test_siblings_share_the_parent_blocks_even_when_the_parent_ends_at_once():
    s = scheduler()
    parent, sched = prefilled(s, n=2, max_tokens=1)
    child = Sequence(seq_id=1, request_id="0", index=1, prompt_token_ids=parent.prompt_token_ids,
                     params=parent.params)
    s.update_from_output(sched, [SampledSeq(parent, [(11, None)]), SampledSeq(child, [(12, None)], forked_from=parent)],
                         CharText())
    assert parent.is_finished and child.is_finished  # both reached max_tokens
    assert s.block_manager.num_free_blocks == 16  # the shared blocks came back once both were done
    s2 = scheduler()
    parent, sched = prefilled(s2, n=2)
    child = Sequence(seq_id=1, request_id="0", index=1, prompt_token_ids=parent.prompt_token_ids,
                     params=parent.params)
    s2.update_from_output(sched, [SampledSeq(parent, [(EOS, None)]), SampledSeq(child, [(12, None)], forked_from=parent)],
                          CharText())
    assert parent.is_finished and child.status == SequenceStatus.RUNNING and child in s2.running
    assert child.num_computed_tokens == 6 and len(child.block_table) == 2  # the prompt's blocks, kept for the child
    assert all(s2.block_manager.blocks[b].ref_count == 1 for b in child.block_table)


def test_without_chunked_prefill_a_prompt_waits_for_a_step_with_room_for_all_of_it():
    """vLLM's --no-enable-chunked-prefill: the second prompt is not cut to the budget's rest; it runs next step."""
    s = Scheduler(BlockManager(32, BS), max_num_seqs=8, max_num_batched_tokens=64, eos_token_ids=[EOS],
                  max_model_len=64, chunked_prefill=False)
    first, second = (Sequence(seq_id=i, request_id=str(i), index=0, prompt_token_ids=[5 + i] * 40,
                              params=SamplingParams()) for i in range(2))  # no shared prefix
    s.add(first)
    s.add(second)
    step = s.schedule()
    assert [(x.seq.seq_id, x.num_new_tokens) for x in step.scheduled] == [(0, 40)]
    s.update_from_output(step, [SampledSeq(first, [(11, None)])], CharText())
    assert [(x.seq.seq_id, x.num_new_tokens) for x in s.schedule().scheduled] == [(0, 1), (1, 40)]
    chunked = scheduler()  # with chunked prefill the second takes the 24 tokens left at once
    for i in range(2):
        chunked.add(Sequence(seq_id=i, request_id=str(i), index=0, prompt_token_ids=[5 + i] * 40,
                             params=SamplingParams()))
    assert [x.num_new_tokens for x in chunked.schedule().scheduled] == [40, 24]
