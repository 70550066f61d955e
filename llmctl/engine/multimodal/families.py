"""How each vision-language family's processor output divides into images: the tensors one image's encoder
call takes, and how many placeholder tokens its embeddings fill."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

Split = Callable[[dict[str, torch.Tensor], int, Any], list[tuple[dict[str, torch.Tensor], int]]]


@dataclass(frozen=True)
class VisionFamily:
    image_token: str  # the placeholder the processor expands, as the tokenizer spells it
    split: Split  # (processor output, number of images, hf config) -> per image (tensors, placeholder count)


def _llava(outputs: dict[str, torch.Tensor], images: int, config: Any) -> list[tuple[dict[str, torch.Tensor], int]]:
    """LLaVA-1.5: one fixed-size crop per image, its patches (less CLS unless "full") as placeholders."""
    vision = config.vision_config
    per_image = (vision.image_size // vision.patch_size) ** 2
    per_image += 1 if getattr(config, "vision_feature_select_strategy", "default") == "full" else 0
    return [({"pixel_values": outputs["pixel_values"][i:i + 1]}, per_image) for i in range(images)]


def _idefics3(outputs: dict[str, torch.Tensor], images: int, config: Any) -> list[tuple[dict[str, torch.Tensor], int]]:
    """Idefics3 / SmolVLM: each image is tiles (and a global view) of the tower's size; each tile becomes
    image_seq_len tokens after the pixel shuffle. Padding tiles (all-zero pixel masks) are dropped."""
    pixels, masks = outputs["pixel_values"], outputs["pixel_attention_mask"]
    per_tile = (config.vision_config.image_size // config.vision_config.patch_size) ** 2 // config.scale_factor ** 2
    items = []
    for i in range(images):
        real = masks[i].flatten(1).any(dim=1)
        data = {"pixel_values": pixels[i][real], "pixel_attention_mask": masks[i][real]}
        items.append((data, int(real.sum()) * per_tile))
    return items


FAMILIES: dict[str, VisionFamily] = {
    "llava": VisionFamily("<image>", _llava),
    "idefics3": VisionFamily("<image>", _idefics3),
}


def vision_family(model_type: str) -> VisionFamily | None:
    return FAMILIES.get(model_type)
