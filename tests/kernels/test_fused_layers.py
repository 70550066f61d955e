"""The fused GPU layers (kernels/fused_layers.py) against the torch expressions they replace: under Triton's
interpreter on CPU tensors in float32 here, compiled in bfloat16 on a GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from llmctl.kernels.fused_layers import gated_activation, rms_norm

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.float32 if DEVICE == "cpu" else torch.bfloat16
TOLERANCE = dict(atol=1e-5, rtol=1e-5) if DTYPE == torch.float32 else dict(atol=2e-2, rtol=2e-2)


def llama_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm.forward."""
    hidden = x.to(torch.float32)
    hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + eps)
    return weight * hidden.to(x.dtype)


def gemma_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Gemma3RMSNorm.forward."""
    hidden = x.float()
    hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + eps)
    return (hidden * (1.0 + weight.float())).type_as(x)


def random(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DTYPE).to(DEVICE)


@pytest.mark.parametrize("width", [64, 576, 100])  # 100: a row narrower than its power-of-two block
@pytest.mark.parametrize("unit_offset", [False, True])
def test_rms_norm_with_and_without_the_residual(width, unit_offset):
    reference = gemma_norm if unit_offset else llama_norm
    x, residual, weight = random(5, width), random(5, width, seed=1), random(width, seed=2)
    torch.testing.assert_close(rms_norm(x, weight, 1e-6, unit_offset=unit_offset), reference(x, weight, 1e-6),
                               **TOLERANCE)
    summed = residual.clone()
    normed = rms_norm(x, weight, 1e-5, residual=summed, unit_offset=unit_offset)
    torch.testing.assert_close(summed, x + residual, atol=0, rtol=0)  # the sum, written back in place
    torch.testing.assert_close(normed, reference(x + residual, weight, 1e-5), **TOLERANCE)


def test_qk_norm_per_head_of_a_strided_projection():
    """q and k are views of one [tokens, q + k + v] projection: each head's row normed, the rest untouched."""
    heads, dim = 3, 16
    qkv = random(4, heads * dim + 2 * dim)
    q = qkv[:, :heads * dim].view(4, heads, dim)
    weight = random(dim, seed=3)
    assert not q.is_contiguous()
    torch.testing.assert_close(rms_norm(q, weight, 1e-6), llama_norm(q, weight, 1e-6),
                               **TOLERANCE)


def test_no_rows():
    assert rms_norm(random(0, 64), random(64), 1e-6).shape == (0, 64)
    assert gated_activation(random(0, 128), 64).shape == (0, 64)


@pytest.mark.parametrize("intermediate", [64, 1536, 100])
def test_silu_and_gelu_tanh_and_mul(intermediate):
    fused = random(3, 2 * intermediate)
    gate, up = fused.split(intermediate, dim=-1)
    torch.testing.assert_close(gated_activation(fused, intermediate), F.silu(gate) * up, **TOLERANCE)
    torch.testing.assert_close(gated_activation(fused, intermediate, gelu=True),
                               F.gelu(gate, approximate="tanh") * up, **TOLERANCE)


def test_the_registered_ops_run_the_kernels_and_pass_torchs_op_checks():
    """`llmctl::rms_norm` / `llmctl::gated_activation` (what the layers call on CUDA tensors): their schemas,
    the residual's mutation and the fake implementations (which the launch-count trace uses) checked by
    torch.library.opcheck, and their results those of the kernels."""
    from llmctl.engine.layers import fused_ops  # noqa: F401  (registers the ops)

    x, weight, residual = random(3, 64), random(64, seed=1), random(3, 64, seed=2)
    summed = residual.clone()
    torch.testing.assert_close(torch.ops.llmctl.rms_norm(x, weight, 1e-6, summed, True),
                               gemma_norm(x + residual, weight, 1e-6), **TOLERANCE)
    torch.testing.assert_close(summed, x + residual, atol=0, rtol=0)
    fused = random(3, 128, seed=3)
    torch.testing.assert_close(torch.ops.llmctl.gated_activation(fused, 64, False),
                               F.silu(fused[:, :64]) * fused[:, 64:], **TOLERANCE)
    for args in ((x, weight, 1e-6, residual.clone(), False), (x, weight, 1e-6, None, True)):
        torch.library.opcheck(torch.ops.llmctl.rms_norm.default, args,
                              test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(torch.ops.llmctl.gated_activation.default, (fused, 64, True),
                          test_utils=("test_schema", "test_faketensor"))
