"""A chat prompt with images: its image parts fetched and decoded, then the rendered text and the images
through the model's processor — on a worker thread, never on the event loop."""

from __future__ import annotations

import asyncio

from llmctl.engine.multimodal.items import ProcessedPrompt
from llmctl.server.content_parts import Message, image_urls
from llmctl.server.media import load_image
from llmctl.server.protocol import bad
from llmctl.server.state import ServerState


def check_images(state: ServerState, messages: list[Message]) -> None:
    """Before the chat template sees image parts: this server takes them, and not too many."""
    urls = image_urls(messages)
    if not urls:
        return
    if state.multimodal is None:
        why = "this model takes no images" if state.settings.engine_config.multimodal.images_allowed() != 0 else \
            "this server takes no images (--limit-mm-per-prompt '{\"image\": 0}')"
        raise bad(f"{urls[0][0]}: {why}; send text parts only", "messages")
    state.multimodal.check_count(len(urls))


async def with_images(state: ServerState, text: str, messages: list[Message]) -> ProcessedPrompt | None:
    """The processed prompt of a chat whose messages hold images (check_images passed); None when they hold none."""
    urls = image_urls(messages)
    processor = state.multimodal
    if not urls or processor is None:
        return None

    def process() -> ProcessedPrompt:
        images = [load_image(url, where, state.settings.media) for where, url in urls]
        return processor.process(text, images)

    return await asyncio.to_thread(process)
