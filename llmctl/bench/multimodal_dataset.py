"""vLLM's `random-mm` workload: random prompts (as `random`) with random-pixel images as JPEG data URLs, their
count around --random-mm-base-items-per-request and their sizes drawn from --random-mm-bucket-config
({(height, width, frames): probability}). Sent as chat image_url parts."""

from __future__ import annotations

import ast
import base64
import io
import json
import random
from typing import Any

from llmctl.errors import LlmctlError

DEFAULT_BUCKETS = "{(256, 256, 1): 0.5, (720, 1280, 1): 0.5, (720, 1280, 16): 0.0}"  # vLLM's default
DEFAULT_LIMIT = '{"image": 255, "video": 0}'


def parse_buckets(text: str) -> list[tuple[tuple[int, int], float]]:
    """((height, width), probability) of the image buckets; a video bucket (frames > 1) must have probability 0."""
    try:
        buckets = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise LlmctlError(f"--random-mm-bucket-config {text!r} is not a dict like {DEFAULT_BUCKETS}") from None
    if not isinstance(buckets, dict) or not buckets:
        raise LlmctlError(f"--random-mm-bucket-config must be a dict like {DEFAULT_BUCKETS}")
    images = []
    for key, probability in buckets.items():
        if not (isinstance(key, tuple) and len(key) == 3 and all(isinstance(v, int) and v > 0 for v in key)):
            raise LlmctlError(f"--random-mm-bucket-config: {key!r} is not (height, width, frames)")
        if not isinstance(probability, (int, float)) or probability < 0:
            raise LlmctlError(f"--random-mm-bucket-config: {key!r} has probability {probability!r}")
        if key[2] > 1 and probability > 0:
            raise LlmctlError(f"--random-mm-bucket-config: {key!r} is a video; llmctl's random-mm sends images only")
        if key[2] == 1 and probability > 0:
            images.append(((key[0], key[1]), float(probability)))
    if not images:
        raise LlmctlError("--random-mm-bucket-config gives no image bucket a probability above 0")
    return images


def image_limit(text: str) -> int:
    try:
        limits = json.loads(text)
    except json.JSONDecodeError:
        raise LlmctlError(f"--random-mm-limit-mm-per-prompt {text!r} is not JSON like {DEFAULT_LIMIT}") from None
    count = limits.get("image") if isinstance(limits, dict) else None
    if not isinstance(count, int) or count < 0:
        raise LlmctlError(f"--random-mm-limit-mm-per-prompt needs an image count, like {DEFAULT_LIMIT}")
    return count


def image_counts(base: int, ratio: float, limit: int, requests: int, rng: random.Random) -> list[int]:
    """vLLM's item count per request: uniform in [base·(1−r), base·(1+r)], capped by the limit."""
    if base < 0 or not 0 <= ratio <= 1:
        raise LlmctlError("--random-mm-base-items-per-request must be ≥ 0 and --random-mm-num-mm-items-range-ratio "
                          "in [0, 1]")
    low, high = int(base * (1 - ratio)), int(base * (1 + ratio) + 0.5)
    return [min(limit, rng.randint(low, high)) for _ in range(requests)]


def random_image_url(height: int, width: int, rng: random.Random) -> str:
    from PIL import Image

    pixels = rng.randbytes(height * width * 3)
    buffer = io.BytesIO()
    Image.frombytes("RGB", (width, height), pixels).save(buffer, format="JPEG")
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()


def random_images(counts: list[int], buckets: list[tuple[tuple[int, int], float]],
                  rng: random.Random) -> list[tuple[str, ...]]:
    sizes, weights = [size for size, _ in buckets], [weight for _, weight in buckets]
    return [tuple(random_image_url(*rng.choices(sizes, weights)[0], rng) for _ in range(count)) for count in counts]


def image_parts(text: str, images: tuple[str, ...]) -> list[dict[str, Any]]:
    """A chat message's content: the text, then each image as an image_url part (vLLM's order)."""
    return [{"type": "text", "text": text}, *({"type": "image_url", "image_url": {"url": url}} for url in images)]
