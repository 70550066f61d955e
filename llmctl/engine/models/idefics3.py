"""Idefics3 and SmolVLM (Idefics3ForConditionalGeneration): each image is cut by the processor into tiles of
the tower's size plus a downscaled global view; a SigLIP tower (positions bucketed to each tile's real extent,
padding patches masked) encodes every tile, a pixel shuffle folds scale_factor² neighbouring patches into one
token, one linear layer projects it, and a Llama-family language model takes the tokens at its `<image>`
placeholders."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.models.common import Shard, Target
from llmctl.engine.models.vision_encoder import VisionEncoder
from llmctl.engine.models.vision_language import VisionLanguageModel


class SiglipTileEmbeddings(nn.Module):
    """Patches of a tile, with the position of each patch scaled to the tile's unpadded extent (NaViT-style)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.patch_size = config.patch_size
        self.side = config.image_size // config.patch_size
        self.patch_embedding = nn.Conv2d(config.num_channels, config.hidden_size, self.patch_size, self.patch_size)
        self.position_embedding = nn.Embedding(self.side**2, config.hidden_size)

    def forward(self, pixels: torch.Tensor, patch_mask: torch.Tensor) -> torch.Tensor:
        patches = self.patch_embedding(pixels.to(self.patch_embedding.weight.dtype)).flatten(2).transpose(1, 2)
        return patches + self.position_embedding(self.position_ids(patch_mask))

    def position_ids(self, patch_mask: torch.Tensor) -> torch.Tensor:
        """[tiles, patches]: transformers' bucketing of fractional coordinates (0 for padding patches)."""
        boundaries = torch.arange(1 / self.side, 1.0, 1 / self.side, device=patch_mask.device)
        rows, cols = patch_mask[:, :, 0].sum(dim=1), patch_mask[:, 0, :].sum(dim=1)
        height = torch.arange(patch_mask.shape[1], device=patch_mask.device, dtype=torch.float32)
        width = torch.arange(patch_mask.shape[2], device=patch_mask.device, dtype=torch.float32)
        y = torch.bucketize((height[None] * (1.0 / rows)[:, None]).clamp(max=1 - 1e-6), boundaries, right=True)
        x = torch.bucketize((width[None] * (1.0 / cols)[:, None]).clamp(max=1 - 1e-6), boundaries, right=True)
        ids = (y[:, :, None] * self.side + x[:, None, :]).flatten(1)
        return torch.where(patch_mask.flatten(1), ids, torch.zeros_like(ids))


class SiglipVisionModel(nn.Module):
    """SigLIP's tower (`vision_model.*` without its pooling head): Idefics3's tiles, and Gemma 3's one view
    of an image (every patch real: positions 0..side²-1)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.embeddings = SiglipTileEmbeddings(config)
        self.encoder = VisionEncoder(config, config.num_hidden_layers)
        self.post_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, pixels: torch.Tensor, pixel_mask: torch.Tensor) -> torch.Tensor:
        size = self.embeddings.patch_size
        patch_mask = pixel_mask.unfold(1, size, size).unfold(2, size, size).sum(dim=(-1, -2)) > 0
        x = self.embeddings(pixels, patch_mask)
        keys = patch_mask.flatten(1)
        mask = None if bool(keys.all()) else keys[:, None, None, :]  # padding patches are never attended to
        return self.post_layernorm(self.encoder(x, mask)[-1])


class ModalityProjection(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, hidden, bias=False)


class Idefics3Connector(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.scale = config.scale_factor
        width = config.vision_config.hidden_size * self.scale**2
        self.modality_projection = ModalityProjection(width, config.text_config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """transformers' pixel shuffle: each scale × scale block of patches becomes one wider token."""
        tiles, patches, width = x.shape
        side, s = int(patches**0.5), self.scale
        x = x.view(tiles, side, side // s, width * s).permute(0, 2, 1, 3)
        x = x.reshape(tiles, side // s, side // s, width * s * s).permute(0, 2, 1, 3)
        return self.modality_projection.proj(x.reshape(tiles, patches // (s * s), width * s * s))


class Idefics3ForConditionalGeneration(VisionLanguageModel):
    def __init__(self, spec: ModelSpec, hf_config: Any, shard: Shard | None = None) -> None:
        super().__init__(spec, hf_config, shard)
        self.vision_model = SiglipVisionModel(hf_config.vision_config) if self.takes_images else None
        self.connector = Idefics3Connector(hf_config) if self.takes_images else None

    def encode_image(self, data: dict[str, torch.Tensor]) -> torch.Tensor:
        """[placeholders, hidden] for one image's tiles (pixel_values [tiles, 3, S, S] and their pixel masks)."""
        assert self.vision_model is not None and self.connector is not None  # the first stage's
        features = self.vision_model(data["pixel_values"], data["pixel_attention_mask"].bool())
        return self.connector(features).flatten(0, 1)

    def targets(self, name: str) -> list[Target]:
        name = name.removeprefix("model.")
        if name.startswith(("vision_model.", "connector.")):
            return [Target(name)] if self.takes_images else []
        if name.startswith("text_model."):
            return super().targets("model." + name.removeprefix("text_model."))
        return super().targets(name)
