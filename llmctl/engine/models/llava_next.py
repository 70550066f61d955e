"""LLaVA-NeXT (LlavaNextForConditionalGeneration): LLaVA-1.5's tower and projector on a base view of the image
and on the tiles of its any-resolution grid (llmctl.engine.multimodal.anyres); the tiles' patches are laid out
as one picture, the rows and columns that are padding cut away, and each row ends with the learned
image_newline embedding, after the base view's patches."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.models.common import Shard, Target
from llmctl.engine.models.llava import LlavaForConditionalGeneration
from llmctl.engine.multimodal.anyres import tile_grid


def unpadded(features: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """features [hidden, rows, columns] of the resized, centered image: the rows or columns of padding removed
    (transformers' unpad_image)."""
    rows, columns = features.shape[1:]
    if width / height > columns / rows:
        kept = int(round(height * (columns / width), 7))
        pad = (rows - kept) // 2
        return features[:, pad:rows - pad, :]
    kept = int(round(width * (rows / height), 7))
    pad = (columns - kept) // 2
    return features[:, :, pad:columns - pad]


class LlavaNextForConditionalGeneration(LlavaForConditionalGeneration):
    def __init__(self, spec: ModelSpec, hf_config: Any, shard: Shard | None = None) -> None:
        super().__init__(spec, hf_config, shard)
        self.pinpoints = hf_config.image_grid_pinpoints
        self.tile = hf_config.vision_config.image_size
        self.side = self.tile // hf_config.vision_config.patch_size  # patches along a tile's edge
        hidden = hf_config.get_text_config().hidden_size
        self.image_newline = nn.Parameter(torch.zeros(hidden)) if self.takes_images else None

    def encode_image(self, data: dict[str, torch.Tensor]) -> torch.Tensor:
        """[placeholders, hidden] for one image: pixel_values [1, tiles, 3, S, S] (the base view first),
        image_sizes [1, 2] (its height and width before resizing)."""
        assert self.image_newline is not None  # the first stage's
        height, width = (int(v) for v in data["image_sizes"][0])
        features = self.project(data["pixel_values"][0])  # [tiles, patches, hidden]
        base, tiles = features[0], features[1:]
        rows, columns = tile_grid(height, width, self.pinpoints, self.tile)
        s = self.side
        picture = tiles.view(rows, columns, s, s, -1).permute(4, 0, 2, 1, 3).reshape(-1, rows * s, columns * s)
        picture = unpadded(picture, height, width)
        newline = self.image_newline[:, None, None].expand(-1, picture.shape[1], 1).to(picture.dtype)
        return torch.cat([base, torch.cat([picture, newline], dim=-1).flatten(1).t()])

    def targets(self, name: str) -> list[Target]:
        if name.removeprefix("model.") == "image_newline":
            return [Target("image_newline")] if self.takes_images else []
        return super().targets(name)
