"""A chat prompt with images: its image parts fetched and decoded, then the rendered text and the images
through the model's processor — on a worker thread, never on the event loop."""

from __future__ import annotations

import asyncio

from llmctl.engine.multimodal.items import ProcessedPrompt
from llmctl.server.content_parts import JSON, Message, image_urls
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


async def with_images(state: ServerState, text: str, messages: list[Message],
                      processor_kwargs: dict[str, JSON] | None = None) -> ProcessedPrompt | None:
    """The processed prompt of a chat whose messages hold images (check_images passed); None when they hold none.
    `processor_kwargs`: the request's mm_processor_kwargs, over the server's --mm-processor-kwargs."""
    urls = image_urls(messages)
    processor = state.multimodal
    if not urls or processor is None:
        return None
    if processor_kwargs is not None and not isinstance(processor_kwargs, dict):
        raise bad("mm_processor_kwargs must be an object, e.g. {\"max_pixels\": 200704}", "mm_processor_kwargs")

    def process() -> ProcessedPrompt:
        images = [load_image(url, where, state.settings.media) for where, url in urls]
        return processor.process(text, images, processor_kwargs)

    return await asyncio.to_thread(process)
