"""The request fields of the pooling endpoints (vLLM's names), read by their handlers' warnings about unknown
fields and by /openapi.json; and their `input`, read one way."""

from __future__ import annotations

from llmctl.server.protocol import COMMON_FIELDS, COMPLETION_FIELDS, Fields, FieldSpec, bad, prompt_list

TEXTS_SCHEMA = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]}
INPUT = FieldSpec("custom", "text(s) or token ids", schema=COMPLETION_FIELDS["prompt"].schema)

SCORE_FIELDS: dict[str, FieldSpec] = {
    "model": COMMON_FIELDS["model"],
    "text_1": FieldSpec("custom", "the first text(s): one against every text_2, or one per text_2", schema=TEXTS_SCHEMA),
    "text_2": FieldSpec("custom", "the second text(s)", schema=TEXTS_SCHEMA),
    "queries": FieldSpec("custom", "vLLM's other spelling of text_1", schema=TEXTS_SCHEMA),
    "documents": FieldSpec("custom", "vLLM's other spelling of text_2", schema=TEXTS_SCHEMA),
}
RERANK_FIELDS: dict[str, FieldSpec] = {
    "model": COMMON_FIELDS["model"],
    "query": FieldSpec("string", "the query the documents are ranked for"),
    "documents": FieldSpec("custom", "texts, or Cohere's {\"text\": …} objects", schema={
        "type": "array", "minItems": 1, "items": {"oneOf": [{"type": "string"}, {
            "type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}}]}}),
    "top_n": FieldSpec("integer", "the best N documents (0: all)", 0),
    "return_documents": FieldSpec("boolean", "each result carries its document's text", True),
}
CLASSIFY_FIELDS: dict[str, FieldSpec] = {
    "model": COMMON_FIELDS["model"],
    "input": INPUT,
    "use_activation": FieldSpec("boolean", "probabilities (softmax; sigmoid for one label), or raw scores", True),
}
POOLING_FIELDS: dict[str, FieldSpec] = {
    "model": COMMON_FIELDS["model"],
    "input": INPUT,
    "use_activation": FieldSpec("boolean", "classifiers and reward heads: probabilities (softmax; sigmoid for one "
                                "label), or raw scores; absent: the model's default (on, but for a one-output "
                                "reward model)"),
}


def pooling_inputs(fields: Fields) -> list[str | list[int]]:
    """`input`: text(s) or token ids, none of them empty."""
    inputs = prompt_list(fields.raw("input"), "input")
    if any(item == "" for item in inputs):
        raise bad("input must not contain empty strings", "input")
    return inputs
