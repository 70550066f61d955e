"""Qwen2-VL's processor for images alone. transformers' Qwen2VLProcessor also builds a video processor, which
needs torchvision; where torchvision is missing it cannot be built at all. This does what its __call__ does
for images: the model's own image processor (transformers', PIL backend) makes the patches and their grids,
and each `<|image_pad|>` of the text becomes grid.prod() / merge² copies before tokenizing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PAD = "<|image_pad|>"
SLOT = "\\x00image\\x00"  # stands for one expanded placeholder while the text is rewritten


class ImagePadProcessor:
    def __init__(self, folder: Path) -> None:
        from transformers import AutoImageProcessor, AutoTokenizer

        self.image_processor = AutoImageProcessor.from_pretrained(str(folder))
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder))
        self.merge = int(self.image_processor.merge_size)

    def __call__(self, text: str, images: list[Any] | None = None, return_tensors: str = "pt",
                 **kwargs: Any) -> dict[str, Any]:
        outputs: dict[str, Any] = {}
        if images:
            outputs = dict(self.image_processor(images=images, return_tensors=return_tensors, **kwargs))
            counts = (outputs["image_grid_thw"].prod(-1) // self.merge**2).tolist()
            if text.count(PAD) != len(counts):
                raise ValueError(f"the text has {text.count(PAD)} {PAD} for {len(counts)} images")
            pieces = text.split(PAD)
            text = pieces[0] + "".join(SLOT * count + piece for count, piece in zip(counts, pieces[1:]))
            text = text.replace(SLOT, PAD)
        outputs["input_ids"] = self.tokenizer(text, return_tensors=return_tensors)["input_ids"]
        return outputs
