"""A checkpoint's tensors through a quantization converter (llmctl.checkpoint.quant_converters), as they stream.

A quantized weight arrives with companions (scales, zero points, shapes) that may come before or after it,
even in another file. Companions are held until their weight's group is complete; then the converter
decodes the group and its tensors go on. Everything else passes through untouched and unread (a TP
rank still reads only its slice). A weight whose companions never arrive is a broken checkpoint, said
by name; companions no weight asked for (static activation or KV-cache scales) are returned to the
caller, which says they are not used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from llmctl.checkpoint.quant_converters import Converter
from llmctl.checkpoint.weights import CheckpointTensor
from llmctl.errors import CorruptModelError

# tensors that only travel with a quantized weight (compressed-tensors' qparam names, fp8's weight_scale_inv)
COMPANIONS = ("weight_scale", "weight_scale_inv", "weight_zero_point", "weight_shape", "weight_g_idx",
              "weight_global_scale", "input_scale", "input_zero_point", "input_global_scale", "output_scale",
              "output_zero_point", "k_scale", "v_scale", "q_scale", "kv_scale")


def converted(tensors: Iterator[CheckpointTensor], converter: Converter, stored: dict[str, str],
              dtype: torch.dtype, unused: Callable[[list[str]], None]) -> Iterator[CheckpointTensor]:
    """`tensors` with every quantized group decoded; `stored`: every tensor of the checkpoint and its stored
    dtype (a tensor the converter would decode but that has none of its companions there is not quantized:
    an embedding matched by name only); `unused` hears the companions no weight took."""
    held: dict[str, torch.Tensor] = {}  # companions (and roots) read, waiting for their group
    roots: dict[str, set[str]] = {}  # root name -> the companions it needs
    companion = getattr(converter, "is_companion", None) or (lambda name: name.rpartition(".")[2] in COMPANIONS)
    for tensor in tensors:
        needs = converter.get_dependencies(tensor.name)
        if needs & stored.keys():
            roots[tensor.name] = needs
        elif not companion(tensor.name):
            if stored.get(tensor.name, "").startswith("F8"):  # read as it is, it would lose its scale
                raise CorruptModelError(f"{tensor.name} is stored in float8 with no scale (weight_scale or "
                                        "weight_scale_inv) beside it: the files are incomplete (download them again)")
            yield tensor
            continue
        held[tensor.name] = _exact(tensor)
        for root in [root for root, needs in roots.items() if root in held and needs <= held.keys()]:
            group = {name: held.pop(name) for name in [root, *roots.pop(root)]}
            for name, value in converter.process(group).items():
                yield CheckpointTensor(name, tuple(value.shape), value.__getitem__, dtype)
    for root, needs in roots.items():
        missing = sorted(needs - held.keys())
        raise CorruptModelError(f"{root} is quantized but the checkpoint has no {', '.join(missing)} for it: "
                                "the files are incomplete (download them again)")
    if held:
        unused(sorted(held))


def _exact(tensor: CheckpointTensor) -> torch.Tensor:
    """The stored tensor; 16-bit scales widened to float32, so the weights are decoded in float32 (as
    transformers does when it loads into float32) and rounded once, to the model's dtype."""
    value = tensor.read_stored()
    wide = tensor.name.rpartition(".")[2] in COMPANIONS and value.dtype in (torch.bfloat16, torch.float16)
    return value.float() if wide else value