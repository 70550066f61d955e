"""A chat with one image through `llmctl serve`, on a SmolVLM-256M-shaped model (random weights, the real
shapes: SigLIP 12 × 768 on 512 px tiles, pixel shuffle by 4, SmolLM2-135M; Idefics3Processor splitting a
512 × 512 image into its tile and global view), against transformers' generate on the same model in the same run.

    python benchmarks/vision_chat.py [--rounds 3] [--tokens 16] [--processor-kwargs '{"do_image_splitting": false}']

Prints the server's start-up time, each chat's latency (first image and a new image each round), the server's
resident memory before and after the images, and transformers' latency for the same prompt, alternating."""

from __future__ import annotations

import argparse
import base64
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the test helpers: server, tokenizer


def smolvlm_256m(folder: Path) -> Path:
    import torch
    import transformers as tf

    from llmctl.checkpoint.source import resolve_model

    if (folder / "config.json").exists():
        return folder
    from helpers.vision_models import smolvlm_tokenizer

    tokenizer = smolvlm_tokenizer(tf.AutoTokenizer.from_pretrained(str(resolve_model(None, show_progress=False).path)))
    vision = tf.Idefics3VisionConfig(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                                     num_attention_heads=12, image_size=512, patch_size=16)
    text = tf.LlamaConfig(vocab_size=len(tokenizer), hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                          num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                          rope_theta=100000.0, tie_word_embeddings=True)
    config = tf.Idefics3Config(vision_config=vision.to_dict(), text_config=text.to_dict(), scale_factor=4,
                               image_token_id=tokenizer.convert_tokens_to_ids("<image>"), tie_word_embeddings=True)
    torch.manual_seed(0)
    model = tf.Idefics3ForConditionalGeneration(config).eval()
    template = ("<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}: {% for line in "
                "message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}{% else %}<image>{% endif %}"
                "{% endfor %}<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}")
    processor = tf.Idefics3Processor(tf.Idefics3ImageProcessor(size={"longest_edge": 2048},
                                                               max_image_size={"longest_edge": 512}),
                                     tokenizer, image_seq_len=64, chat_template=template)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def image_url(seed: int) -> tuple[str, object]:
    from PIL import Image

    image = Image.fromarray((np.random.RandomState(seed).rand(512, 512, 3) * 255).astype("uint8"))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode(), image


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--processor-kwargs", default="{}", help="for both processors, as --mm-processor-kwargs")
    args = parser.parse_args()
    kwargs = json.loads(args.processor_kwargs)
    from helpers.server_helpers import start_server

    folder = smolvlm_256m(Path(tempfile.gettempdir()) / "llmctl-smolvlm-256m-shaped")
    started = time.perf_counter()
    # fixed threads: the server otherwise takes fewer while transformers' run (between its requests) loads the cores
    server = start_server(str(folder), "--served-model-name", "smolvlm", "--max-model-len", "4096", "--cpu-threads",
                          "2", "--mm-processor-kwargs", args.processor_kwargs, timeout=600)
    startup = time.perf_counter() - started
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    before = rss_mib(server.process.pid)
    ours, theirs = [], []
    reference = transformers_runner(folder, args.tokens, kwargs)
    for round_ in range(args.rounds):
        url, image = image_url(round_)
        start = time.perf_counter()
        answer = client.chat.completions.create(model="smolvlm", max_tokens=args.tokens, temperature=0,
                                                extra_body={"ignore_eos": True}, messages=[{"role": "user", "content": [
                                                    {"type": "image_url", "image_url": {"url": url}},
                                                    {"type": "text", "text": "What is in the picture?"}]}])
        ours.append(time.perf_counter() - start)
        theirs.append(reference(image))
        print(f"round {round_}: llmctl serve {ours[-1]:.2f} s ({answer.usage.prompt_tokens} prompt tokens), "
              f"transformers generate {theirs[-1]:.2f} s", flush=True)
    after = rss_mib(server.process.pid)
    server.stop()
    print(f"server start-up (load, warm-up, healthy): {startup:.1f} s")
    print(f"chat with one new 512x512 image, {args.tokens} tokens: llmctl serve median {statistics.median(ours):.2f} s, "
          f"transformers generate median {statistics.median(theirs):.2f} s (in-process, no HTTP)")
    print(f"server resident memory: {before:.0f} MiB before the images, {after:.0f} MiB after {args.rounds}")


def transformers_runner(folder: Path, tokens: int, kwargs: dict):
    import torch
    from transformers import AutoProcessor, Idefics3ForConditionalGeneration

    processor = AutoProcessor.from_pretrained(str(folder))
    model = Idefics3ForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32).eval()
    text = processor.apply_chat_template([{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": "What is in the picture?"}]}], add_generation_prompt=True)

    def run(image: object) -> float:
        start = time.perf_counter()
        inputs = processor(text=text, images=[image], return_tensors="pt", **kwargs)
        with torch.no_grad():
            model.generate(**inputs, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
        return time.perf_counter() - start

    return run


if __name__ == "__main__":
    main()
