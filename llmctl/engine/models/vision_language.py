"""What the vision-language families share: a Llama-family language model from the config's text_config, with
an image tower beside it on the first pipeline stage (not built when images are off: --limit-mm-per-prompt
'{"image": 0}'). The subclass builds the tower and says how one image becomes embeddings (encode_image)."""

from __future__ import annotations

from typing import Any

from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.models.common import Shard
from llmctl.engine.models.llama import LlamaForCausalLM


class VisionLanguageModel(LlamaForCausalLM):
    supports_lora = False  # adapters name the language model's layers under prefixes not mapped yet

    def __init__(self, spec: ModelSpec, hf_config: Any, shard: Shard | None = None) -> None:
        super().__init__(spec, hf_config.get_text_config(), shard)
        self.supports_lora = False
        self.takes_images = self.shard.is_first and not getattr(hf_config, "llmctl_text_only", False)
