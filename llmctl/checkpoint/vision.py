"""What `inspect` says about a vision-language checkpoint's image side: the tower, its parameters (tower and
projector, from the safetensors headers) and how many prompt tokens an image becomes. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

VISION_MODEL_TYPES = ("llava", "llava_next", "idefics3", "gemma3", "qwen2_vl", "qwen2_5_vl", "qwen3_vl")
QWEN_TOWERS = {"qwen2_vl": "Qwen2-VL ViT (2-D RoPE, 2×2 patch merger)",
               "qwen2_5_vl": "Qwen2.5-VL ViT (2-D RoPE, window attention, 2×2 patch merger)",
               "qwen3_vl": "Qwen3-VL ViT (2-D RoPE and learned positions, 2×2 patch merger, DeepStack features)"}
VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "vision_model.", "connector.", "visual.", "image_newline")


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
    """The image tower of a vision-language config.json (VISION_MODEL_TYPES); None for other models."""
    vision, model_type = raw.get("vision_config"), raw.get("model_type")
    if not isinstance(vision, dict) or model_type not in VISION_MODEL_TYPES:
        return None
    params = sum(_numel(shape) for name, (_, shape) in tensors.items()
                 if name.removeprefix("model.").startswith(VISION_PREFIXES)) or None
    patch = int(vision.get("patch_size", 14))
    if model_type in QWEN_TOWERS:
        side = 448 // (patch * int(vision.get("spatial_merge_size", 2)))
        width = vision.get("embed_dim", 1280) if model_type == "qwen2_vl" else vision.get("hidden_size", 1280)
        return VisionTower(QWEN_TOWERS[model_type], int(vision.get("depth", 32)), int(width), params, side * side,
                           "448×448 image (dynamic resolution: tokens grow with the pixels)")
    size = int(vision.get("image_size", 336))
    patches = (size // patch) ** 2
    layers, hidden = int(vision.get("num_hidden_layers", 24)), int(vision.get("hidden_size", 1024))
    if model_type == "gemma3":
        return VisionTower("SigLIP ViT (Gemma 3: patches average-pooled, then projected)", layers, hidden, params,
                           int(raw.get("mm_tokens_per_image", 256)), f"image (resized to {size}×{size}; pan-and-scan off)")
    if model_type == "idefics3":
        scale = int(raw.get("scale_factor", 2))
        return VisionTower("SigLIP ViT with pixel shuffle (Idefics3)", layers, hidden, params,
                           patches // scale**2, f"{size}×{size} tile (images are split into tiles plus a global view)")
    full = raw.get("vision_feature_select_strategy", "default") == "full"
    if model_type == "llava_next":
        height, width = max(raw.get("image_grid_pinpoints") or [[size, size]], key=lambda pin: pin[0] * pin[1])
        rows, columns = height // patch, width // patch  # an image of this size fills its tiles, no padding
        return VisionTower("CLIP ViT (LLaVA-NeXT: a base view and any-res tiles)", layers, hidden, params,
                           patches + int(full) + rows * (columns + 1),
                           f"{height}×{width} image (tokens grow with the image up to its largest tile grid)")
    return VisionTower("CLIP ViT (LLaVA)", layers, hidden, params, patches + int(full),
                       f"image (resized and cropped to {size}×{size})")


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _vit_layer(hidden: int, intermediate: int) -> int:
    """One pre-norm ViT block: q, k, v, out with biases; fc1, fc2 with biases; two LayerNorms."""
    return 4 * hidden * hidden + 4 * hidden + 2 * hidden * intermediate + intermediate + hidden + 4 * hidden


@dataclass(frozen=True)
class VisionParams:
    in_checkpoint: int  # the tower and projector as published
    held: int  # what llmctl loads (LLaVA never runs its tower's last blocks and final norm)


def vision_params(raw: dict[str, Any]) -> VisionParams | None:
    """The image side's parameters of a vision-language config.json (VISION_MODEL_TYPES); None for others."""
    vision, model_type = raw.get("vision_config"), raw.get("model_type")
    if not isinstance(vision, dict) or model_type not in VISION_MODEL_TYPES:
        return None
    held = held_vision_params(raw, vision, model_type)
    if model_type not in ("llava", "llava_next"):
        return VisionParams(held, held)
    width, layers = int(vision.get("hidden_size", 1024)), int(vision.get("num_hidden_layers", 24))
    unused = (layers - _llava_layers_used(raw, layers)) * _vit_layer(width, int(vision.get("intermediate_size", 4096)))
    return VisionParams(held + unused + 2 * width, held)  # and the final LayerNorm


def held_vision_params(raw: dict[str, Any], vision: dict[str, Any], model_type: str) -> int:
    """Tower and projector parameters as llmctl holds them."""
    text = raw.get("text_config") or {}
    out = int(text.get("hidden_size") or raw.get("hidden_size") or vision.get("hidden_size", 0))
    channels, patch = int(vision.get("num_channels", vision.get("in_channels", 3))), int(vision.get("patch_size", 14))
    if model_type == "qwen2_vl":
        width, depth = int(vision.get("embed_dim", 1280)), int(vision.get("depth", 32))
        merged = width * int(vision.get("spatial_merge_size", 2)) ** 2
        embed = channels * int(vision.get("temporal_patch_size", 2)) * patch * patch * width
        merger = 2 * width + merged * merged + merged + merged * out + out
        return embed + depth * _vit_layer(width, int(width * vision.get("mlp_ratio", 4))) + merger
    if model_type == "qwen2_5_vl":
        return _qwen2_5_vl_params(vision, channels, patch)
    if model_type == "qwen3_vl":
        return _qwen3_vl_params(vision, channels, patch)
    width, inner = int(vision.get("hidden_size", 1024)), int(vision.get("intermediate_size", 4096))
    patches = (int(vision.get("image_size", 224)) // patch) ** 2
    if model_type in ("idefics3", "gemma3"):  # SigLIP: patches with a bias, learned positions, a final norm
        embed = channels * patch * patch * width + width + patches * width
        tower = embed + int(vision.get("num_hidden_layers", 12)) * _vit_layer(width, inner) + 2 * width
        if model_type == "gemma3":
            return tower + width * out + width  # the projection and its norm
        return tower + width * int(raw.get("scale_factor", 2)) ** 2 * out
    layers_used = _llava_layers_used(raw, int(vision.get("num_hidden_layers", 24)))
    embed = width + channels * patch * patch * width + (patches + 1) * width + 2 * width  # class, patches, pre-norm
    features = 1 if isinstance(raw.get("vision_feature_layer", -2), int) else len(raw["vision_feature_layer"])
    bias = 1 if raw.get("multimodal_projector_bias", True) else 0
    projector = width * features * out + out * out + 2 * bias * out
    newline = out if model_type == "llava_next" else 0  # the learned row-end embedding
    return embed + layers_used * _vit_layer(width, inner) + projector + newline


def _qwen2_5_vl_params(vision: dict[str, Any], channels: int, patch: int) -> int:
    """Qwen2.5-VL's tower: RMSNorms (weights only), attention and a gated MLP with biases, an RMSNorm merger."""
    width, inner, depth = int(vision.get("hidden_size", 1280)), int(vision.get("intermediate_size", 3420)), \
        int(vision.get("depth", 32))
    merged, out = width * int(vision.get("spatial_merge_size", 2)) ** 2, int(vision.get("out_hidden_size", 3584))
    embed = channels * int(vision.get("temporal_patch_size", 2)) * patch * patch * width
    block = 2 * width + 4 * width * width + 4 * width + 3 * width * inner + 2 * inner + width
    return embed + depth * block + width + merged * merged + merged + merged * out + out


def _qwen3_vl_params(vision: dict[str, Any], channels: int, patch: int) -> int:
    """Qwen3-VL's tower: patches with a bias, learned positions, ViT blocks, a merger and one per DeepStack layer."""
    width, inner = int(vision.get("hidden_size", 1152)), int(vision.get("intermediate_size", 4304))
    merged, out = width * int(vision.get("spatial_merge_size", 2)) ** 2, int(vision.get("out_hidden_size", 3584))
    embed = channels * int(vision.get("temporal_patch_size", 2)) * patch * patch * width + width
    positions = int(vision.get("num_position_embeddings", 2304)) * width
    merger = merged * merged + merged + merged * out + out
    deepstack = len(vision.get("deepstack_visual_indexes", [8, 16, 24])) * (2 * merged + merger)
    return embed + positions + int(vision.get("depth", 27)) * _vit_layer(width, inner) + 2 * width + merger + deepstack


def _llava_layers_used(raw: dict[str, Any], layers: int) -> int:
    """The blocks up to LLaVA's deepest feature layer (hidden state i is the output of block i)."""
    chosen = raw.get("vision_feature_layer", -2)
    return max(index % (layers + 1) for index in ([chosen] if isinstance(chosen, int) else chosen))
