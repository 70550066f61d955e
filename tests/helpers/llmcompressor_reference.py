"""llm-compressor as the independent writer of compressed-tensors checkpoints, run as a script in its own venv
(.venv-llmcompressor, made by scripts/setup.sh: llm-compressor 0.14 pins transformers ≤ 5.17 and
compressed-tensors 0.19, older than llmctl's).

    python llmcompressor_reference.py oneshot SRC OUT W4A16|W8A8|FP8_DYNAMIC < {"texts": [...], "score": [[ids]]}

runs llm-compressor's own `oneshot` with its recipe for the scheme, as its examples do — W4A16: GPTQ; W8A8:
SmoothQuant (strength 0.8) then GPTQ; FP8_DYNAMIC: no calibration — on every Linear but the LM head and MoE
routers, and saves the compressed folder (`save_compressed=True`) with the tokenizer. Before saving, the quantized
model it holds scores each `score` sequence teacher-forced, with the scheme applied as compressed-tensors runs
it (weights and per-token activations quantized, the experts of a mixture as llm-compressor's own per-expert
linears): for each position after the first, its most likely token there and the log-probability of the one
that follows. That is the reference for schemes transformers 5 cannot load (int8 experts) or runs differently
(experts' activations unquantized).
"""

from __future__ import annotations

import json
import sys

IGNORE = ["lm_head", "re:.*mlp.gate$", "re:.*block_sparse_moe.gate$", "re:.*shared_expert_gate$"]


def recipe(scheme: str) -> list:
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier
    from llmcompressor.modifiers.transform.smoothquant import SmoothQuantModifier

    if scheme == "FP8_DYNAMIC":
        return [QuantizationModifier(targets="Linear", scheme="FP8_DYNAMIC", ignore=IGNORE)]
    if scheme == "W8A8":
        return [SmoothQuantModifier(smoothing_strength=0.8),
                GPTQModifier(targets="Linear", scheme="W8A8", ignore=IGNORE)]
    return [GPTQModifier(targets="Linear", scheme=scheme, ignore=IGNORE)]


def oneshot_folder(source: str, out: str, scheme: str, texts: list[str], score_ids: list[list[int]]) -> dict:
    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    samples = Dataset.from_dict({"input_ids": [tokenizer(t, truncation=True, max_length=64)["input_ids"]
                                               for t in texts]})
    calibration = {} if scheme == "FP8_DYNAMIC" else dict(dataset=samples, max_seq_length=64,
                                                           num_calibration_samples=len(texts))
    oneshot(model=model, recipe=recipe(scheme), **calibration)
    scores = [score(model, ids) for ids in score_ids]
    model.save_pretrained(out, save_compressed=True)
    tokenizer.save_pretrained(out)
    return {"config": json.load(open(f"{out}/config.json"))["quantization_config"], "scores": scores}


def score(model, ids: list[int]) -> dict:
    import torch

    with torch.no_grad():
        logprobs = model(torch.tensor([ids])).logits[0, :-1].float().log_softmax(-1)
    following = torch.tensor(ids[1:])
    return {"argmax": logprobs.argmax(-1).tolist(),
            "logprobs": logprobs[torch.arange(len(ids) - 1), following].tolist()}


if __name__ == "__main__":
    command, source, out, scheme = sys.argv[1:5]
    assert command == "oneshot", command
    request = json.load(sys.stdin)
    print("RESULT " + json.dumps(oneshot_folder(source, out, scheme, request["texts"], request.get("score", []))))
