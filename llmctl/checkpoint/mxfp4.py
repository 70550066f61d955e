"""gpt-oss's own MXFP4 (`quant_method: mxfp4`): each expert tensor stored as `NAME_blocks` [E, rows, cols / 32,
16] — 32 FP4 (E2M1) values per block, two per byte, the low nibble first — and `NAME_scales` [E, rows, cols / 32],
one E8M0 exponent per block (2^(byte − 127)). Rows are the output features (a linear's layout), so the values
are transposed into the layout the unquantized gpt-oss checkpoints store: gate_up_proj [E, H, 2I] and down_proj
[E, I, H]. Dequantized once at load, an expert at a time (its float32 values are the only temporary)."""

from __future__ import annotations

import torch

FP4_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
BLOCKS, SCALES = "_blocks", "_scales"


def mxfp4_values(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """blocks uint8 [..., G, 16], scales uint8 [..., G] -> float32 [..., G · 32]."""
    table = torch.tensor(FP4_E2M1, dtype=torch.float32)
    codes = blocks.to(torch.uint8)
    values = torch.stack([table[(codes & 0x0F).long()], table[(codes >> 4).long()]], dim=-1).flatten(-2)
    exponents = scales.to(torch.int32).unsqueeze(-1) - 127
    return torch.ldexp(values, exponents).flatten(-2)


class Mxfp4ExpertsDequantizer:
    """compressed-tensors' Converter protocol (llmctl.checkpoint.converted_stream): NAME_blocks with its
    NAME_scales -> NAME in `dtype`, [E, cols, rows]."""

    def __init__(self, names: set[str], dtype: torch.dtype) -> None:
        self.names, self.dtype = names, dtype

    def is_companion(self, name: str) -> bool:
        return name.endswith(SCALES) and name.removesuffix(SCALES) + BLOCKS in self.names

    def get_dependencies(self, weight_name: str) -> set[str]:
        scales = weight_name.removesuffix(BLOCKS) + SCALES
        return {scales} if weight_name.endswith(BLOCKS) and scales in self.names else set()

    def process(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        name = next(n for n in tensors if n.endswith(BLOCKS))
        blocks, scales = tensors[name], tensors[name.removesuffix(BLOCKS) + SCALES]
        experts, rows, groups, _ = blocks.shape
        out = torch.empty(experts, groups * 32, rows, dtype=self.dtype)
        for expert in range(experts):
            out[expert] = mxfp4_values(blocks[expert], scales[expert]).t()
        return {name.removesuffix(BLOCKS): out}
