"""Time, peak memory and perplexity of quantizing the default model (SmolLM2-135M-Instruct).

    python benchmarks/quantize_smollm2.py [--calib-samples 32] [--calib-seq-len 256] [--group-size 64]
        [--calibration wikitext self] [--methods rtn gptq awq]

Calibration: random windows of the WikiText-2 test split in tests/fixtures/data (`wikitext`),
and/or sequences the model samples from itself (`self`: `llmctl quantize`'s data-free default
when the hub cannot be reached); evaluation: WikiText's last --eval-tokens tokens, never used
for calibration. Prints fp32 / RTN (asymmetric) / GPTQ / AWQ perplexity, seconds (for `self`,
plus the seconds sampling the calibration took) and peak resident memory for each.
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "data" / \
    "wikitext-2-raw-test.hfdatasets-derived.crlf.txt"


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calib-samples", type=int, default=32)
    parser.add_argument("--calib-seq-len", type=int, default=256)
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument("--eval-tokens", type=int, default=4096)
    parser.add_argument("--calibration", nargs="+", default=["wikitext"], choices=["wikitext", "self"])
    parser.add_argument("--methods", nargs="+", default=["rtn", "gptq", "awq"], choices=["rtn", "gptq", "awq"])
    args = parser.parse_args()

    from llmctl.checkpoint.source import resolve_model
    from llmctl.checkpoint.tokenizer import load_tokenizer
    from llmctl.quant.calibration import calibration_samples, read_texts, token_stream
    from llmctl.quant.evaluate import load_dense_model, perplexity
    from llmctl.quant.pipeline import quantize_model
    from llmctl.quant.rtn import QuantConfig
    from llmctl.quant.self_calibration import self_calibration

    source = resolve_model(None, weights=True, show_progress=False)
    tokenizer = load_tokenizer(source)
    eval_ids = token_stream(tokenizer, read_texts(DATA))[-args.eval_tokens:]
    print(f"SmolLM2-135M-Instruct, 4-bit, group {args.group_size}, calibration {args.calib_samples} x "
          f"{args.calib_seq_len} tokens, evaluation {len(eval_ids)} tokens")
    print(f"{'method':8} {'calibration':12} {'perplexity':>10} {'seconds':>8} {'peak RSS':>10}")
    print(f"{'fp32':8} {'':12} {perplexity(load_dense_model(source.path), eval_ids):10.2f}")
    for name in args.calibration:
        started = time.perf_counter()
        if name == "self":
            calibration = self_calibration(str(source.path), tokenizer, args.calib_samples, args.calib_seq_len)
        else:
            calibration = calibration_samples(tokenizer, DATA, args.calib_samples, args.calib_seq_len,
                                              skip_tail=args.eval_tokens)
        sampling = time.perf_counter() - started
        for method in args.methods:
            started = time.perf_counter()
            config = QuantConfig(4, args.group_size, symmetric=method == "gptq")
            result = quantize_model(source.path, method, config, calibration)
            seconds = time.perf_counter() - started
            ppl = perplexity(load_dense_model(source.path, result.dequantized), eval_ids)
            extra = f" (+{sampling:.0f} s sampling)" if name == "self" else ""
            print(f"{method:8} {name:12} {ppl:10.2f} {seconds:8.1f} {peak_rss_mib():8.0f} MiB{extra}", flush=True)


if __name__ == "__main__":
    main()
