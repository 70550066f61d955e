"""`llmctl inspect` and `plan` on vision-language checkpoints: the tower named, its parameters (tower and
projector) as transformers counts them — from the headers and from config.json alone — what llmctl holds of
them, and the tokens an image becomes as the family's processor makes them."""

from __future__ import annotations

import pytest

from helpers.vision_models import WRITERS, model_class, random_image, reference_processor


@pytest.mark.parametrize("family", sorted(WRITERS))
def test_inspect_names_the_tower_its_parameters_and_tokens_per_image(tmp_path, tokenizer, family):
    from llmctl.checkpoint.source import resolve_model
    from llmctl.inspect_report import build_inspect_report

    folder = WRITERS[family](tmp_path / family, tokenizer)
    report = build_inspect_report(resolve_model(str(folder), show_progress=False))
    vision, spec = report.vision, report.spec
    model = model_class(family).from_pretrained(str(folder))
    towers = ("vision_tower", "multi_modal_projector", "vision_model", "connector", "visual", "image_newline")
    tower = {name: p.numel() for name, p in model.named_parameters() if any(t in name for t in towers)}
    assert vision is not None and vision.params == sum(tower.values()) == spec.vision.in_checkpoint
    assert report.weights.counts_agree and not report.warnings  # config.json's count includes the tower
    if family.startswith("llava"):  # its last block (after the feature layer) and final norm are never loaded
        last = model.config.vision_config.num_hidden_layers - 1
        tower = {n: v for n, v in tower.items() if "post_layernorm" not in n and f"layers.{last}." not in n}
    assert spec.vision.held == sum(tower.values())
    processor = reference_processor(folder)
    qwen = family.startswith("qwen")
    size = 448 if qwen else {"llava_next": 64, "gemma3": 64}.get(family, 32)  # the size the count is stated for
    if qwen:
        processor.image_processor.size = {"shortest_edge": 64, "longest_edge": size * size}
    image_token = "<|image_pad|>" if qwen else "<image_soft_token>" if family == "gemma3" else "<image>"
    text = "<|vision_start|><|image_pad|><|vision_end|>" if qwen else "<start_of_image>" if family == "gemma3" \
        else image_token
    inputs = processor(text=text, images=[random_image(size, size)], return_tensors="pt")
    per_image = inputs["input_ids"][0].tolist().count(processor.tokenizer.convert_tokens_to_ids(image_token))
    tiles = inputs["pixel_values"].shape[1] if family == "idefics3" else 1  # its tiles and global view
    assert vision.tokens_per_image * tiles == per_image
