"""LLaVA-1.5 (LlavaForConditionalGeneration): a CLIP tower's hidden states of one layer (its class token dropped
under the "default" strategy), a two-layer MLP projector, and a Llama-family language model whose
`<image>` placeholders take the projected patches."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.models.clip_vision import CLIPVisionModel
from llmctl.engine.models.common import Shard, Target
from llmctl.engine.models.vision_encoder import vision_activation
from llmctl.engine.models.vision_language import VisionLanguageModel


def feature_layers(config: Any) -> list[int]:
    """vision_feature_layer as indices into the tower's hidden states (input first, then each block)."""
    layers = config.vision_feature_layer
    total = config.vision_config.num_hidden_layers + 1
    return [layer % total for layer in ([layers] if isinstance(layers, int) else layers)]


class LlavaProjector(nn.Module):
    def __init__(self, config: Any, vision_width: int) -> None:
        super().__init__()
        text, bias = config.text_config.hidden_size, getattr(config, "multimodal_projector_bias", True)
        self.linear_1 = nn.Linear(vision_width, text, bias=bias)
        self.linear_2 = nn.Linear(text, text, bias=bias)
        self.act = vision_activation(config.projector_hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class LlavaForConditionalGeneration(VisionLanguageModel):
    def __init__(self, spec: ModelSpec, hf_config: Any, shard: Shard | None = None) -> None:
        super().__init__(spec, hf_config, shard)
        self.layer_indices = feature_layers(hf_config)
        self.keep_class_token = getattr(hf_config, "vision_feature_select_strategy", "default") == "full"
        vision = hf_config.vision_config
        self.vision_tower = CLIPVisionModel(vision, max(self.layer_indices)) if self.takes_images else None
        self.multi_modal_projector = LlavaProjector(hf_config, vision.hidden_size * len(self.layer_indices)) \
            if self.takes_images else None

    def encode_image(self, data: dict[str, torch.Tensor]) -> torch.Tensor:
        """[placeholders, hidden] for one image's pixel_values [1, 3, H, W]."""
        return self.project(data["pixel_values"]).flatten(0, 1)

    def project(self, pixels: torch.Tensor) -> torch.Tensor:
        """[crops, patches, hidden]: each crop's feature-layer states (CLS dropped unless "full"), projected."""
        assert self.vision_tower is not None and self.multi_modal_projector is not None  # the first stage's
        states = self.vision_tower(pixels)
        features = torch.cat([states[i] for i in self.layer_indices], dim=-1)
        features = features if self.keep_class_token else features[:, 1:]
        return self.multi_modal_projector(features)

    def targets(self, name: str) -> list[Target]:
        name = name.removeprefix("model.")  # transformers 5 nests every part under model.
        for part in ("vision_tower.", "multi_modal_projector."):
            if name.startswith(part):
                return self._vision_targets(name.replace("vision_model.", "", 1))
        if name.startswith("language_model."):
            name = name.removeprefix("language_model.")
            return super().targets(name if name.startswith(("model.", "lm_head.")) else "model." + name)
        return super().targets(name)

    def _vision_targets(self, name: str) -> list[Target]:
        """The tower's blocks up to the feature layer (the rest, and its final norm, are never run)."""
        if self.vision_tower is None or "post_layernorm" in name:
            return []
        if ".layers." in name and int(name.split(".layers.")[1].split(".")[0]) >= len(self.vision_tower.encoder.layers):
            return []
        return [Target(name)]
