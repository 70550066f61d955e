"""What a checkpoint is for when it is not a generator — an embedding model, a classifier (cross-encoder
rerankers are one-label classifiers) or a reward model — and how it pools its hidden states, read as vLLM
reads it: the architecture, then sentence-transformers' layout (modules.json, the Pooling module's config,
a Normalize module), then config.json's Matryoshka dimensions. Torch-free: `inspect` reports it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENCODER_TYPES = ("bert", "roberta", "xlm-roberta", "distilbert", "mpnet", "electra", "deberta-v2", "modernbert")
# sentence-transformers' pooling modes -> vLLM's pooling type names (and the modes vLLM has no name for); its
# Pooling config names them in `pooling_mode` (version 5 and later) or sets `pooling_mode_<key>` flags (before)
ST_POOLING_MODES = {"cls": "CLS", "lasttoken": "LAST", "mean": "MEAN", "max": "MAX",
                    "mean_sqrt_len_tokens": "MEAN_SQRT_LEN", "weightedmean": "WEIGHTED_MEAN"}
ST_POOLING_FLAGS = {"pooling_mode_cls_token": "cls", "pooling_mode_lasttoken": "lasttoken",
                    "pooling_mode_mean_tokens": "mean", "pooling_mode_max_tokens": "max",
                    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                    "pooling_mode_weightedmean_tokens": "weightedmean"}
GENERATIVE_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
# reward models whose score head llmctl runs: architecture -> (vLLM's default pooling, the head's outputs). Both
# ship Qwen's remote code's head, Linear(hidden, hidden) -> ReLU -> Linear(hidden, labels), as `score.0`, `score.2`
REWARD_HEADS = {"Qwen2ForRewardModel": ("ALL", 1), "Qwen2ForProcessRewardModel": ("STEP", 2)}
# vLLM's step tag of Qwen2ForProcessRewardModel: `<extra_0>`, which Qwen2.5-Math-PRM's prompts put after each step
PRM_STEP_TAG_ID = 151651


@dataclass(frozen=True)
class PoolingSpec:
    task: str  # vLLM's --convert: "embed", "classify" or "reward"
    pooling: str  # LAST, MEAN, CLS, ALL (vLLM's), or a sentence-transformers mode vLLM has no name for
    normalize: bool  # L2-normalized output (embeddings)
    origin: str  # where the pooling was read
    dimensions: tuple[int, ...] = ()  # Matryoshka sizes the output may be cut to ((): any size up to the full one)
    matryoshka: bool = False
    labels: int | None = None  # classifiers: the output size
    dense: bool = False  # a sentence-transformers Dense projection follows the pooling
    step_tag_id: int | None = None  # STEP pooling: the rows of this token alone
    reward_head: str | None = None  # the architecture whose reward head the checkpoint holds (REWARD_HEADS)

    def describe(self) -> str:
        what = {"embed": "embedding model", "classify": f"classifier ({self.labels or '?'} labels)",
                "reward": "reward model"}[self.task]
        parts = [f"{what}: {self.pooling} pooling" + (", normalized" if self.normalize else "")
                 + (f" (the rows of token {self.step_tag_id})" if self.step_tag_id is not None else "")]
        if self.reward_head:
            parts.append(f"a score head of {self.labels} output{'s' if self.labels != 1 else ''}")
        if self.dense:
            parts.append("then a Dense projection")
        if self.matryoshka:
            parts.append("Matryoshka: " + (", ".join(map(str, self.dimensions)) if self.dimensions else "any size"))
        return "; ".join(parts) + f" (from {self.origin})"


def pooling_spec(folder: Path, raw: dict[str, Any]) -> PoolingSpec | None:
    """The checkpoint's pooling task and settings; None for a generative model without an embedding layout."""
    architectures = [str(a) for a in raw.get("architectures") or []]
    modules = _read_json(folder / "modules.json")
    task = _task(architectures, str(raw.get("model_type", "")), modules is not None)
    if task is None:
        return None
    encoder = str(raw.get("model_type", "")) in ENCODER_TYPES
    pooling, normalize, origin, dense = _default_pooling(task, encoder)
    if modules is not None:
        pooling, normalize, dense = _sentence_transformers(folder, modules, pooling)
        origin = "modules.json"
    dimensions = tuple(int(d) for d in raw.get("matryoshka_dimensions") or ())
    labels = _labels(raw) if task == "classify" else None
    head = next((a for a in architectures if a in REWARD_HEADS), None) if task == "reward" else None
    step_tag_id = None
    if head is not None:
        pooling, labels = REWARD_HEADS[head]
        step_tag_id = PRM_STEP_TAG_ID if pooling == "STEP" else None
    return PoolingSpec(task, pooling, normalize, origin, dimensions, bool(dimensions or raw.get("is_matryoshka")),
                       labels, dense, step_tag_id, head)


def _task(architectures: list[str], model_type: str, sentence_transformers: bool) -> str | None:
    if any(a.endswith("ForSequenceClassification") for a in architectures):
        return "classify"
    if any("RewardModel" in a or a.endswith("ForRewardModeling") for a in architectures):
        return "reward"
    if sentence_transformers:
        return "embed"
    generative = any(a.endswith(GENERATIVE_SUFFIXES) for a in architectures)
    return "embed" if not generative and model_type in ENCODER_TYPES else None


def _default_pooling(task: str, encoder: bool) -> tuple[str, bool, str, bool]:
    """(pooling, normalize, origin, dense) without sentence-transformers' files: vLLM's defaults per task
    (an encoder's embeddings: mean and normalized, sentence-transformers' own default)."""
    if task == "reward":
        return "ALL", False, "the task's default", False
    if task == "classify":
        return ("CLS" if encoder else "LAST"), False, "the task's default", False
    return ("MEAN" if encoder else "LAST"), True, "the task's default", False


def _sentence_transformers(folder: Path, modules: list[dict[str, Any]], pooling: str) -> tuple[str, bool, bool]:
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]  # the class names, whatever the module
    normalize, dense = "Normalize" in kinds, "Dense" in kinds
    for module, kind in zip(modules, kinds):
        if kind == "Pooling":
            config = _read_json(folder / str(module.get("path", "")) / "config.json") or {}
            modes = config.get("pooling_mode") or [mode for key, mode in ST_POOLING_FLAGS.items() if config.get(key)]
            chosen = [ST_POOLING_MODES.get(mode, mode.upper()) for mode in ([modes] if isinstance(modes, str) else modes)]
            if chosen:
                pooling = "+".join(chosen)
    return pooling, normalize, dense


def _labels(raw: dict[str, Any]) -> int | None:
    labels = raw.get("id2label")
    return len(labels) if isinstance(labels, dict) and labels else raw.get("num_labels")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
