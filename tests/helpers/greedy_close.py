"""vLLM's rule for comparing greedy runs of a quantized model (tests/models/utils.py, check_logprobs_close):
position by position the tokens agree, or at the first place they differ each run's token is among the
other's top-N alternatives, and the comparison stops there (the contexts differ after it). llama.cpp's and
vLLM's GGUF kernels round activations to int8 blocks, so their greedy tokens may part from a float
reference's where two tokens are nearly tied; this rule tells such a near-tie from a wrong result."""

from __future__ import annotations

import torch


def transformers_greedy(model, prompt: list[int], tokens: int, top: int) -> list[tuple[int, set[int]]]:
    """transformers' greedy tokens for `prompt`, each with its top-`top` token ids."""
    out = model.generate(torch.tensor([prompt]), max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                         output_logits=True, return_dict_in_generate=True)
    chosen = out.sequences[0, len(prompt):].tolist()
    return [(token, set(logits[0].topk(top).indices.tolist())) for token, logits in zip(chosen, out.logits)]


def llmctl_greedy(output) -> list[tuple[int, set[int]]]:
    """An llmctl completion (run with logprobs=N) as tokens, each with its top-N token ids."""
    return [(entry.token_id, set(entry.top)) for entry in output.logprobs]


def assert_greedy_close(ours: list[tuple[int, set[int]]], reference: list[tuple[int, set[int]]], label: str) -> int:
    """Returns how many leading tokens agree exactly (the test may ask for a floor)."""
    assert len(ours) == len(reference), label
    for position, ((token, top), (expected, expected_top)) in enumerate(zip(ours, reference)):
        if token != expected:
            assert token in expected_top and expected in top, (
                f"{label}: token {position} is {token}, the reference's {expected}, and neither is among the "
                f"other's top {len(top)} ({sorted(top)} vs {sorted(expected_top)})")
            return position
    return len(ours)
