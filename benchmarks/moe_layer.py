"""One routed-experts layer on the CPU (llmctl.engine.layers.moe.FusedMoE), each expert's weights through
torch's F.linear ("plain") or packed for llmctl's CPU GEMM as the dense linears are ("packed", what the
engine runs): the fastest of 15 calls, at decode-sized (16, 64 rows) and prefill-sized batches, plain
timed before and after packed (two cores are noisy), and the largest difference between the two outputs.

    python benchmarks/moe_layer.py
"""

import torch
from cpu_int4 import fastest  # benchmarks/ is this script's folder
from torch import nn

from llmctl.engine.distributed.group import TPGroup
from llmctl.engine.layers import cpu_gemm
from llmctl.engine.layers.moe import FusedMoE, Routing


def main() -> None:
    torch.manual_seed(0)
    for hidden, inter, experts in [(512, 1024, 8), (512, 512, 16), (2048, 1408, 64)]:
        layer = FusedMoE(experts, hidden, inter, Routing(2, True), TPGroup())
        with torch.no_grad():
            layer.w13.normal_(0, 0.02)
            layer.w2.normal_(0, 0.02)
        cpu_gemm.pack_linears(nn.Sequential(layer))
        packs = layer.packed_experts
        for tokens in (16, 64, 256):
            x, logits = torch.randn(tokens, hidden), torch.randn(tokens, experts)
            layer.packed_experts = None
            reference, before = layer(x, logits), fastest(lambda: layer(x, logits))
            layer.packed_experts = packs
            out, packed = layer(x, logits), fastest(lambda: layer(x, logits))
            layer.packed_experts = None
            after = fastest(lambda: layer(x, logits))
            layer.packed_experts = packs
            print(f"hidden {hidden}, intermediate {inter}, {experts} experts top-2, {tokens} tokens: plain "
                  f"{before * 1e3:.2f} / {after * 1e3:.2f} ms, packed {packed * 1e3:.2f} ms "
                  f"(max diff {(out - reference).abs().max():.1e})")


if __name__ == "__main__":
    main()
