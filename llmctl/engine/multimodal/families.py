"""How each vision-language family's processor output divides into images: the tensors one image's encoder
call takes, and how many placeholder tokens its embeddings fill."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from llmctl.engine.multimodal.anyres import tile_count
from llmctl.engine.multimodal.mrope import MRopePositions, mrope_positions

Split = Callable[[dict[str, torch.Tensor], list[int], Any], list[tuple[dict[str, torch.Tensor], int]]]


@dataclass(frozen=True)
class VisionFamily:
    image_token: str  # the placeholder the processor expands, as the tokenizer spells it
    split: Split  # (processor output, each image's placeholder count, hf config) -> per image (tensors, count)
    image_end: str | None = None  # an image's last run of placeholders follows this token (None: one run each)
    per_image: Callable[[Any], int] | None = None  # a fixed placeholder count per image (adjacent images' runs touch)
    # M-RoPE families: (prompt length, each image's (positions, tensors), hf config) -> every token's 3 positions
    positions: Callable[[int, list[tuple[list[int], dict[str, torch.Tensor]]], Any], MRopePositions] | None = None
    both_ways: bool = False  # an image's tokens attend to each other in both directions (Gemma 3)
    prompt_token: str | None = None  # what the prompt text holds per image, where the processor expands another

    @property
    def placeholder(self) -> str:
        return self.prompt_token or self.image_token


Items = list[tuple[dict[str, torch.Tensor], int]]


def _llava_tokens(config: Any) -> int:
    """LLaVA-1.5's placeholders per image: the tower's patches, and its class token under "full"."""
    vision = config.vision_config
    extra = 1 if getattr(config, "vision_feature_select_strategy", "default") == "full" else 0
    return (vision.image_size // vision.patch_size) ** 2 + extra


def _llava(outputs: dict[str, torch.Tensor], counts: list[int], config: Any) -> Items:
    """LLaVA-1.5: one fixed-size crop per image, one run of placeholders (its patches, less CLS unless "full")."""
    return [({"pixel_values": outputs["pixel_values"][i:i + 1]}, count) for i, count in enumerate(counts)]


def _llava_next(outputs: dict[str, torch.Tensor], counts: list[int], config: Any) -> Items:
    """LLaVA-NeXT: a base view and the tiles of the image's any-res grid, the processor's pixel_values padded
    to the most tiles of any image in the batch; image_sizes says each image's own."""
    items = []
    for index, count in enumerate(counts):
        height, width = (int(v) for v in outputs["image_sizes"][index])
        tiles = tile_count(height, width, config.image_grid_pinpoints, config.vision_config.image_size)
        items.append(({"pixel_values": outputs["pixel_values"][index:index + 1, :tiles],
                       "image_sizes": outputs["image_sizes"][index:index + 1]}, count))
    return items


def _idefics3(outputs: dict[str, torch.Tensor], counts: list[int], config: Any) -> Items:
    """Idefics3 / SmolVLM: an image is tiles of the tower's size, then a global view, each one run of
    image_seq_len placeholders; the prompt's tiles come in image order along the processor's second axis."""
    per_tile = (config.vision_config.image_size // config.vision_config.patch_size) ** 2 // config.scale_factor ** 2
    pixels, masks = outputs["pixel_values"][0], outputs["pixel_attention_mask"][0]
    items, start = [], 0
    for count in counts:
        tiles = count // per_tile
        items.append(({"pixel_values": pixels[start:start + tiles],
                       "pixel_attention_mask": masks[start:start + tiles]}, count))
        start += tiles
    return items


def _qwen2_vl(outputs: dict[str, torch.Tensor], counts: list[int], config: Any) -> Items:
    """Qwen2-VL: an image at its own resolution is a (t, h, w) grid of patches, the processor's rows of
    pixel_values in image order; merge² patches become one placeholder."""
    grids, items, start = outputs["image_grid_thw"], [], 0
    for index, count in enumerate(counts):
        patches = int(grids[index].prod())
        items.append(({"pixel_values": outputs["pixel_values"][start:start + patches],
                       "image_grid_thw": grids[index:index + 1]}, count))
        start += patches
    return items


def _qwen2_vl_positions(num_tokens: int, images: list[tuple[list[int], dict[str, torch.Tensor]]],
                        config: Any) -> MRopePositions:
    grids = [(positions, tuple(int(v) for v in data["image_grid_thw"][0])) for positions, data in images]
    return mrope_positions(num_tokens, grids, config.vision_config.spatial_merge_size)  # type: ignore[arg-type]


FAMILIES: dict[str, VisionFamily] = {
    "llava": VisionFamily("<image>", _llava, per_image=_llava_tokens),
    "llava_next": VisionFamily("<image>", _llava_next),  # images of different sizes: runs of their own lengths
    "idefics3": VisionFamily("<image>", _idefics3, image_end="<global-img>"),  # the global view comes last
    "gemma3": VisionFamily("<image_soft_token>", _llava, per_image=lambda config: config.mm_tokens_per_image,
                           both_ways=True, prompt_token="<start_of_image>"),  # one view per image
    "qwen2_vl": VisionFamily("<|image_pad|>", _qwen2_vl, positions=_qwen2_vl_positions),
}
FAMILIES["qwen2_5_vl"] = FAMILIES["qwen3_vl"] = FAMILIES["qwen2_vl"]  # the same processor, positions for images


def vision_family(model_type: str) -> VisionFamily | None:
    return FAMILIES.get(model_type)
