"""Gemma 3's multimodal checkpoints (Gemma3ForConditionalGeneration, 4B and up): a SigLIP tower on one
896 px view of each image (pan-and-scan off, vLLM's default), its patches average-pooled to
mm_tokens_per_image tokens, RMS-normed and projected into the Gemma 3 language model — whose attention lets
an image's tokens see each other in both directions (llmctl.engine.layers: AttentionMetadata.both_ways_spans).
With images off (--limit-mm-per-prompt '{"image": 0}') it is the text model alone."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from llmctl.engine.models.common import Target
from llmctl.engine.models.gemma import GemmaForCausalLM
from llmctl.engine.models.idefics3 import SiglipVisionModel


class UnitOffsetRMSNorm(nn.Module):
    """Gemma's RMSNorm: normalized in float32, scaled by (1 + weight)."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)


class Gemma3Projector(nn.Module):
    """transformers' Gemma3MultiModalProjector: pool the patch grid to tokens_per_side², norm (1 + w), project."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        vision = config.vision_config
        self.side = vision.image_size // vision.patch_size
        self.kernel = self.side // int(config.mm_tokens_per_image ** 0.5)
        self.mm_input_projection_weight = nn.Parameter(torch.zeros(vision.hidden_size,
                                                                   config.get_text_config().hidden_size))
        self.mm_soft_emb_norm = UnitOffsetRMSNorm(vision.hidden_size, vision.layer_norm_eps)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """patches [images, side², width] -> [images, tokens, text hidden]."""
        images, _, width = patches.shape
        grid = patches.transpose(1, 2).reshape(images, width, self.side, self.side)
        pooled = F.avg_pool2d(grid, self.kernel, self.kernel).flatten(2).transpose(1, 2)
        return torch.matmul(self.mm_soft_emb_norm(pooled), self.mm_input_projection_weight).type_as(patches)


class Gemma3ForConditionalGeneration(GemmaForCausalLM):
    supports_lora = False  # adapters name the language model's layers under prefixes not mapped yet

    def __init__(self, spec: Any, hf_config: Any, shard: Any = None) -> None:
        super().__init__(spec, hf_config, shard)
        self.supports_lora = False
        self.takes_images = self.shard.is_first and hasattr(hf_config, "vision_config") \
            and not getattr(hf_config, "llmctl_text_only", False)
        self.vision_tower = SiglipVisionModel(hf_config.vision_config) if self.takes_images else None
        self.multi_modal_projector = Gemma3Projector(hf_config) if self.takes_images else None

    def encode_image(self, data: dict[str, torch.Tensor]) -> torch.Tensor:
        """[mm_tokens_per_image, hidden] for one image's pixel_values [1, 3, S, S]."""
        assert self.vision_tower is not None and self.multi_modal_projector is not None  # the first stage's
        pixels = data["pixel_values"]
        mask = torch.ones(pixels.shape[0], *pixels.shape[2:], dtype=torch.bool, device=pixels.device)
        return self.multi_modal_projector(self.vision_tower(pixels, mask)).flatten(0, 1)

    def targets(self, name: str) -> list[Target]:
        bare = name.removeprefix("model.")
        if bare.startswith(("vision_tower.", "multi_modal_projector.")):
            bare = bare.replace("vision_model.", "", 1)
            unused = bare.startswith("vision_tower.head.")  # SigLIP's pooling head, where a config keeps it
            return [Target(bare)] if self.takes_images and not unused else []
        return super().targets(name)
