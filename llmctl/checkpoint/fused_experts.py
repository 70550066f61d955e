"""Experts stored whole-layer (`experts.gate_up_proj` [E, 2I, H], gate rows then up rows; `experts.down_proj` [E, H, I]
— as Qwen3.5-MoE publishes them) seen as the per-expert tensors transformers writes (`experts.{e}.gate_proj.weight`
…), read lazily: a rank reads only the experts and rows it holds."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from llmctl.checkpoint.weights import CheckpointTensor


def per_expert(tensors: Iterable[CheckpointTensor]) -> Iterator[CheckpointTensor]:
    """Every tensor as it is, but whole-layer expert tensors as one view per expert and projection."""
    for tensor in tensors:
        prefix, _, kind = tensor.name.rpartition(".")
        if kind == "gate_up_proj" and prefix.endswith(".experts") and len(tensor.shape) == 3:
            experts, rows, _ = tensor.shape
            for expert in range(experts):
                yield _view(tensor, f"{prefix}.{expert}.gate_proj.weight", expert, 0, rows // 2)
                yield _view(tensor, f"{prefix}.{expert}.up_proj.weight", expert, rows // 2, rows // 2)
        elif kind == "down_proj" and prefix.endswith(".experts") and len(tensor.shape) == 3:
            for expert in range(tensor.shape[0]):
                yield _view(tensor, f"{prefix}.{expert}.down_proj.weight", expert, 0, tensor.shape[1])
        else:
            yield tensor


def _view(tensor: CheckpointTensor, name: str, expert: int, row0: int, rows: int) -> CheckpointTensor:
    def read(index: tuple[slice, ...]) -> object:
        first, *rest = index
        start = row0 + (first.start or 0)
        stop = row0 + (rows if first.stop is None else first.stop)
        return tensor._reader((slice(expert, expert + 1), slice(start, stop), *rest))[0]

    return CheckpointTensor(name, (rows, *tensor.shape[2:]), read, tensor._dtype)  # type: ignore[arg-type]
