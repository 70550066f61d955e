"""vLLM's multimodal settings: --limit-mm-per-prompt (most images per prompt; 0 serves a vision-language
checkpoint text-only, its tower not loaded) and --mm-processor-kwargs (passed to the model's processor)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from llmctl.errors import LlmctlError

MODALITIES = ("image",)


@dataclass(frozen=True)
class MultimodalLimits:
    per_prompt: dict[str, int] = field(default_factory=dict)  # modality -> most items in one prompt
    processor_kwargs: dict[str, Any] = field(default_factory=dict)

    def images_allowed(self) -> int | None:
        return self.per_prompt.get("image")

    @property
    def text_only(self) -> bool:
        return self.per_prompt.get("image") == 0


def _json_object(value: str | dict | None, flag: str, example: str) -> dict[str, Any]:
    try:
        fields = json.loads(value) if isinstance(value, str) else dict(value or {})
    except json.JSONDecodeError as exc:
        raise LlmctlError(f"{flag} is not JSON ({exc}); e.g. {example}") from None
    if not isinstance(fields, dict):
        raise LlmctlError(f"{flag} must be a JSON object, e.g. {example}")
    return fields


def parse_multimodal_limits(limit_mm_per_prompt: str | dict | None,
                            mm_processor_kwargs: str | dict | None) -> MultimodalLimits:
    limits = _json_object(limit_mm_per_prompt, "--limit-mm-per-prompt", "'{\"image\": 2}'")
    for modality, count in limits.items():
        if modality not in MODALITIES:
            raise LlmctlError(f"--limit-mm-per-prompt: {modality!r} is not a modality llmctl serves "
                              f"({', '.join(MODALITIES)})")
        if isinstance(count, dict):  # vLLM's newer form {"image": {"count": N, ...}}
            count = count.get("count")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise LlmctlError(f"--limit-mm-per-prompt: {modality} must be a count ≥ 0, got {count!r}")
        limits[modality] = count
    kwargs = _json_object(mm_processor_kwargs, "--mm-processor-kwargs", "'{\"max_pixels\": 401408}'")
    return MultimodalLimits(limits, kwargs)
