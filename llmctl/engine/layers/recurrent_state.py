"""The state cache beside the paged KV cache (vLLM's Mamba state, one slot per running sequence): each recurrent
layer (Mamba, Mamba2, gated DeltaNet) keeps, per slot, the causal convolution's last inputs and its recurrent state. A sequence takes a slot when it
is admitted and gives it back when it finishes or is preempted (llmctl.engine.core.block_manager); a preempted
sequence is recomputed from its first token, so its state starts again from zeros. A step's StateStep says
which slot each sequence uses and whether its state starts fresh (the first chunk of its prompt)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from llmctl.checkpoint.spec import StateMixer

KERNELS_ON_CPU = "LLMCTL_RECURRENT_DECODE_KERNELS"  # "1": the GPU decode kernels on CPU tensors (interpreter tests)


def decode_kernels_apply(x: torch.Tensor) -> bool:
    """Whether decodes take the Triton kernels of kernels/recurrent_decode.py: on CUDA tensors; on CPU ones under
    Triton's interpreter when KERNELS_ON_CPU says so (how the tests run the layers' kernel path here)."""
    return x.is_cuda or (os.environ.get(KERNELS_ON_CPU) == "1" and os.environ.get("TRITON_INTERPRET") == "1")


@dataclass
class MambaState:
    conv: torch.Tensor  # [slots, conv_dim, conv_kernel - 1]: the last inputs of the convolution
    ssm: torch.Tensor  # [slots, heads, head_dim, state_size]


@dataclass
class StateCache:
    layers: dict[int, MambaState]  # by layer index: this process's recurrent layers
    slots: int  # sequences it holds states for

    @property
    def nbytes(self) -> int:
        return sum(s.conv.nbytes + s.ssm.nbytes for s in self.layers.values())


def allocate_states(mixer: StateMixer, layers: list[int], slots: int, dtype: torch.dtype, device: torch.device,
                    tp: int = 1) -> StateCache:
    """Each layer's states for `slots` sequences, this TP rank's heads and channels."""
    ssm_dtype = getattr(torch, mixer.ssm_state_dtype) if mixer.ssm_state_dtype else dtype
    return StateCache({layer: MambaState(torch.zeros((slots, *mixer.conv_state_shape(tp)), dtype=dtype, device=device),
                                         torch.zeros((slots, *mixer.ssm_state_shape(tp)), dtype=ssm_dtype,
                                                     device=device))
                       for layer in layers}, slots)


@dataclass
class StateStep:
    """One step as the recurrent layers see it: per scheduled sequence, its rows, its slot, a fresh start."""

    cache: StateCache
    query_start_loc: list[int]  # [S + 1]
    slots: list[int]  # [S]
    fresh: list[bool]  # [S]: no token of the sequence was computed before this step
    device: torch.device
    decode_slots: torch.Tensor | slice = field(init=False)  # sequences continuing by one token, batched together:
    # their slots, a slice where they are consecutive (views of the state, no gather or scatter)
    decode_rows: torch.Tensor | slice = field(init=False)  # their rows of the step, likewise
    decoding: bool = field(init=False)
    prefills: list[int] = field(init=False)  # the others, one at a time

    def __post_init__(self) -> None:
        starts = self.query_start_loc
        decodes = [i for i in range(len(self.slots)) if starts[i + 1] - starts[i] == 1 and not self.fresh[i]]
        self.prefills = [i for i in range(len(self.slots))
                         if starts[i + 1] > starts[i] and i not in set(decodes)]
        self.decode_slots = self._indexer([self.slots[i] for i in decodes])
        self.decode_rows = self._indexer([starts[i] for i in decodes])
        self.decoding = bool(decodes)

    def _indexer(self, indices: list[int]) -> torch.Tensor | slice:
        """A slice where the indices are consecutive (a view: no gather, no scatter), else an index tensor."""
        if indices and indices == list(range(indices[0], indices[0] + len(indices))):
            return slice(indices[0], indices[0] + len(indices))
        return torch.tensor(indices, dtype=torch.long, device=self.device)

    def layer(self, index: int) -> MambaState:
        return self.cache.layers[index]

    def rows(self, seq: int) -> slice:
        return slice(self.query_start_loc[seq], self.query_start_loc[seq + 1])


Decode = Callable[[torch.Tensor | slice, MambaState, torch.Tensor | slice], torch.Tensor]  # (rows, state, slots) -> y
Prefill = Callable[[slice, MambaState, int], torch.Tensor]  # (one sequence's rows, layer state, slot) -> outputs


def run_by_sequence(states: StateStep, layer: int, out: torch.Tensor, decode: Decode, prefill: Prefill) -> None:
    """A recurrent layer over the step: the decodes together, then each prompt chunk from its sequence's state
    (zeroed first for a first chunk); each writes its rows of `out`."""
    state = states.layer(layer)
    if states.decoding:
        out[states.decode_rows] = decode(states.decode_rows, state, states.decode_slots)
    for seq in states.prefills:
        span, slot = states.rows(seq), states.slots[seq]
        if states.fresh[seq]:
            state.conv[slot].zero_()
            state.ssm[slot].zero_()
        out[span] = prefill(span, state, slot)
