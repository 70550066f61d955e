"""Adapters made with peft on real base models, and transformers + peft as the reference they are checked
against: the same files a user would train and serve."""

from __future__ import annotations

from pathlib import Path

import torch

PROMPTS = ["The capital of France is", "Hello, my name is", "1, 2, 3, 4,"]


def make_adapter(base: Path, folder: Path, *, rank: int, targets: list[str], seed: int, alpha: float | None = None,
                 use_rslora: bool = False, alpha_pattern: dict | None = None, std: float = 0.3) -> Path:
    """A PEFT LoRA adapter with random non-zero A and B (B is zero when freshly initialised)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=alpha if alpha is not None else 2 * rank, target_modules=targets,
                        use_rslora=use_rslora, alpha_pattern=alpha_pattern or {})
    peft_model = get_peft_model(model, config)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.normal_(0, std)
    peft_model.save_pretrained(str(folder))
    return folder


def reference(base: Path, adapter: Path | None, tokenizer, prompts: list[str], max_tokens: int,
              state: dict[str, torch.Tensor] | None = None) -> list[tuple[list[int], list[float]]]:
    """Greedy tokens and their logprobs from transformers (+ peft when an adapter is given)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    # eager attention: exact for every family, and the only one that soft-caps (Gemma 2)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32, attn_implementation="eager")
    if state is not None:
        from helpers.quant_helpers import load_dense_state

        load_dense_state(model, state)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter))
    model.eval()
    out = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            ref = model.generate(input_ids=ids, do_sample=False, max_new_tokens=max_tokens,
                                 min_new_tokens=max_tokens, output_logits=True, return_dict_in_generate=True,
                                 pad_token_id=0, eos_token_id=None)
        tokens = ref.sequences[0, ids.shape[1]:].tolist()
        out.append((tokens, [float(torch.log_softmax(s[0], -1)[t]) for s, t in zip(ref.logits, tokens)]))
    return out


def assert_matches(outputs, expected) -> None:
    """Greedy tokens identical, logprobs within 1e-3 (the engine-vs-transformers standard)."""
    for output, (tokens, logprobs) in zip(outputs, expected):
        completion = output.outputs[0]
        assert completion.token_ids == tokens
        assert completion.logprobs and len(completion.logprobs) == len(logprobs), "ask for logprobs=0"
        assert max(abs(lp.logprob - ref) for lp, ref in zip(completion.logprobs, logprobs)) < 1e-3
