"""Clients and references the multi-host tests (torchrun, Ray) run inside network namespaces."""

from __future__ import annotations

PROMPT = "The capital of France is"


CLIENT = """
import json, sys
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="x", max_retries=0, timeout=300)
reply = client.completions.create(model=client.models.list().data[0].id, prompt=sys.argv[2], max_tokens=8,
                                  temperature=0, logprobs=1)
print(json.dumps(reply.choices[0].text))
"""


HEALTH = "import sys, urllib.request; sys.exit(urllib.request.urlopen(sys.argv[1] + '/health', timeout=5).status != 200)"


def transformers_text(folder, tokenizer) -> str:
    """transformers' own greedy continuation of PROMPT (8 tokens), the reference."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    ids = tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    return tokenizer.decode(out[0, ids.shape[1]:])
