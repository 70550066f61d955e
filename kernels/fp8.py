"""The fp8 KV cache format (--kv-cache-dtype fp8): e4m3 with a scale of 1.0, as vLLM uses when a
checkpoint carries no KV scales. Shared by the Triton store kernel and the torch backend."""

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # e4m3's largest finite value: stored K/V are clamped to it
