"""gptqmodel as the independent reference for llmctl's GPTQ/AWQ folders, run as a script in its own
process (gptqmodel patches transformers and starts thread pools on import).

    python gptqmodel_reference.py score FOLDER  < [{"ids": [...], "start": N}, ...] -> per-position logprobs
    python gptqmodel_reference.py quantize SRC OUT gptq|awq < {"texts": [...]}  -> writes OUT
    python gptqmodel_reference.py serve  < one {"argv": [...], "request": ...} per line -> one RESULT line each

`serve` keeps one process for many requests (importing gptqmodel alone takes ~10 s).

`score` prints, for each sequence and each position from `start` on: the log-probability of the token there under
gptqmodel's forward, gptqmodel's own argmax, and the margin between its two best tokens.
gptqmodel's CPU kernels (torch) run in float16, so agreement is to float16 precision.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")  # its default pool wants more cores than CI has

import torch  # noqa: E402


def score(folder: str, sequences: list[dict]) -> list[dict]:
    from gptqmodel import BACKEND, GPTQModel

    model = GPTQModel.load(folder, device="cpu", backend=BACKEND.TORCH)  # loads only as float16 on CPU
    model.model.float()  # then computes in float32 (fp16 scales widen exactly), as the engine does
    return [score_one(model, s["ids"], s["start"]) for s in sequences]


def score_one(model, ids: list[int], start: int) -> dict:
    with torch.no_grad():
        logits = model.model(torch.tensor([ids])).logits[0].float()
    logprobs = torch.log_softmax(logits[start - 1:-1], dim=-1)
    chosen = logprobs[torch.arange(len(ids) - start), torch.tensor(ids[start:])]
    top2 = logprobs.topk(2, dim=-1).values
    kernel = type(model.model.model.layers[0].self_attn.q_proj).__name__
    return {"logprobs": chosen.tolist(), "argmax": logprobs.argmax(-1).tolist(),
            "margin": (top2[:, 0] - top2[:, 1]).tolist(), "kernel": kernel}


def quantize(source: str, output: str, method: str, texts: list[str]) -> dict:
    from gptqmodel import BACKEND, GPTQModel, QuantizeConfig
    from gptqmodel.quantization import FORMAT, METHOD

    if method == "gptq":  # act-order: columns by decreasing Hessian diagonal, g_idx permuted on disk
        config, backend = QuantizeConfig(bits=4, group_size=32, desc_act=True, sym=True), BACKEND.AUTO
    elif method == "gptq-in-order":  # g_idx in order (desc_act false), as most published MoE checkpoints
        config, backend = QuantizeConfig(bits=4, group_size=32, desc_act=False, sym=True), BACKEND.AUTO
    else:  # AWQ GEMM, packed by gptqmodel's torch kernel (its default for AWQ is a CUDA one)
        config = QuantizeConfig(bits=4, group_size=32, quant_method=METHOD.AWQ, format=FORMAT.GEMM)
        backend = BACKEND.AWQ_TORCH
    model = GPTQModel.load(source, config, device="cpu")
    model.quantize(texts, batch_size=4, backend=backend)
    model.save(output)
    return {"saved": output}


def run(argv: list[str], request: dict | list) -> dict | list:
    if argv[0] == "score":
        return score(argv[1], request)
    return quantize(argv[1], argv[2], argv[3], request["texts"])


def serve() -> None:
    """Requests as JSON lines on stdin; a RESULT line each, or an ERROR line with the traceback (the process goes on)."""
    import traceback

    for line in sys.stdin:
        message = json.loads(line)
        try:
            print("RESULT " + json.dumps(run(message["argv"], message["request"])), flush=True)
        except Exception:  # the test that asked shows it; the next request still gets an answer
            print("ERROR " + json.dumps(traceback.format_exc()), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve()
    else:
        print("RESULT " + json.dumps(run(sys.argv[1:], json.load(sys.stdin))))
