"""The model's own transformers processor turns a prompt with images into token ids (each image's
placeholder expanded) and pixel tensors; this splits them into items with their positions and hashes."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from llmctl.engine.errors import InvalidRequestError
from llmctl.engine.multimodal.config import MultimodalLimits
from llmctl.engine.multimodal.families import VisionFamily, vision_family
from llmctl.engine.multimodal.image_pad_processor import PAD, ImagePadProcessor
from llmctl.engine.multimodal.items import MultimodalItem, ProcessedPrompt, content_hash

logger = logging.getLogger("llmctl.engine")


class MultimodalProcessor:
    def __init__(self, folder: Path, hf_config: Any, family: VisionFamily, limits: MultimodalLimits) -> None:
        self.processor = _load_processor(folder, family)
        self.hf_config = hf_config
        self.family = family
        self.limits = limits
        tokenizer = self.processor.tokenizer  # type: ignore[union-attr]
        self.image_token_id = int(tokenizer.convert_tokens_to_ids(family.image_token))
        self.image_end_id = int(tokenizer.convert_tokens_to_ids(family.image_end)) if family.image_end else None

    def process(self, text: str, images: list[Any], kwargs: dict[str, Any] | None = None) -> ProcessedPrompt:
        """Text holding one image placeholder per image (as the chat template renders them), and the images."""
        self.check_count(len(images))
        merged = {**self.limits.processor_kwargs, **(kwargs or {})}
        if merged.get("do_pan_and_scan"):  # Gemma 3's crops: each a view of its own, not one image's tokens
            raise InvalidRequestError("do_pan_and_scan is not supported: llmctl encodes one view per image; "
                                      "leave it off (its default)", "mm_processor_kwargs")
        try:
            outputs = self.processor(text=text, images=images or None, return_tensors="pt", **merged)
        except (ValueError, TypeError) as exc:
            raise InvalidRequestError(f"the model's processor refused the prompt and its images: {exc}",
                                      "multi_modal_data") from None
        ids = outputs["input_ids"][0].tolist()
        items = self._items(ids, dict(outputs), len(images))
        mrope = self.family.positions(len(ids), [(item.positions, item.data) for item in items], self.hf_config) \
            if self.family.positions is not None else None
        return ProcessedPrompt(text, ids, items, mrope)

    def check_count(self, count: int) -> None:
        allowed = self.limits.images_allowed()
        if allowed is not None and count > allowed:
            raise InvalidRequestError(f"the prompt has {count} images; this server takes at most {allowed} per prompt "
                                      "(--limit-mm-per-prompt)", "messages")

    def _items(self, ids: list[int], outputs: dict[str, Any], images: int) -> list[MultimodalItem]:
        placeholders = [position for position, token in enumerate(ids) if token == self.image_token_id]
        counts = self._counts(ids) if self.family.per_image is None else \
            [self.family.per_image(self.hf_config)] * (len(placeholders) // self.family.per_image(self.hf_config))
        if len(counts) != images or sum(counts) != len(placeholders):
            raise InvalidRequestError(f"the prompt's text has {len(counts)} image placeholders for {images} images: "
                                      f"put one {self.family.placeholder} in the text per image, as the chat "
                                      "template does", "prompt")
        parts = self.family.split(outputs, counts, self.hf_config) if images else []
        items, start = [], 0
        for data, count in parts:
            items.append(MultimodalItem("image", content_hash("image", data), data, placeholders[start:start + count],
                                        self.family.both_ways))
            start += count
        return items

    def _counts(self, ids: list[int]) -> list[int]:
        """Each image's number of placeholder tokens: its runs of them (one, or up to the image-end token's)."""
        runs: list[tuple[int, int]] = []  # (start, length)
        for position, token in enumerate(ids):
            if token == self.image_token_id:
                if runs and runs[-1][0] + runs[-1][1] == position:
                    runs[-1] = (runs[-1][0], runs[-1][1] + 1)
                else:
                    runs.append((position, 1))
        if self.image_end_id is None:
            return [length for _, length in runs]
        ends = [position for position, token in enumerate(ids) if token == self.image_end_id]
        counts, taken = [], 0
        for end in ends:  # the image ends with the first run after its end marker
            last = next((i for i, (start, _) in enumerate(runs) if start > end), None)
            if last is None or last < taken:
                break
            counts.append(sum(length for _, length in runs[taken:last + 1]))
            taken = last + 1
        return counts if taken == len(runs) else counts + [sum(length for _, length in runs[taken:])]


def _load_processor(folder: Path, family: VisionFamily) -> Any:
    """The model's transformers processor; Qwen2-VL's own images-only one where transformers' cannot be built
    (its video processor needs torchvision)."""
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(str(folder))
    except (AttributeError, ImportError, OSError, ValueError, TypeError) as exc:
        if family.image_token != PAD:
            raise
        logger.info("transformers' processor for this model cannot be built here (%s: %s): llmctl expands its "
                    "image placeholders itself", type(exc).__name__, str(exc).strip().splitlines()[0])
        return ImagePadProcessor(folder)


def serves_images(folder: Path, model_type: str, limits: MultimodalLimits) -> bool:
    """Whether a vision-language checkpoint's images are served: not with --limit-mm-per-prompt '{"image": 0}',
    nor without the image processor its images need (then it is served text-only, its tower left on disk)."""
    if vision_family(model_type) is None or limits.text_only:
        return False
    if not has_image_processor(folder):
        logger.warning("%s has no preprocessor_config.json: its images cannot be processed, it is served text-only",
                       folder)
        return False
    return True


def has_image_processor(folder: Path) -> bool:
    return any((folder / name).exists() for name in ("preprocessor_config.json", "processor_config.json"))


def multimodal_processor(folder: Path, model_type: str, limits: MultimodalLimits,
                         hf_config: Any = None) -> MultimodalProcessor | None:
    """The processor of a vision-language model whose images are served; None for a text model, with
    --limit-mm-per-prompt '{"image": 0}', or for a checkpoint without an image processor (the loader warns)."""
    family = vision_family(model_type)
    if family is None or limits.text_only or not has_image_processor(folder):
        return None
    if hf_config is None:
        from transformers import AutoConfig

        hf_config = AutoConfig.from_pretrained(str(folder))
    return MultimodalProcessor(folder, hf_config, family, limits)
