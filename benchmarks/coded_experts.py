"""A GPTQ mixture-of-experts checkpoint on this CPU: its routed experts kept 4-bit (llmctl.engine.layers.coded_experts)
against the float32 model it came from — the weight bytes the engine holds, and single-stream decode.

The model: a random Qwen3-MoE, 8 layers 1,024 wide, 32 experts of 512 (top 4), the 49,152-token vocabulary; every
projection of the GPTQ copy packed 4-bit in groups of 128 (round to nearest; the numbers do not depend on the
rounding). One request of 16 prompt tokens, 128 greedy tokens; tokens per second = 127 / (time for 128 − time
for 1), each the median of --repeat calls in one warm process; each model in a fresh process, alternating,
--rounds times.

    .venv/bin/python benchmarks/coded_experts.py [--rounds 3]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from alternating import alternate, decode_tokens_per_second, median_ratios, rounds_parser, worker_figure

PROMPT = [100 + 37 * i for i in range(16)]
OUTPUT_TOKENS = 128


def build(folder: Path) -> dict[str, Path]:
    """The float32 model and its GPTQ copy (built once, reused)."""
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    from llmctl.checkpoint.quant_formats import pack_gptq
    from llmctl.checkpoint.source import resolve_model
    from llmctl.quant.rtn import QuantConfig, rtn_quantize
    from llmctl.quant.writer import quantization_config

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(resolve_model(None, show_progress=False).path))
    base, gptq = folder / "float32", folder / "gptq"
    if not (base / "config.json").exists():
        config = transformers.Qwen3MoeConfig(vocab_size=49152, hidden_size=1024, intermediate_size=2048,
                                             moe_intermediate_size=512, num_experts=32, num_experts_per_tok=4,
                                             num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
                                             head_dim=64, max_position_embeddings=2048, tie_word_embeddings=True)
        torch.manual_seed(0)
        transformers.AutoModelForCausalLM.from_config(config).to(torch.float32).save_pretrained(base)
        tokenizer.save_pretrained(base)
    if not (gptq / "config.json").exists():
        gptq.mkdir(parents=True)
        quant = QuantConfig(4, 128, symmetric=True)
        tensors = {}
        for name, tensor in load_file(base / "model.safetensors").items():
            if name.endswith("proj.weight"):
                packed = pack_gptq(rtn_quantize(tensor, quant))
                tensors.update({f"{name.removesuffix('weight')}{kind}": value for kind, value in packed.items()})
            else:
                tensors[name] = tensor
        save_file(tensors, gptq / "model.safetensors", metadata={"format": "pt"})
        model_config = json.loads((base / "config.json").read_text())
        model_config["quantization_config"] = quantization_config("gptq", quant)
        (gptq / "config.json").write_text(json.dumps(model_config))
        tokenizer.save_pretrained(gptq)
    return {"float32": base, "gptq": gptq}


def worker(folder: str, repeat: int) -> None:
    from llmctl import LLM
    from llmctl.engine.worker.loader import model_weight_bytes

    llm = LLM(folder, max_model_len=512)
    weights = model_weight_bytes(llm.engine.executor.loaded.model)
    print(json.dumps({"tok_s": decode_tokens_per_second(llm, PROMPT, OUTPUT_TOKENS, repeat), "weights": weights}))


def main() -> None:
    args = rounds_parser(__doc__.splitlines()[0], "/tmp/llmctl-coded-experts").parse_args()
    if args.worker:
        worker(args.worker, args.repeat)
        return
    models = build(args.dir)
    command = [sys.executable, __file__, "--repeat", str(args.repeat), "--worker"]
    env = {**os.environ}
    weights = {name: worker_figure(command + [str(models[name])], env, "weights", name) for name in models}
    figures = alternate(list(models), args.rounds,
                        lambda name: worker_figure(command + [str(models[name])], env, "tok_s", name))
    print(f"single-stream decode, {OUTPUT_TOKENS} tokens, a 32-expert Qwen3-MoE (tokens/s, median of {args.rounds} "
          "rounds), and the weights the engine holds:")
    for name, (median, ratio) in median_ratios(figures, "float32").items():
        print(f"  {name:8s} {median:7.1f} tok/s  {ratio:.2f}× float32   weights {weights[name] / 2**30:.3f} GiB")


if __name__ == "__main__":
    main()
