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


def _randomize(model, language_std: float = 0.2, tower_std: float = 0.05) -> None:
    """Large enough that outputs depend on every part; the tower's smaller, so the images steer the answer
    without saturating it (at 0.2 everywhere every image gives the same tokens)."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            language = any(part in name for part in ("language_model", "text_model", "lm_head"))
            param.normal_(0, language_std if language else tower_std)


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


def write_llava_next(folder: Path, tokenizer) -> Path:
    """LLaVA-NeXT as llava-hf publishes it: LLaVA-1.5's parts with any-res tiles of 32 px (pinpoints 32 × 64,
    64 × 32 and 64 × 64: up to four tiles and the base view) and a learned row-end embedding;
    LlavaNextImageProcessor and LlavaNextProcessor."""
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaNextConfig,
        LlavaNextForConditionalGeneration,
        LlavaNextImageProcessor,
        LlavaNextProcessor,
    )

    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    pinpoints = [[32, 64], [64, 32], [64, 64]]
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                              image_size=32, patch_size=8, projection_dim=32)
    text = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    config = LlavaNextConfig(vision_config=vision, text_config=text, image_grid_pinpoints=pinpoints,
                             image_token_index=tokenizer.convert_tokens_to_ids("<image>"))
    model = LlavaNextForConditionalGeneration(config).eval()
    _randomize(model, **LLAVA_NEXT_STD)
    image_processor = LlavaNextImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32},
                                              image_grid_pinpoints=pinpoints)
    processor = LlavaNextProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=8,
                                   vision_feature_select_strategy="default", num_additional_image_tokens=1,
                                   chat_template=LLAVA_TEMPLATE)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


LLAVA_NEXT_STD = {"language_std": 0.15, "tower_std": 0.15}  # where each image gives other tokens


SMOLVLM_TEMPLATE = ("<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
                    "{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
                    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
                    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n"
                    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}")  # SmolVLM's own


def smolvlm_tokenizer(tokenizer):
    """A copy of the default (SmolLM2) tokenizer with SmolVLM's image, end-of-utterance and tile tokens."""
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": [
        "<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>",
        *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7))]})
    return tokenizer


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

    tokenizer = smolvlm_tokenizer(tokenizer)
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


QWEN2_VL_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}"
                     "{{ m['content'] }}{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}"
                     "<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c['text'] }}{% endif %}{% endfor %}"
                     "{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                     "{% endif %}")  # Qwen2-VL's own, without its default system prompt


QWEN_FAMILIES = {"2": "qwen2_vl", "2.5": "qwen2_5_vl", "3": "qwen3_vl"}
QWEN_TOWERS = {
    "2.5": {"depth": 2, "hidden_size": 32, "out_hidden_size": 64, "intermediate_size": 48, "num_heads": 4,
            "patch_size": 4, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 16,
            "fullatt_block_indexes": [1]},  # windows of 2 × 2 merged units; the second block sees it all
    "3": {"depth": 2, "hidden_size": 32, "out_hidden_size": 64, "intermediate_size": 48, "num_heads": 4,
          "patch_size": 4, "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 16,
          "deepstack_visual_indexes": [0]},
}
QWEN_STD = {"2": {"language_std": 0.1}, "2.5": {"language_std": 0.2}, "3": {"language_std": 0.1}}  # where each
# image gives other tokens


def write_qwen2_vl(folder: Path, tokenizer, version: str = "2") -> Path:
    """Qwen2-VL as Qwen publishes it: dynamic-resolution ViT (4 px patches, 2 × 2 merge, 2 frames per patch),
    Qwen2 language model with M-RoPE sections [2, 3, 3]; Qwen2VLImageProcessor resizing to multiples of 8 px
    between 64 and 4096 pixels. Saved as its parts: transformers' Qwen2VLProcessor cannot be built (or saved)
    without torchvision, which this machine does not have (reference_processor builds it for the reference).
    version "2.5": Qwen2.5-VL's tower (RMSNorm, gated MLP, 16 px windows, full attention in its last block);
    "3": Qwen3-VL's (learned 4 × 4 positions resampled, DeepStack from its first block) and its Qwen3 language
    model (q/k norms, head_dim 16, interleaved M-RoPE)."""
    import transformers

    family = QWEN_FAMILIES[version]
    config_class = {"2": transformers.Qwen2VLConfig, "2.5": transformers.Qwen2_5_VLConfig,
                    "3": transformers.Qwen3VLConfig}[version]
    tower = {"depth": 2, "embed_dim": 32, "hidden_size": 64, "num_heads": 4, "mlp_ratio": 2, "patch_size": 4,
             "spatial_merge_size": 2, "temporal_patch_size": 2} if version == "2" else QWEN_TOWERS[version]
    tokenizer = copy.deepcopy(tokenizer)
    specials = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    ids = dict(zip(specials, tokenizer.convert_tokens_to_ids(specials)))
    config = config_class(
        vision_config=tower,
        text_config={"vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "max_position_embeddings": 1024, "bos_token_id": None, "eos_token_id": tokenizer.eos_token_id,
                     "head_dim": 16, "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3],
                                                         "rope_theta": 10000.0, "mrope_interleaved": version == "3"}},
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    model = model_class(family)(config).eval()
    _randomize(model, **QWEN_STD[version])
    model.save_pretrained(folder)
    transformers.Qwen2VLImageProcessor(size={"shortest_edge": 64, "longest_edge": 4096}, patch_size=4, merge_size=2,
                          temporal_patch_size=2).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "chat_template.jinja").write_text(QWEN2_VL_TEMPLATE)
    return folder


GEMMA3_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' "
                   "else m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}{% else %}"
                   "{% for c in m['content'] %}{% if c['type'] == 'image' %}<start_of_image>{% else %}{{ c['text'] }}"
                   "{% endif %}{% endfor %}{% endif %}<end_of_turn>\n{% endfor %}"
                   "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")  # Gemma 3's, images as it writes


def write_gemma3(folder: Path, tokenizer) -> Path:
    """Gemma 3 4B's shape in small (Gemma3ForConditionalGeneration): SigLIP on one 64 px view (8 px patches),
    pooled 2 × 2 to 16 tokens per image — more than the text model's sliding window of 8, so an image's
    tokens see each other both ways across it; Gemma3ImageProcessor and Gemma3Processor with the image
    tokens in the tokenizer's extra_special_tokens, as Google publishes them."""
    import json

    from transformers import (
        AutoTokenizer,
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3Processor,
        SiglipVisionConfig,
    )
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    from helpers.families import gemma3_text_config

    specials = {"boi_token": "<start_of_image>", "image_token": "<image_soft_token>", "eoi_token": "<end_of_image>"}
    tokenizer.save_pretrained(folder)
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**settings, "extra_special_tokens": specials}))
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                image_size=64, patch_size=8, vision_use_head=False)
    text = gemma3_text_config(len(tokenizer))
    text.max_position_embeddings = 1024
    config = Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(),
                          mm_tokens_per_image=16, image_token_id=tokenizer.image_token_id,
                          boi_token_id=tokenizer.boi_token_id, eoi_token_id=tokenizer.eoi_token_id)
    model = Gemma3ForConditionalGeneration(config).eval()
    _randomize(model, **GEMMA3_STD)
    processor = Gemma3Processor(image_processor=Gemma3ImageProcessorPil(size={"height": 64, "width": 64}),
                                tokenizer=tokenizer, image_seq_length=16, chat_template=GEMMA3_TEMPLATE)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


GEMMA3_STD = {"language_std": 0.05, "tower_std": 0.3}  # where each image gives other tokens


def write_qwen2_5_vl(folder: Path, tokenizer) -> Path:
    return write_qwen2_vl(folder, tokenizer, version="2.5")


def write_qwen3_vl(folder: Path, tokenizer) -> Path:
    return write_qwen2_vl(folder, tokenizer, version="3")


WRITERS = {"llava": write_llava, "llava_next": write_llava_next, "idefics3": write_idefics3, "gemma3": write_gemma3,
           "qwen2_vl": write_qwen2_vl,
           "qwen2_5_vl": write_qwen2_5_vl, "qwen3_vl": write_qwen3_vl}


def model_class(family: str):
    import transformers

    return getattr(transformers, {"llava": "LlavaForConditionalGeneration",
                                  "llava_next": "LlavaNextForConditionalGeneration",
                                  "gemma3": "Gemma3ForConditionalGeneration",
                                  "idefics3": "Idefics3ForConditionalGeneration",
                                  "qwen2_vl": "Qwen2VLForConditionalGeneration",
                                  "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
                                  "qwen3_vl": "Qwen3VLForConditionalGeneration"}[family])


def reference_processor(folder: Path):
    """The family's transformers processor. Qwen2VLProcessor (and Qwen2.5-VL's) refuses to be built without a
    video processor, which needs torchvision: for the reference it is built with that one check skipped."""
    import json

    import transformers
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer
    from transformers.processing_utils import ProcessorMixin

    if not (folder / "preprocessor_config.json").exists() or (folder / "processor_config.json").exists():
        return AutoProcessor.from_pretrained(str(folder))
    model_type = json.loads((folder / "config.json").read_text())["model_type"]
    processor_class = {"qwen2_vl": transformers.Qwen2VLProcessor, "qwen2_5_vl": transformers.Qwen2_5_VLProcessor,
                       "qwen3_vl": transformers.Qwen3VLProcessor}[model_type]
    check = ProcessorMixin.check_argument_for_proper_class
    ProcessorMixin.check_argument_for_proper_class = lambda self, name, arg: None
    try:
        return processor_class(image_processor=AutoImageProcessor.from_pretrained(str(folder)),
                                tokenizer=AutoTokenizer.from_pretrained(str(folder)),
                                chat_template=(folder / "chat_template.jinja").read_text())
    finally:
        ProcessorMixin.check_argument_for_proper_class = check


def transformers_greedy(folder: Path, model_class, text: str, images: list, tokens: int, **processor_kwargs) -> list[int]:
    """transformers' generate on the processor's inputs: the reference."""
    processor = reference_processor(folder)
    model = model_class.from_pretrained(str(folder)).eval()
    inputs = processor(text=text, images=images or None, return_tensors="pt", **processor_kwargs)
    out = model.generate(**inputs, max_new_tokens=tokens, do_sample=False)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def chat_text(folder: Path, images: int, question: str = "What is in the picture?") -> str:
    """The user turn with `images` image parts, through the processor's chat template."""
    processor = reference_processor(folder)
    messages = [{"role": "user", "content": [{"type": "image"}] * images + [{"type": "text", "text": question}]}]
    return processor.apply_chat_template(messages, add_generation_prompt=True)
