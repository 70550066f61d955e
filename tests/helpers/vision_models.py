"""Tiny vision-language checkpoints with their families' real processors: random weights from transformers'
config classes, the default model's tokenizer with the family's image tokens added, images made in memory."""

from __future__ import annotations

import base64
import copy
import io
from pathlib import Path

import numpy as np
import torch

LLAVA_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {% if m['content'] is string %}{{ m['content'] }}"
                  "{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}<image>\n{% else %}{{ c['text'] }}"
                  "{% endif %}{% endfor %}{% endif %}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")


def random_image(width: int, height: int, seed: int = 0):
    from PIL import Image

    pixels = (np.random.RandomState(seed).rand(height, width, 3) * 255).astype("uint8")
    return Image.fromarray(pixels)


def data_url(image, kind: str = "PNG") -> str:
    buffer = io.BytesIO()
    image.save(buffer, format=kind)
    return f"data:image/{kind.lower()};base64," + base64.b64encode(buffer.getvalue()).decode()


def _randomize(model, language_std: float = 0.2) -> None:
    """Large enough that outputs depend on every part; the tower's smaller, so the images steer the answer
    without saturating it (at 0.2 everywhere every image gives the same tokens)."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            language = any(part in name for part in ("language_model", "text_model", "lm_head"))
            param.normal_(0, language_std if language else 0.05)


def write_llava(folder: Path, tokenizer) -> Path:
    """LLaVA-1.5 as llava-hf publishes it: CLIP ViT tower (class token, 32 px, 8 px patches), two-layer
    projector, Llama language model; LlavaProcessor with CLIPImageProcessor."""
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tokenizer = copy.deepcopy(tokenizer)  # the session's tokenizer stays as it is
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                              image_size=32, patch_size=8, projection_dim=32)
    text = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=tokenizer.convert_tokens_to_ids(
        "<image>"), image_seq_length=16)
    model = LlavaForConditionalGeneration(config).eval()
    _randomize(model)
    processor = LlavaProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": 32},
                                                                  crop_size={"height": 32, "width": 32}),
                               tokenizer=tokenizer, patch_size=8, vision_feature_select_strategy="default",
                               num_additional_image_tokens=1, chat_template=LLAVA_TEMPLATE)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


SMOLVLM_TEMPLATE = ("<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
                    "{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
                    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
                    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n"
                    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}")  # SmolVLM's own


def write_idefics3(folder: Path, tokenizer) -> Path:
    """SmolVLM as HuggingFaceTB publishes it (Idefics3ForConditionalGeneration): SigLIP tower on 32 px tiles of
    8 px patches, pixel shuffle by 2 (4 tokens a tile), Llama language model; Idefics3Processor splitting images
    into tiles of up to 64 px plus a global view, with SmolVLM's image and row/column tokens and chat template."""
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessor,
        Idefics3Processor,
        Idefics3VisionConfig,
        LlamaConfig,
    )

    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": [
        "<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>",
        *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7))]})
    vision = Idefics3VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  image_size=32, patch_size=8)
    text = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    config = Idefics3Config(vision_config=vision.to_dict(), text_config=text.to_dict(), scale_factor=2,
                            image_token_id=tokenizer.convert_tokens_to_ids("<image>"))
    model = Idefics3ForConditionalGeneration(config).eval()
    _randomize(model, language_std=0.05)  # its 4 tokens a tile steer a 0.2 language model less than LLaVA's 16
    processor = Idefics3Processor(image_processor=Idefics3ImageProcessor(size={"longest_edge": 64},
                                                                         max_image_size={"longest_edge": 32}),
                                  tokenizer=tokenizer, image_seq_len=4, chat_template=SMOLVLM_TEMPLATE)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


WRITERS = {"llava": write_llava, "idefics3": write_idefics3}


def model_class(family: str):
    import transformers

    return getattr(transformers, {"llava": "LlavaForConditionalGeneration",
                                  "idefics3": "Idefics3ForConditionalGeneration"}[family])


def transformers_greedy(folder: Path, model_class, text: str, images: list, tokens: int) -> list[int]:
    """transformers' generate on the processor's inputs: the reference."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(str(folder))
    model = model_class.from_pretrained(str(folder)).eval()
    inputs = processor(text=text, images=images or None, return_tensors="pt")
    out = model.generate(**inputs, max_new_tokens=tokens, do_sample=False)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def chat_text(folder: Path, images: int, question: str = "What is in the picture?") -> str:
    """The user turn with `images` image parts, through the processor's chat template."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(str(folder))
    messages = [{"role": "user", "content": [{"type": "image"}] * images + [{"type": "text", "text": question}]}]
    return processor.apply_chat_template(messages, add_generation_prompt=True)
