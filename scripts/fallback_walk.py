"""Every causal-LM config class transformers ships, as a tiny random model through `--model-impl transformers`:
refused in one line naming why, or served with transformers' own greedy tokens? Prints one line per model type and
a summary; `--json FILE` keeps them. Each type runs under a time limit (some of transformers' default configs build
large), in this process or, with `--isolated`, in one of its own. Minutes on a 2-core CPU: run by hand, not in CI
(tests/engine/models/test_transformers_impl.py holds the cases it found).

    python scripts/fallback_walk.py [--json results.json] [--isolated] [model_type ...]
"""

from __future__ import annotations

import argparse
import inspect
import json
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

PROMPT = "The capital of France is"
TOKENS = 6
# the sizes a config may name, under every spelling transformers' classes use
TINY = dict(hidden_size=64, n_embd=64, d_model=64, num_hidden_layers=2, n_layer=2, num_layers=2, n_layers=2,
            num_attention_heads=4, n_head=4, n_heads=4, num_key_value_heads=2, intermediate_size=128, n_inner=128,
            ffn_dim=128, head_dim=16, max_position_embeddings=256, n_positions=256, num_local_experts=4,
            num_experts=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
            tie_word_embeddings=False)


def causal_lm_types() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def tiny_model(model_type: str, vocab: int):
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    accepted = set(inspect.signature(config_class.__init__).parameters) | set(
        getattr(config_class, "__dataclass_fields__", {}))
    config = config_class(vocab_size=vocab, **{k: v for k, v in TINY.items() if k in accepted})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(torch.float32).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.2)
    return model


def verdict(model_type: str, folder: Path) -> tuple[str, str]:
    """("unbuildable" | "refused" | "exact" | "MISMATCH" | "CRASH", detail) for one type, in this process."""
    import torch
    from transformers import AutoTokenizer

    from llmctl import LLM, SamplingParams
    from llmctl.checkpoint.source import resolve_model
    from llmctl.errors import LlmctlError

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(None, show_progress=False).path))
    try:
        model = tiny_model(model_type, len(tokenizer))
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    except Exception as exc:  # noqa: BLE001 (transformers' own constructors)
        return "unbuildable", f"{type(exc).__name__}: {str(exc)[:120]}"
    try:
        llm = LLM(str(folder), model_impl="transformers", max_model_len=64, kv_cache_memory=8 << 20)
    except LlmctlError as exc:
        return "refused", str(exc)
    except Exception as exc:  # noqa: BLE001 (what the walk is for: anything but a clear refusal)
        return "CRASH", f"{type(exc).__name__}: {str(exc)[:200]}"
    try:
        ours = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True))
    finally:
        llm.shutdown()
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        theirs = model.generate(ids, do_sample=False, max_new_tokens=TOKENS, min_new_tokens=TOKENS, pad_token_id=0,
                                eos_token_id=None)[0, ids.shape[1]:].tolist()
    return ("exact", "") if list(ours[0].outputs[0].token_ids) == theirs else ("MISMATCH", f"{ours} vs {theirs}")


def run_here(model_type: str, timeout: int) -> tuple[str, str]:
    """In this process (seconds instead of a new interpreter's imports), timed by SIGALRM; a crash of the
    interpreter itself ends the walk, so `--isolated` runs each type apart."""
    def expired(signum: int, frame: object) -> None:
        raise TimeoutError

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(timeout)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            return verdict(model_type, Path(tmp) / "model")
    except TimeoutError:
        return "timeout", f"over {timeout} s (building or serving)"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run_one(model_type: str, timeout: int) -> tuple[str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        try:
            done = subprocess.run([sys.executable, __file__, "--one", model_type, tmp], capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            return "timeout", f"over {timeout} s (building or serving)"
    last = (done.stdout.strip().splitlines() or [""])[-1]
    if done.returncode != 0 or not last.startswith("{"):
        return "CRASH", f"exit {done.returncode}: {(done.stderr.strip().splitlines() or [''])[-1][:200]}"
    result = json.loads(last)
    return result["verdict"], result["detail"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("types", nargs="*")
    parser.add_argument("--json")
    parser.add_argument("--timeout", type=int, default=120)
    parser.add_argument("--isolated", action="store_true", help="each type in a process of its own")
    parser.add_argument("--skip", nargs="*", default=[], help="types not to walk")
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        found, detail = verdict(args.one[0], Path(args.one[1]) / "model")
        print(json.dumps({"verdict": found, "detail": detail}))
        return 0
    results = {}
    for model_type in [t for t in args.types or causal_lm_types() if t not in args.skip]:
        results[model_type] = (run_one if args.isolated else run_here)(model_type, args.timeout)
        print(f"{model_type:28} {results[model_type][0]:12} {results[model_type][1][:160]}", flush=True)
    print(dict(Counter(found for found, _ in results.values())))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 1 if any(found in ("MISMATCH", "CRASH") for found, _ in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
