"""Images named by a request: `data:` URLs, http(s) URLs (fetched with a size limit and a timeout, from
--allowed-media-domains only when that is set) and `file://` paths under --allowed-local-media-path only,
as vLLM allows them. Each failure is a 400 that names the content part."""

from __future__ import annotations

import base64
import binascii
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from llmctl.engine.errors import InvalidRequestError

MAX_IMAGE_BYTES = 20 * 1024**2  # one encoded image
MAX_IMAGE_PIXELS = 64 * 1024**2  # one decoded image (a decompression bomb is refused before it is decoded)


@dataclass(frozen=True)
class MediaPolicy:
    allowed_local_media_path: Path | None = None  # file:// URLs only below this folder; None: refused
    allowed_media_domains: tuple[str, ...] = ()  # http(s) hosts; empty: any
    fetch_timeout: float = 5.0  # seconds, vLLM's VLLM_IMAGE_FETCH_TIMEOUT
    max_bytes: int = MAX_IMAGE_BYTES


def load_image(url: str, where: str, policy: MediaPolicy) -> Any:
    """The image at `url` as an RGB PIL image; InvalidRequestError naming `where` for anything wrong."""
    scheme = urlparse(url).scheme.lower()
    if scheme == "data":
        raw = _data_url(url, where, policy)
    elif scheme in ("http", "https"):
        raw = _fetch(url, where, policy)
    elif scheme == "file":
        raw = _local_file(url, where, policy)
    else:
        raise _bad(where, f"the image URL must be data:, http(s): or file:, got {url[:40]!r}")
    return decode_image(raw, where)


def _bad(where: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(f"{where}: {message}", "messages")


def _data_url(url: str, where: str, policy: MediaPolicy) -> bytes:
    header, _, payload = url[5:].partition(",")
    media_type = header.split(";")[0].strip().lower()
    if not media_type.startswith("image/"):
        raise _bad(where, f"a data URL's media type must be image/…, got {media_type or 'none'!r}")
    if ";base64" not in header.lower():
        raise _bad(where, "an image data URL must be base64: data:image/png;base64,…")
    if len(payload) * 3 // 4 > policy.max_bytes:
        raise _bad(where, f"the image is larger than {policy.max_bytes // 1024**2} MiB")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise _bad(where, "the data URL's payload is not valid base64") from None


def _fetch(url: str, where: str, policy: MediaPolicy) -> bytes:
    import httpx2

    host = (urlparse(url).hostname or "").lower()
    if policy.allowed_media_domains and host not in policy.allowed_media_domains:
        raise _bad(where, f"{host!r} is not among the server's --allowed-media-domains")
    try:
        with httpx2.stream("GET", url, timeout=policy.fetch_timeout, follow_redirects=False) as response:
            if response.status_code != 200:
                raise _bad(where, f"fetching the image gave HTTP {response.status_code}")
            kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
            if kind and not kind.startswith("image/") and kind != "application/octet-stream":
                raise _bad(where, f"the URL serves {kind!r}, not an image")
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > policy.max_bytes:
                    raise _bad(where, f"the image is larger than {policy.max_bytes // 1024**2} MiB")
            return bytes(body)
    except httpx2.TimeoutException:
        raise _bad(where, f"fetching the image took longer than {policy.fetch_timeout:g} s") from None
    except httpx2.HTTPError as exc:
        raise _bad(where, f"the image could not be fetched: {exc}") from None


def _local_file(url: str, where: str, policy: MediaPolicy) -> bytes:
    if policy.allowed_local_media_path is None:
        raise _bad(where, "file:// URLs need the server started with --allowed-local-media-path")
    root = policy.allowed_local_media_path.resolve()
    path = Path(unquote(urlparse(url).path)).resolve()
    if not path.is_relative_to(root):
        raise _bad(where, f"{path} is not under the server's --allowed-local-media-path")
    if not path.is_file():
        raise _bad(where, f"{path} is not a file")
    if path.stat().st_size > policy.max_bytes:
        raise _bad(where, f"the image is larger than {policy.max_bytes // 1024**2} MiB")
    return path.read_bytes()


def decode_image(raw: bytes, where: str) -> Any:
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(raw))
        if image.width * image.height > MAX_IMAGE_PIXELS:
            raise _bad(where, f"the image is {image.width}×{image.height} pixels; the most is "
                              f"{MAX_IMAGE_PIXELS // 1024**2} Mi pixels")
        image.load()
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
        raise _bad(where, f"the bytes are not an image this server can decode ({type(exc).__name__})") from None
    return image.convert("RGB")
