"""EngineConfig.validate() parses vLLM's JSON flags once, into the dataclasses the engine and server read."""

from __future__ import annotations

import pytest

from llmctl.engine.config import EngineConfig
from llmctl.engine.spec_decode.config import SpeculativeConfig
from llmctl.engine.structured.config import StructuredOutputsConfig
from llmctl.errors import LlmctlError


def test_the_json_flags_are_parsed_once_into_dataclasses():
    config = EngineConfig(model="m", speculative_config='{"method": "ngram", "num_speculative_tokens": 3}',
                          structured_outputs_config='{"disable_any_whitespace": true}',
                          guided_decoding_backend="guidance")
    config.validate()  # with neither n-gram bound given both are 5, as vLLM's SpeculativeConfig sets them
    assert config.speculative == SpeculativeConfig("ngram", 3, 5, 5)
    assert config.structured_outputs == StructuredOutputsConfig(backend="guidance", disable_any_whitespace=True)
    assert isinstance(config.speculative_config, SpeculativeConfig)  # the field itself now holds the dataclass
    config.validate()  # again (serve validates, then the engine): the parsed values stay as they are
    assert config.speculative == SpeculativeConfig("ngram", 3, 5, 5)
    assert config.structured_outputs.backend == "guidance"


def test_defaults_parse_to_off_and_auto():
    config = EngineConfig(model="m")
    config.validate()
    assert config.speculative is None and config.structured_outputs == StructuredOutputsConfig()


@pytest.mark.parametrize("flags, message", [
    ({"speculative_config": "{not json"}, "--speculative-config is not valid JSON"),
    ({"structured_outputs_config": '{"backend": "outlines"}'}, "'outlines' is not one of auto, xgrammar, guidance"),
    ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 2}, "tensor_parallel_size": 2},
     "--speculative-config runs with --tensor-parallel-size 1"),
])
def test_bad_json_flags_are_refused_at_validate(flags, message):
    with pytest.raises(LlmctlError, match=message.replace("(", r"\(")):
        EngineConfig(model="m", **flags).validate()


def test_vllm_cpu_kvcache_space_sizes_the_cpu_kv_cache_when_no_flag_does(monkeypatch):
    from llmctl.engine.config import cpu_kv_cache_default

    for value, expected in (("", 2 << 30), ("0", 2 << 30), ("4", 4 << 30), ("0.25", 1 << 28)):  # 0: vLLM's default
        monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", value)
        assert cpu_kv_cache_default() == expected, value
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE")
    assert cpu_kv_cache_default() == 2 << 30
    for bad in ("4GB", "-1", "nan"):
        monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", bad)
        with pytest.raises(LlmctlError, match=f"VLLM_CPU_KVCACHE_SPACE='{bad}' is not a size in GiB"):
            EngineConfig(model="m").validate()
        EngineConfig(model="m", kv_cache_memory=1 << 20).validate()  # the flag wins: the variable is not read
