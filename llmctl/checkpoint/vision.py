"""What `inspect` says about a vision-language checkpoint's image side: the tower, its parameters (tower and
projector, from the safetensors headers) and how many prompt tokens an image becomes. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "vision_model.", "connector.", "visual.")


@dataclass(frozen=True)
class VisionTower:
    kind: str
    layers: int
    hidden_size: int
    params: int | None  # tower + projector, from the headers (None without them)
    tokens_per_image: int
    per: str  # the image size the token count holds for

    def describe(self) -> str:
        params = f", {self.params:,} parameters with its projector" if self.params else ""
        return (f"{self.kind}: {self.layers} layers, hidden {self.hidden_size}{params}; {self.tokens_per_image} "
                f"tokens per {self.per}")


def vision_tower(raw: dict[str, Any], tensors: dict[str, tuple[str, tuple[int, ...]]]) -> VisionTower | None:
    """The image tower of a LLaVA, Idefics3/SmolVLM or Qwen2-VL config.json; None for other models."""
    vision, model_type = raw.get("vision_config"), raw.get("model_type")
    if not isinstance(vision, dict) or model_type not in ("llava", "idefics3", "qwen2_vl"):
        return None
    params = sum(_numel(shape) for name, (_, shape) in tensors.items()
                 if name.removeprefix("model.").startswith(VISION_PREFIXES)) or None
    patch = int(vision.get("patch_size", 14))
    if model_type == "qwen2_vl":
        side = 448 // (patch * int(vision.get("spatial_merge_size", 2)))
        return VisionTower("Qwen2-VL ViT (2-D RoPE, 2×2 patch merger)", int(vision.get("depth", 32)),
                           int(vision.get("embed_dim", 1280)), params, side * side,
                           "448×448 image (dynamic resolution: tokens grow with the pixels)")
    size = int(vision.get("image_size", 336))
    patches = (size // patch) ** 2
    layers, hidden = int(vision.get("num_hidden_layers", 24)), int(vision.get("hidden_size", 1024))
    if model_type == "idefics3":
        scale = int(raw.get("scale_factor", 2))
        return VisionTower("SigLIP ViT with pixel shuffle (Idefics3)", layers, hidden, params,
                           patches // scale**2, f"{size}×{size} tile (images are split into tiles plus a global view)")
    full = raw.get("vision_feature_select_strategy", "default") == "full"
    return VisionTower("CLIP ViT (LLaVA)", layers, hidden, params, patches + int(full),
                       f"image (resized and cropped to {size}×{size})")


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count
