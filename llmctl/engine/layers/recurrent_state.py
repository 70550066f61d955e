"""The state cache beside the paged KV cache (vLLM's Mamba state, one slot per running sequence): each recurrent
layer (Mamba, Mamba2, gated DeltaNet) keeps, per slot, the causal convolution's last inputs and its recurrent state. A sequence takes a slot when it
is admitted and gives it back when it finishes or is preempted (llmctl.engine.core.block_manager); a preempted
sequence is recomputed from its first token, so its state starts again from zeros. A step's StateStep says
which slot each sequence uses and whether its state starts fresh (the first chunk of its prompt)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType

import torch

from llmctl.checkpoint.spec import StateMixer

KERNELS_ON_CPU = "LLMCTL_RECURRENT_DECODE_KERNELS"  # "1": the GPU kernels on CPU tensors (interpreter tests)


def triton_kernels_for(x: torch.Tensor) -> bool:
    """Whether the recurrent layers run Triton's kernels: on CUDA tensors, and on CPU ones under Triton's interpreter
    when KERNELS_ON_CPU says so (how the tests run that path here)."""
    return x.is_cuda or (os.environ.get(KERNELS_ON_CPU) == "1" and os.environ.get("TRITON_INTERPRET") == "1")


def decode_kernel(x: torch.Tensor, states: torch.Tensor) -> ModuleType | None:
    """The kernels that advance the decodes' states in place in their slots (ssd_decode, delta_rule_decode,
    selective_scan_decode): Triton's (kernels/recurrent_decode.py) on CUDA tensors, and on CPU ones under Triton's
    interpreter when KERNELS_ON_CPU says so (how the tests run that path here); the C++ ones
    (kernels/cpu_recurrent.cpp) where they are built and the states are float32 or bfloat16; None: torch's."""
    if triton_kernels_for(x):
        from llmctl.kernels import recurrent_decode

        return recurrent_decode
    from llmctl.kernels import cpu as cpu_kernels

    if states.dtype in (torch.float32, torch.bfloat16) and cpu_kernels.fused_layers_for(x):
        return cpu_kernels
    return None


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


MAX_DECODE_RUNS = 4  # runs of consecutive slots decoded apart before one gathered batch is cheaper


def _consecutive_runs(sorted_slots: list[int]) -> list[tuple[int, int]]:
    """[start, end) positions of each run of consecutive values in an ascending list."""
    runs: list[tuple[int, int]] = []
    for position, slot in enumerate(sorted_slots):
        if runs and slot == sorted_slots[position - 1] + 1:
            runs[-1] = (runs[-1][0], position + 1)
        else:
            runs.append((position, position + 1))
    return runs


@dataclass
class StateStep:
    """One step as the recurrent layers see it: per scheduled sequence, its rows, its slot, a fresh start."""

    cache: StateCache
    query_start_loc: list[int]  # [S + 1]
    slots: list[int]  # [S]
    fresh: list[bool]  # [S]: no token of the sequence was computed before this step
    device: torch.device
    # sequences continuing by one token, batched by runs of consecutive slots (a run's states are a view of the
    # cache: no gather, no scatter), or all together through index tensors where the slots are too scattered
    decode_runs: list[tuple[torch.Tensor | slice, torch.Tensor | slice]] = field(init=False)  # (rows, slots)
    all_decodes: list[tuple[torch.Tensor | slice, torch.Tensor]] = field(init=False)
    prefills: list[int] = field(init=False)  # the others, one at a time

    def __post_init__(self) -> None:
        starts = self.query_start_loc
        decodes = [i for i in range(len(self.slots)) if starts[i + 1] - starts[i] == 1 and not self.fresh[i]]
        self.prefills = [i for i in range(len(self.slots))
                         if starts[i + 1] > starts[i] and i not in set(decodes)]
        decodes.sort(key=lambda i: self.slots[i])
        runs = _consecutive_runs([self.slots[i] for i in decodes])
        if len(runs) > MAX_DECODE_RUNS:  # one gathered batch costs less than many small ones
            runs = [(0, len(decodes))]
        self.decode_runs = [(self._indexer([starts[i] for i in decodes[a:b]]),
                             self._indexer([self.slots[i] for i in decodes[a:b]])) for a, b in runs]
        # all decodes at once, for the kernels that index the slots themselves
        self.all_decodes = [(self._indexer([starts[i] for i in decodes]),
                             torch.tensor([self.slots[i] for i in decodes], dtype=torch.int64, device=self.device))
                            ] if decodes else []

    @classmethod
    def graph_decodes(cls, cache: StateCache, slots: torch.Tensor) -> StateStep:
        """A decode step over the CUDA graphs' static buffers (llmctl.engine.worker.cuda_graphs): one token per row,
        each row's slot read from `slots` [rows] on the device (-1: a padding row, which the kernels skip)."""
        step = cls(cache, [], [], [], slots.device)
        rows = slice(0, slots.shape[0])
        step.decode_runs, step.all_decodes = [(rows, slots)], [(rows, slots)]
        return step

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
PrefillBatch = Callable[[list[slice], MambaState, list[int]], list[torch.Tensor]]  # several sequences at once


def run_by_sequence(states: StateStep, layer: int, out: torch.Tensor, decode: Decode, prefill: Prefill,
                    indexed: bool = False, prefill_batch: PrefillBatch | None = None) -> None:
    """A recurrent layer over the step: the decodes together (by runs of consecutive slots, or all at once with
    their slots as an index tensor where `indexed`: a kernel updates them in place), then the prompt chunks from
    their sequences' states (zeroed first for a first chunk) — one at a time, or with `prefill_batch` those of
    similar lengths together (padded to the longest, at most twice each one); each writes its rows of `out`."""
    state = states.layer(layer)
    for rows, slots in states.all_decodes if indexed else states.decode_runs:
        out[rows] = decode(rows, state, slots)
    for seq in states.prefills:
        if states.fresh[seq]:
            state.conv[states.slots[seq]].zero_()
            state.ssm[states.slots[seq]].zero_()
    for group in _length_groups(states) if prefill_batch is not None else [[seq] for seq in states.prefills]:
        spans = [states.rows(seq) for seq in group]
        if len(group) == 1 or prefill_batch is None:
            out[spans[0]] = prefill(spans[0], state, states.slots[group[0]])
            continue
        for span, y in zip(spans, prefill_batch(spans, state, [states.slots[seq] for seq in group])):
            out[span] = y


def _length_groups(states: StateStep) -> list[list[int]]:
    """The prompt chunks grouped by length bucket (powers of two): padding each to its group's longest at most
    doubles it."""
    groups: dict[int, list[int]] = {}
    for seq in states.prefills:
        length = states.query_start_loc[seq + 1] - states.query_start_loc[seq]
        groups.setdefault((length - 1).bit_length(), []).append(seq)
    return list(groups.values())
