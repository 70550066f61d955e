"""No host synchronization inside the CUDA path's forward and sampling, checked without a GPU: the model and the
logits are fake CUDA tensors (helpers/fake_cuda.py) and every op is watched for what makes a host wait for the
device — a scalar read, a copy to the host, an op whose output size depends on values. The forward has none; the
sampler has exactly one, its final copy of the step's tokens (and log-probabilities) to the host."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from helpers.fake_cuda import BATCH, FAMILIES, FakeCudaIndexing, fake_cuda_step, on_fake_gpu, prepare
from llmctl.engine.core.step_messages import SampleInput
from llmctl.engine.sample.sampler import sample
from llmctl.engine.sampling_params import SamplingParams

aten = torch.ops.aten
VALUE_SIZED = {aten.nonzero.default, aten.masked_select.default, aten._unique2.default, aten.unique_dim.default,
               aten.unique_consecutive.default, aten.repeat_interleave.Tensor, aten.bincount.default}


class HostSyncs(TorchDispatchMode):
    """The ops on CUDA tensors after which the host waits for the device, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        on_gpu = any(isinstance(t, torch.Tensor) and t.device.type == "cuda" for t in tree_leaves((args, kwargs)))
        if func is aten._local_scalar_dense.default:
            if on_gpu:
                self.found.append("a scalar read (.item(), .tolist(), bool())")
            return 0  # a fake tensor has no value; any number lets the code go on
        if on_gpu and func is aten._to_copy.default and kwargs.get("device") == torch.device("cpu"):
            self.found.append("a copy to the host")
        elif on_gpu and func is aten.copy_.default and args[0].device.type == "cpu":
            self.found.append("a copy to the host")
        elif on_gpu and func in VALUE_SIZED and not (func is aten.repeat_interleave.Tensor and
                                                     kwargs.get("output_size") is not None):
            self.found.append(f"{func}: an output sized by values")
        return func(*args, **kwargs)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_decode_steps_forward_and_logits_never_wait_for_the_device(family):
    step = fake_cuda_step(FAMILIES[family]())
    with step.mode, torch.no_grad():
        prepare(step)
        with HostSyncs() as syncs, FakeCudaIndexing() as indexing:
            hidden = step.model(step.input_ids, step.ctx)
            logits = step.model.compute_logits(hidden).float()
    assert logits.shape == (BATCH, 256) and logits.device.type == "cuda"
    assert syncs.found == [] and indexing.masks == 0


ROWS = [SamplingParams(temperature=0), SamplingParams(temperature=0.7, top_k=20, top_p=0.9, seed=1),
        SamplingParams(temperature=1.0, min_p=0.1, repetition_penalty=1.2, presence_penalty=0.3,
                       frequency_penalty=0.2, logprobs=3),
        SamplingParams(temperature=0, logit_bias={5: 2.0}, allowed_token_ids=[5, 6, 7], logprobs=0)]


@pytest.mark.parametrize("rows", [ROWS[:1], ROWS])
def test_sampling_waits_for_the_device_once(rows, monkeypatch):
    """Every setting on one batch, log-probabilities included: one copy to the host at the end."""
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *args: self)  # a host-side allocation, no GPU here
    inputs = [SampleInput(params, 0.5 if not params.greedy else 0.0, blocked_token_ids=[9] if i == 1 else [],
                          seen_token_ids=[1, 2, 3], output_token_ids=[2, 3, 3]) for i, params in enumerate(rows)]
    step = fake_cuda_step(FAMILIES["llama"]())
    with step.mode, torch.no_grad():
        logits = on_fake_gpu(step.mode, torch.empty(len(rows), 256))
        with HostSyncs() as syncs, FakeCudaIndexing() as indexing:
            sampled = sample(logits, inputs)
    assert len(sampled) == len(rows)
    assert syncs.found == ["a copy to the host"] and indexing.masks == 0
