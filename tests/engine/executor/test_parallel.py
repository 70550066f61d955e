"""Tensor and pipeline parallelism over real processes (gloo on CPU): sharded engines produce the
tokens and log-probabilities of the single-process engine, on every architecture and format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers.models import quantized_model, random_model
from llmctl import LLM, SamplingParams
from llmctl.engine.errors import EngineConfigError

PROMPTS = ["The capital of France is", "Hello, my name is", [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18]]
PARAMS = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=0)


@pytest.fixture(scope="module")
def models(tmp_path_factory, tokenizer) -> dict[str, Path]:
    from transformers import BloomConfig, LlamaConfig, OPTConfig, Qwen2Config

    tmp = tmp_path_factory.mktemp("parallel")
    vocab = len(tokenizer)
    out = {
        "llama-1kv": random_model(LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                                              num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1,
                                              tie_word_embeddings=False), tmp / "llama", tokenizer),
        "qwen2": random_model(Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
                              tmp / "qwen2", tokenizer),
        "bloom": random_model(BloomConfig(vocab_size=vocab, hidden_size=72, n_layer=3, n_head=6),  # 3 heads/rank
                              tmp / "bloom", tokenizer),
        "opt": random_model(OPTConfig(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, ffn_dim=128,
                                      num_attention_heads=4, max_position_embeddings=256, word_embed_proj_dim=32),
                            tmp / "opt", tokenizer),
    }
    dense = random_model(LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2), tmp / "llama-q", tokenizer)
    out["gptq"] = quantized_model(dense, "gptq", tokenizer, tmp)
    out["awq"] = quantized_model(dense, "awq", tokenizer, tmp)
    return out


def generate(folder: Path, tp: int = 1, pp: int = 1, **engine):
    llm = LLM(str(folder), tensor_parallel_size=tp, pipeline_parallel_size=pp, max_model_len=128,
              max_num_batched_tokens=9, kv_cache_memory=64 * 1024**2, **engine)  # chunked prefill across ranks too
    try:
        outputs = llm.generate(PROMPTS, PARAMS)
        memory = llm.engine.executor.rank_memory
        assert llm.engine.steps_ahead > 0 or not engine.get("async_scheduling")
    finally:
        llm.shutdown()
    return [(o.outputs[0].token_ids, [lp.logprob for lp in o.outputs[0].logprobs]) for o in outputs], memory


def assert_same(expected, got, tolerance: float = 1e-4) -> None:
    for (tokens, logprobs), (their_tokens, their_logprobs) in zip(expected, got):
        assert their_tokens == tokens
        assert len(their_logprobs) == len(logprobs)
        assert max((abs(a - b) for a, b in zip(logprobs, their_logprobs)), default=0.0) <= tolerance


def transformers_greedy(folder: Path, tokenizer) -> list[tuple[list[int], list[float]]]:
    """PROMPTS greedily continued by transformers itself, with each chosen token's log-probability."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    out = []
    for prompt in PROMPTS:
        ids = torch.tensor([prompt if isinstance(prompt, list) else tokenizer(prompt)["input_ids"]])
        with torch.no_grad():
            ref = hf.generate(ids, do_sample=False, max_new_tokens=PARAMS.max_tokens, min_new_tokens=PARAMS.max_tokens,
                              output_logits=True, return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
        tokens = ref.sequences[0, ids.shape[1]:].tolist()
        out.append((tokens, [step.log_softmax(-1)[0, t].item() for step, t in zip(ref.logits, tokens)]))
    return out


ASYNC = {"async_scheduling": True}  # the driver's steps on their own thread (llmctl.engine.executor.overlap)
LAYOUTS = {"llama-1kv": [(2, 1), (1, 2), (2, 2), (4, 1)],  # TP 4: the one KV head on every rank
           "qwen2": [(2, 1, ASYNC), (1, 2)], "bloom": [(2, 1), (2, 2)],
           "opt": [(2, 1), (1, 2)], "gptq": [(2, 1), (1, 2)], "awq": [(2, 1)]}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_sharded_engines_equal_one_process(models, name):
    expected, _ = generate(models[name])
    for tp, pp, *engine in LAYOUTS[name]:
        got, memory = generate(models[name], tp, pp, **(engine[0] if engine else {}))
        assert len(memory) == tp * pp
        assert_same(expected, got)


def test_tp2_steps_through_the_cuda_graph_buffers_equal_transformers(models, tokenizer):
    """Every TP rank runs decode steps through the graphs' static buffers (captured on GPUs, the
    all-reduces inside; run eagerly here), the same tokens as transformers."""
    llm = LLM(str(models["qwen2"]), tensor_parallel_size=2, max_model_len=128, max_num_seqs=4,
              kv_cache_memory=64 * 1024**2, attention_backend="triton", graph_buffers_on_cpu=True)
    try:
        graphs = llm.engine.executor.stage.runner.graphs
        shapes: list[tuple[int, int]] = []
        run = graphs.run
        graphs.run = lambda batch, shape, *rest: shapes.append(shape) or run(batch, shape, *rest)
        outputs = llm.generate(PROMPTS, PARAMS)
    finally:
        llm.shutdown()
    assert (4, 1) in shapes  # three sequences decoded together in the size-4 buffers
    got = [(o.outputs[0].token_ids, [lp.logprob for lp in o.outputs[0].logprobs]) for o in outputs]
    assert_same(transformers_greedy(models["qwen2"], tokenizer), got, tolerance=1e-3)


def test_the_driver_keeps_a_bounded_number_of_sends(models):
    """Gloo sends report completion only when waited on; a server must not keep every step's buffers."""
    llm = LLM(str(models["qwen2"]), pipeline_parallel_size=2, max_model_len=128, kv_cache_memory=64 * 1024**2)
    try:
        llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=60, ignore_eos=True))
        outbox = llm.engine.executor.stage.outbox
        assert outbox.sent > 2 * outbox.MAX_PENDING  # enough steps that an unbounded list would show
        assert outbox.pending <= outbox.MAX_PENDING
    finally:
        llm.shutdown()


SAMPLED = [SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=7, max_tokens=12, ignore_eos=True, logprobs=2),
           SamplingParams(temperature=1.0, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.4,
                          min_p=0.05, seed=8, max_tokens=12, ignore_eos=True),
           SamplingParams(temperature=0.7, min_tokens=6, stop_token_ids=[3, 4], seed=9, max_tokens=12),
           SamplingParams(temperature=0.9, n=2, seed=10, max_tokens=8, ignore_eos=True, prompt_logprobs=1)]


def sampled_outputs(folder: Path, pp: int, results: list | None = None):
    llm = LLM(str(folder), pipeline_parallel_size=pp, max_model_len=128, kv_cache_memory=64 * 1024**2)
    executor = llm.engine.executor
    if results is not None:  # a spy: what each collected step came back as
        collect = executor.collect
        executor.collect = lambda: results.append(collect()) or results[-1]
    try:
        outputs = llm.generate([PROMPTS[0]] * len(SAMPLED), SAMPLED)
    finally:
        llm.shutdown()
    return [[(c.token_ids, [lp.logprob for lp in c.logprobs or []]) for c in o.outputs] for o in outputs], \
        [[lp and lp.logprob for lp in o.prompt_logprobs or []] for o in outputs]


def test_the_last_stage_samples_as_the_driver_does(models):
    """With PP the last stage samples from the inputs the batch carries (uniforms drawn by the driver,
    penalty and stop ids); seeded outputs equal one process's. Steps it cannot sample from the batch
    alone (prompt log-probabilities, an n > 1 request's first token) come back as logits."""
    from llmctl.engine.core.step_messages import SampledTokens, StepLogits

    expected, expected_prompt = sampled_outputs(models["qwen2"], 1)
    results: list = []
    got, got_prompt = sampled_outputs(models["qwen2"], 2, results)
    for choices, their_choices in zip(expected, got):
        assert_same(choices, their_choices)
    assert [len(o) for o in got] == [1, 1, 1, 2]
    for logprobs, theirs in zip(expected_prompt, got_prompt):
        assert [a is None for a in logprobs] == [b is None for b in theirs]
        assert all(abs(a - b) <= 1e-4 for a, b in zip(logprobs, theirs) if a is not None)
    kinds = {type(result) for result in results}
    assert kinds == {SampledTokens, StepLogits}


def test_each_rank_holds_what_the_plan_says(models):
    from llmctl.checkpoint.config_file import load_spec
    from llmctl.checkpoint.source import resolve_model
    from llmctl.sizing.kv import stage_kv
    from llmctl.sizing.memory import kv_pool
    from llmctl.sizing.weights import pipeline_stages, stage_weights, weight_format

    folder = models["llama-1kv"]
    spec = load_spec(resolve_model(str(folder)))
    _, memory = generate(folder, 2, 2)
    weights = stage_weights(spec, weight_format(4, None, spec), 2, 2)
    stages = pipeline_stages(spec, 2)
    pools = [kv_pool(64 * 1024**2, stage_kv(spec, 2, layers, 4, 16)) for layers in stages]
    blocks = min(pool.num_blocks for pool in pools)  # the pool every rank can hold
    for rank, (weights_bytes, kv_bytes) in enumerate(memory):
        stage = rank // 2
        assert weights_bytes == weights[stage].total_bytes
        assert kv_bytes == blocks * stage_kv(spec, 2, stages[stage], 4, 16).block_bytes


def test_wrong_layouts_are_one_line_before_any_process_starts(models):
    with pytest.raises(EngineConfigError, match=r"--tp 3 .*TP sizes that work: 1, 2, 4"):
        LLM(str(models["llama-1kv"]), tensor_parallel_size=3)
    with pytest.raises(EngineConfigError, match=r"PP 4 exceeds the 3 layers"):
        LLM(str(models["llama-1kv"]), pipeline_parallel_size=4)


def test_quantized_groups_that_do_not_split_name_the_sizes_that_work(models):
    with pytest.raises(EngineConfigError, match=r"group size 32.*TP sizes that work: 1, 2\b"):
        LLM(str(models["gptq"]), tensor_parallel_size=4)


def test_qwen1_runs_natively_as_qwen2_does(tmp_path, tokenizer):
    """Qwen (1) checkpoints (QWenLMHeadModel, remote code in its repo) with Qwen2's remapped weights."""
    from safetensors.torch import load_file, save_file
    from transformers import Qwen2Config

    source = random_model(Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4),
                          tmp_path / "qwen2-mha", tokenizer)  # Qwen (1) has as many KV heads as heads
    tensors = load_file(str(source / "model.safetensors"))
    config = json.loads((source / "config.json").read_text())
    renamed = {}
    for layer in range(config["num_hidden_layers"]):
        old, new = f"model.layers.{layer}.", f"transformer.h.{layer}."
        for kind in ("weight", "bias"):
            renamed[f"{new}attn.c_attn.{kind}"] = torch.cat(
                [tensors.pop(f"{old}self_attn.{p}_proj.{kind}") for p in "qkv"])
        for ours, theirs in (("self_attn.o_proj", "attn.c_proj"), ("mlp.gate_proj", "mlp.w2"),
                             ("mlp.up_proj", "mlp.w1"), ("mlp.down_proj", "mlp.c_proj"),
                             ("input_layernorm", "ln_1"), ("post_attention_layernorm", "ln_2")):
            renamed[f"{new}{theirs}.weight"] = tensors.pop(f"{old}{ours}.weight")
    renamed["transformer.wte.weight"] = tensors.pop("model.embed_tokens.weight")
    renamed["transformer.ln_f.weight"] = tensors.pop("model.norm.weight")
    renamed["lm_head.weight"] = tensors.pop("lm_head.weight", renamed["transformer.wte.weight"]).clone()
    qwen = tmp_path / "qwen1"
    qwen.mkdir()
    save_file(renamed, str(qwen / "model.safetensors"))
    (qwen / "config.json").write_text(json.dumps({
        "architectures": ["QWenLMHeadModel"], "model_type": "qwen", "auto_map": {"AutoConfig": "x.QWenConfig"},
        "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": config["num_hidden_layers"],
        "num_attention_heads": 4, "kv_channels": 16, "vocab_size": config["vocab_size"], "seq_length": 128,
        "max_position_embeddings": 256, "rotary_emb_base": config.get("rope_theta", 10000.0),
        "layer_norm_epsilon": config["rms_norm_eps"], "no_bias": True, "torch_dtype": "float32"}))
    tokenizer.save_pretrained(qwen)
    # the reference is transformers' Qwen2 on the source weights (Qwen (1)'s own code is remote, not on this
    # machine): a Qwen (1) block is Qwen2's with fused c_attn, no KV sharing and no biases but c_attn's
    expected = transformers_greedy(source, tokenizer)
    assert_same(expected, generate(qwen)[0], tolerance=1e-3)
    assert_same(expected, generate(qwen, 2)[0], tolerance=1e-3)
    # past seq_length Qwen (1) would need logn attention and dynamic NTK: refused, not computed wrongly
    with pytest.raises(EngineConfigError, match=r"longer than the model's context \(128, from seq_length\)"):
        LLM(str(qwen), max_model_len=256)


def test_each_rank_takes_its_share_of_the_cores(monkeypatch):
    from llmctl.engine.config import EngineConfig
    from llmctl.engine.worker.threads import available_cores, threads_per_rank

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    cores = available_cores()
    assert threads_per_rank(EngineConfig()) == cores
    assert threads_per_rank(EngineConfig(pipeline_parallel_size=2)) == max(1, cores // 2)
    assert threads_per_rank(EngineConfig(tensor_parallel_size=2, data_parallel_size=2)) == max(1, cores // 4)
    assert threads_per_rank(EngineConfig(cpu_threads=3)) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert threads_per_rank(EngineConfig(pipeline_parallel_size=2)) == 5
    before = torch.get_num_threads()
    try:
        LLM(None, cpu_threads=1, max_model_len=64)  # one process: --cpu-threads applies to it too
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_messages_between_ranks_carry_tensors_in_one_buffer():
    """A step's batch goes as one gloo message (one round trip); bigger ones (logits) as two,
    and every tensor comes back equal, dtype and shape included, as a view of the buffer."""
    from llmctl.engine.distributed.channel import FIRST_PART, _decode, encode

    small = {"ids": torch.arange(7, dtype=torch.int32), "empty": torch.zeros(0, 4), "scalar": torch.tensor(2.5),
             "flags": torch.tensor([True, False]), "half": torch.randn(3, 5).to(torch.bfloat16), "note": "x"}
    logits = torch.randn(16, 49152)
    for obj in (small, {"logits": logits, "rows": [1, 2]}, logits[:, ::2]):
        parts = encode(obj)
        assert parts[0].numel() == FIRST_PART and len(parts) == (1 if obj is small else 2)
        rest_received = []
        decoded = _decode(parts[0].clone(), lambda rest: rest_received.append(rest.copy_(parts[1])))
        assert len(rest_received) == len(parts) - 1
        expected = obj if isinstance(obj, dict) else {"t": obj}
        got = decoded if isinstance(decoded, dict) else {"t": decoded}
        for key, value in expected.items():
            if isinstance(value, torch.Tensor):
                assert got[key].dtype == value.dtype and got[key].shape == value.shape
                assert torch.equal(got[key], value)
            else:
                assert got[key] == value


def test_a_step_that_fails_to_sample_on_the_last_stage_comes_back_as_its_error():
    """The rank goes on; the driver fails that step's requests (RemoteStepError → StepFailedError)."""
    from llmctl.engine.core.step_messages import SampledTokens, SampleInput, StepBatch, StepFailed, StepLogits
    from llmctl.engine.executor.stage import step_result

    batch = StepBatch([5], [0], [0], [0, 1], [1], [[0]], [0],
                      sampling=[SampleInput(SamplingParams(temperature=0), 0.0, [])])
    logits = torch.zeros(1, 8)
    logits[0, 3] = 1.0
    assert step_result(batch, StepLogits(logits, {})) == SampledTokens([(3, None)])
    failed = step_result(batch, StepLogits(torch.zeros(1, 0), {}))  # no vocabulary to sample from
    assert isinstance(failed, StepFailed) and failed.reason.startswith("sampling failed: ")
