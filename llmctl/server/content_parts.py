"""A chat message's content: a string, or OpenAI's list of parts. Text parts are joined as before; with image
parts the content stays a list in transformers' form ({"type": "image"} beside {"type": "text"}), which
vision-language chat templates render as their image placeholders, and each image's URL is kept, in order."""

from __future__ import annotations

from typing import Any

from llmctl.engine.errors import InvalidRequestError

JSON = Any
Message = dict[str, Any]  # a chat message as the chat template takes it (content: text, or transformers' parts)
IMAGE_PARTS = ("image_url", "input_image")  # chat's, and /v1/responses' name for the same thing
OTHER_MEDIA = ("input_audio", "audio_url", "video_url", "file", "input_file", "image_embeds")


def bad(message: str) -> InvalidRequestError:
    return InvalidRequestError(message, "messages")


def message_content(content: JSON, where: str) -> str | list[dict[str, Any]]:
    """A string (text only, parts joined by newlines), or transformers' part list when there are images."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(f"{where}.content must be a string or a list of parts (text, image_url)")
    parts = [_part(part, f"{where}.content[{index}]") for index, part in enumerate(content)]
    if not any(part["type"] == "image" for part in parts):
        return "\n".join(part["text"] for part in parts)
    return parts


def _part(part: JSON, where: str) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
    if kind in ("text", "input_text") and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    if kind in IMAGE_PARTS:
        return {"type": "image", "url": _image_url(part, kind, where)}
    if kind in OTHER_MEDIA:
        raise bad(f"{where}: {kind} parts are not supported; this server takes text and image_url parts")
    raise bad(f"{where}: a content part is {{\"type\": \"text\", \"text\": …}} or {{\"type\": \"image_url\", "
              f"\"image_url\": {{\"url\": …}}}}, got type {kind!r}")


def _image_url(part: dict[str, JSON], kind: str, where: str) -> str:
    value = part.get(kind)  # {"image_url": {"url": …}} (chat) or {"image_url": "…"} (vLLM and /v1/responses)
    if value is None and kind == "input_image":
        value = part.get("image_url")
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str) or not url:
        raise bad(f"{where}: an {kind} part needs its URL, as {{\"type\": \"image_url\", \"image_url\": "
                  "{\"url\": \"https://… or data:image/png;base64,…\"}}")
    return url


def image_urls(messages: list[Message]) -> list[tuple[str, str]]:
    """(where, url) of every image part, in the order the chat template places them."""
    found = []
    for index, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, list):
            found += [(f"messages[{index}].content[{at}]", part["url"])
                      for at, part in enumerate(content) if part.get("type") == "image"]
    return found
