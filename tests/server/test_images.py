"""Images in chat through a real `llmctl serve` of a tiny LLaVA: the official openai client with data URLs, http
URLs from a local server and file:// paths gets transformers' greedy answer; the same image twice hits the prefix
cache in /metrics; every bad image is a 400 that names its content part."""

from __future__ import annotations

import base64
import http.server
import json
import re
import threading
import urllib.request
from functools import partial

import pytest

from helpers.cli_process import run_cli
from helpers.server_helpers import post, start_server
from helpers.vision_models import chat_text, data_url, random_image, transformers_greedy, write_llava

TOKENS = 6
IMAGES = [random_image(50, 40, seed=0), random_image(30, 64, seed=1)]


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    """A folder of files, and a local HTTP server serving it."""
    folder = tmp_path_factory.mktemp("media")
    for index, image in enumerate(IMAGES):
        image.save(folder / f"image{index}.png")
    (folder / "page.html").write_text("<html>not an image</html>")
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield folder, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def llava(tmp_path_factory, tokenizer):
    return write_llava(tmp_path_factory.mktemp("llava-serve") / "llava", tokenizer)


@pytest.fixture(scope="module")
def server(llava, media):
    folder, _ = media
    server = start_server(str(llava), "--served-model-name", "llava", "--max-model-len", "256", "--limit-mm-per-prompt", '{"image": 2}',
                          "--allowed-local-media-path", str(folder), "--allowed-media-domains", "127.0.0.1")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused")


def expected_text(llava, images, **processor_kwargs) -> str:
    from transformers import AutoTokenizer, LlavaForConditionalGeneration

    tokens = transformers_greedy(llava, LlavaForConditionalGeneration, chat_text(llava, len(images)), images, TOKENS,
                                 **processor_kwargs)
    return AutoTokenizer.from_pretrained(str(llava)).decode(tokens, skip_special_tokens=True)


def ask(client, urls: list[str], **extra):
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return client.chat.completions.create(model="llava", max_tokens=TOKENS, temperature=0,
                                          messages=[{"role": "user", "content": [
                                              *parts, {"type": "text", "text": "What is in the picture?"}]}], **extra)


def test_openai_client_gets_transformers_answer_for_one_and_two_images(client, llava, media):
    _, base = media
    one = ask(client, [data_url(IMAGES[0])])
    assert one.choices[0].message.content == expected_text(llava, IMAGES[:1])
    assert one.usage.prompt_tokens == len(token_ids(llava, chat_text(llava, 1))) - 1 + 16  # <image> became 16
    two = ask(client, [data_url(IMAGES[0]), f"{base}/image1.png"])
    assert two.choices[0].message.content == expected_text(llava, IMAGES[:2])


def test_responses_api_takes_input_image(client, llava):
    response = client.responses.create(model="llava", max_output_tokens=TOKENS, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_image", "image_url": data_url(IMAGES[0])},
                                     {"type": "input_text", "text": "What is in the picture?"}]}])
    assert response.output_text == expected_text(llava, IMAGES[:1])


def token_ids(llava, text: str) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(llava)).encode(text, add_special_tokens=False)


def test_mm_processor_kwargs_reach_the_processor(client, server, llava):
    settings = {"image_mean": [0.0, 0.0, 0.0], "image_std": [1.0, 1.0, 1.0]}
    image = random_image(40, 40, seed=5)  # asked in this test only
    answer = ask(client, [data_url(image)], extra_body={"mm_processor_kwargs": settings})
    assert answer.choices[0].message.content == expected_text(llava, [image], **settings)
    before = prefix_hits(server)
    ask(client, [data_url(image)])  # the same image without them: other pixels, so no cached block of it
    assert prefix_hits(server) == before


def test_a_file_url_under_the_allowed_path_is_the_same_image(client, media):
    folder, _ = media
    by_file = ask(client, [(folder / "image0.png").as_uri()])
    assert by_file.choices[0].message.content == ask(client, [data_url(IMAGES[0])]).choices[0].message.content


def prefix_hits(server) -> float:
    text = urllib.request.urlopen(server.url + "/metrics").read().decode()
    return float(re.search(r"^llmctl:prefix_cache_hits_total\{[^}]*\} (\S+)$", text, re.M).group(1))


def test_the_same_image_reuses_cached_blocks_and_another_does_not(client, server):
    ask(client, [data_url(IMAGES[1])])
    before = prefix_hits(server)
    ask(client, [data_url(IMAGES[1])])
    assert prefix_hits(server) - before >= 16
    before = prefix_hits(server)
    ask(client, [data_url(random_image(50, 40, seed=7))])  # same text, a new image: every block holds its tokens
    assert prefix_hits(server) == before


def image_message(*urls: str) -> dict:
    return {"model": "llava", "max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "look"}, *({"type": "image_url", "image_url": {"url": u}} for u in urls)]}]}


BAD_IMAGES = [
    (lambda base, folder: ["data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n garbage").decode()],
     "not an image this server can decode"),
    (lambda base, folder: ["data:text/plain;base64,aGVsbG8="], "media type must be image/"),
    (lambda base, folder: ["data:image/png;base64,@@@"], "not valid base64"),
    (lambda base, folder: [f"{base}/page.html"], "not an image"),
    (lambda base, folder: [f"{base}/broken.png"], "not an image this server can decode"),
    (lambda base, folder: [f"{base}/missing.png"], "HTTP 404"),
    (lambda base, folder: [f"{base.replace('127.0.0.1', 'localhost')}/image0.png"], "not among the server's "
                                                                                     "--allowed-media-domains"),
    (lambda base, folder: ["file:///etc/hostname"], "not under the server's --allowed-local-media-path"),
    (lambda base, folder: ["ftp://example.com/a.png"], "must be data:, http(s): or file:"),
]


@pytest.mark.parametrize("urls, message", BAD_IMAGES)
def test_bad_images_are_400_naming_the_part(server, media, urls, message):
    folder, base = media
    code, body = post(server, "/v1/chat/completions", image_message(*urls(base, folder)))
    assert code == 400, body
    assert body["error"]["message"].startswith("messages[0].content[1]: ")
    assert message in body["error"]["message"]


def test_more_images_than_the_limit_are_refused_before_any_fetch(server):
    url = data_url(IMAGES[0])
    code, body = post(server, "/v1/chat/completions", image_message(url, url, url))
    assert code == 400 and "at most 2 per prompt (--limit-mm-per-prompt)" in body["error"]["message"]


def test_the_server_keeps_serving_after_bad_images(client):
    assert ask(client, [data_url(IMAGES[0])]).choices[0].finish_reason == "length"


def test_bench_serve_random_mm_sends_images_as_chat_parts(server, tmp_path):
    out = tmp_path / "random-mm.json"
    result = run_cli("bench", "serve", "--base-url", server.url, "--endpoint", "/v1/chat/completions",
                     "--dataset-name", "random-mm", "--num-prompts", "4", "--random-input-len", "8",
                     "--random-output-len", "3", "--random-mm-base-items-per-request", "2",
                     "--random-mm-bucket-config", "{(40, 50, 1): 0.5, (64, 30, 1): 0.5}", "--ignore-eos",
                     "--result-filename", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(out.read_text())
    assert data["completed"] == 4 and data["failed"] == 0
    assert all(length >= 8 + 2 * 16 for length in data["input_lens"])  # the server counted each image's 16 tokens
    refused = run_cli("bench", "serve", "--base-url", server.url, "--dataset-name", "random-mm", "--num-prompts", "1")
    assert refused.returncode != 0 and "go to the chat endpoint" in " ".join(refused.stderr.split())


@pytest.mark.parametrize("family", ["llava_next", "idefics3", "gemma3", "qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_the_other_families_answer_through_serve_as_transformers(tmp_path, tokenizer, family):
    """LLaVA-NeXT's any-res tiles, SmolVLM's tiles, Gemma 3's images attending both ways and the Qwen-VL families'
    M-RoPE (their processor assembled by llmctl without torchvision) behind the same server and client: two images
    of different sizes, transformers' answer."""
    import openai
    from transformers import AutoTokenizer

    from helpers.vision_models import WRITERS, model_class

    folder = WRITERS[family](tmp_path / family, tokenizer)
    server = start_server(str(folder), "--served-model-name", "vlm", "--max-model-len", "512")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
        answer = client.chat.completions.create(model="vlm", max_tokens=TOKENS, temperature=0, messages=[
            {"role": "user", "content": [*({"type": "image_url", "image_url": {"url": data_url(image)}}
                                           for image in IMAGES),
                                         {"type": "text", "text": "What is in the picture?"}]}])
    finally:
        server.stop()
    reference = transformers_greedy(folder, model_class(family), chat_text(folder, 2), IMAGES, TOKENS)
    assert answer.choices[0].message.content == AutoTokenizer.from_pretrained(str(folder)).decode(
        reference, skip_special_tokens=True)
