"""Which runner a checkpoint gets (vLLM's --runner and --convert) and how its pooler is set up.

A decoder checkpoint runs as a pooling model when its architecture or its sentence-transformers layout says so
(llmctl.checkpoint.pooling), or when --runner pooling / --convert asks. It then reuses the native generative
model with the LM head dropped: `Qwen3Model`, `Qwen2ForSequenceClassification` and `LlamaForCausalLM` all load
into llmctl's Llama-family layers. Torch-free: the driver decides before any rank loads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from llmctl.checkpoint.pooling import ENCODER_TYPES, REWARD_HEADS, PoolingSpec, pooling_spec
from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.errors import EngineConfigError

RUNNERS = ("auto", "generate", "pooling")
CONVERTS = ("auto", "none", "embed", "classify", "reward")
ENGINE_POOLING = ("LAST", "MEAN", "CLS", "ALL", "STEP")  # what the engine's pooler computes
SEQUENCE_POOLING, TOKEN_POOLING = ("LAST", "MEAN", "CLS"), ("ALL", "STEP")
# --pooler-config's keys llmctl applies (vLLM's PoolerConfig names); the others it has are refused by name
POOLER_CONFIG_KEYS = ("pooling_type", "seq_pooling_type", "tok_pooling_type", "use_activation", "normalize",
                      "step_tag_id", "returned_token_ids")
POOLING_SUFFIXES = ("ForSequenceClassification", "ForRewardModeling", "ForProcessRewardModel", "ForRewardModel", "Model")


@dataclass(frozen=True)
class PoolerConfig:
    task: str  # embed | classify | reward
    pooling: str  # LAST | MEAN | CLS | ALL
    normalize: bool  # embeddings: L2-normalized
    hidden_size: int
    dimensions: tuple[int, ...] = ()  # Matryoshka sizes ((): any, when matryoshka)
    matryoshka: bool = False
    labels: int = 0  # classify, and reward with a score head (REWARD_HEADS): the head's outputs
    label_names: tuple[str, ...] = ()  # classify: config.json's id2label, in output order
    # classify from LM-head rows (vLLM's classifier_from_token): two tokens give one label, the second's logit
    # minus the first's (a Qwen3-Reranker's P(yes) after the sigmoid); more give one label each
    from_tokens: tuple[str, ...] = ()
    token_ids: tuple[int, ...] = ()  # the tokenizer's ids of from_tokens (with_token_ids)
    step_tag_id: int | None = None  # STEP: the rows whose prompt token is this one (None: every row)
    returned_token_ids: tuple[int, ...] = ()  # STEP: these columns of each row alone (vLLM's returned_token_ids)
    use_activation: bool | None = None  # --pooler-config's default for requests that do not say (None: the task's)

    @property
    def activates(self) -> bool:
        """Whether a request that does not say gets the activation: classifiers' softmax (sigmoid for one label);
        a reward head's softmax where it has labels to choose among (Qwen2.5-Math-PRM's step probabilities; a
        one-output reward model's score stays raw, as vLLM's)."""
        if self.use_activation is not None:
            return self.use_activation
        return self.task == "classify" or (self.task == "reward" and self.labels > 1)

    @property
    def whole_prompt(self) -> bool:
        """Whether the pooler reads every prompt row, so a prompt is computed in one step and no cached prefix is
        reused; LAST pooling reads the last row alone (chunked prefill and prefix caching stay on)."""
        return self.pooling != "LAST"

    def describe(self) -> str:
        what = {"embed": "embeddings", "classify": f"classification ({self.labels} labels)",
                "reward": f"reward (a score head of {self.labels} outputs per token)" if self.labels else
                "reward (every token's hidden state)"}[self.task]
        step = f" at token {self.step_tag_id}" if self.pooling == "STEP" and self.step_tag_id is not None else ""
        return f"{what}, {self.pooling} pooling{step}" + (", normalized" if self.normalize else "")


def resolve_pooler(runner: str, convert: str, spec: ModelSpec, folder: Path, raw: dict | None = None,
                   overrides: dict | None = None) -> PoolerConfig | None:
    """The pooler a decoder checkpoint runs with, or None to generate with it; `raw`: its config.json as loaded
    (with --hf-overrides applied); `overrides`: --pooler-config."""
    pooler = _resolve(runner, convert, spec, folder, _raw_config(folder) if raw is None else raw)
    if pooler is None:
        if overrides:
            raise EngineConfigError("--pooler-config applies to pooling models: this one generates")
        return None
    return with_pooler_config(pooler, overrides or {})


def _resolve(runner: str, convert: str, spec: ModelSpec, folder: Path, raw: dict) -> PoolerConfig | None:
    if runner not in RUNNERS:
        raise EngineConfigError(f"--runner {runner!r} is not one of {', '.join(RUNNERS)}")
    if convert not in CONVERTS:
        raise EngineConfigError(f"--convert {convert!r} is not one of {', '.join(CONVERTS)}")
    found = pooling_spec(folder, raw)
    if runner == "generate" or (runner == "auto" and found is None and convert in ("auto", "none")):
        if convert not in ("auto", "none"):
            raise EngineConfigError(f"--convert {convert} makes a pooling model: drop --runner generate")
        return None
    if spec.model_type in ENCODER_TYPES:
        raise EngineConfigError(f"{spec.model_type} encoders are served through transformers' modules, chosen "
                                "without --runner or --convert: drop them")
    task = convert if convert not in ("auto", "none") else (found.task if found else "embed")
    unknown_head = [a for a in spec.architectures if "RewardModel" in a and a not in REWARD_HEADS]
    if found is not None and found.task == task == "reward" and unknown_head:
        raise EngineConfigError(f"{unknown_head[0]}'s reward head is not implemented: llmctl runs the heads of "
                                f"{' and '.join(REWARD_HEADS)}, or any decoder's hidden states with --convert reward "
                                "and --hf-overrides '{\"architectures\": [\"...ForCausalLM\"]}'")
    tokens = tuple(str(t) for t in raw.get("classifier_from_token") or ())
    if tokens and task == "classify":
        return PoolerConfig(task, "LAST", False, spec.hidden_size, labels=1 if len(tokens) == 2 else len(tokens),
                            from_tokens=tokens)
    pooler = _pooler(task, found if found is not None and found.task == task else None, spec)
    names = raw.get("id2label") or {}
    if task == "classify" and isinstance(names, dict) and len(names) == pooler.labels:
        pooler = replace(pooler, label_names=tuple(str(names.get(str(i), f"LABEL_{i}")) for i in range(pooler.labels)))
    return pooler


def _pooler(task: str, found: PoolingSpec | None, spec: ModelSpec) -> PoolerConfig:
    pooling, normalize = ("ALL", False) if task == "reward" else ("LAST", task == "embed")
    if found is not None:
        pooling, normalize = found.pooling, found.normalize
        if found.dense:
            raise EngineConfigError("this embedding model projects its pooled states with a sentence-transformers "
                                    "Dense module, which llmctl does not run yet")
    if pooling not in ENGINE_POOLING:
        raise EngineConfigError(f"{pooling} pooling is not implemented for decoder models: llmctl pools "
                                f"{', '.join(ENGINE_POOLING)}")
    labels = (found.labels if found is not None else None) or 0
    if task == "classify" and not labels:
        raise EngineConfigError("--convert classify needs a checkpoint with a classification head (a "
                                "...ForSequenceClassification with num_labels or id2label in its config.json)")
    dimensions = found.dimensions if found is not None else ()
    return PoolerConfig(task, pooling, normalize, spec.hidden_size, dimensions, bool(found and found.matryoshka),
                        labels, step_tag_id=found.step_tag_id if found is not None else None)


def with_pooler_config(pooler: PoolerConfig, overrides: dict) -> PoolerConfig:
    """The pooler with --pooler-config's settings (vLLM's PoolerConfig keys), each checked against its task."""
    unknown = sorted(set(overrides) - set(POOLER_CONFIG_KEYS))
    if unknown:
        raise EngineConfigError(f"--pooler-config: llmctl does not apply {unknown[0]!r}; it takes "
                                f"{', '.join(POOLER_CONFIG_KEYS)}")
    token_wise = pooler.task == "reward"
    wrong_kind = "seq_pooling_type" if token_wise else "tok_pooling_type"
    if wrong_kind in overrides:
        raise EngineConfigError(f"--pooler-config: {wrong_kind} does not apply to this {pooler.task} model: use "
                                f"{'tok' if token_wise else 'seq'}_pooling_type")
    pooling = str(overrides.get("pooling_type") or overrides.get("tok_pooling_type" if token_wise else
                                                                  "seq_pooling_type") or pooler.pooling).upper()
    allowed = TOKEN_POOLING if token_wise else SEQUENCE_POOLING
    if pooling not in allowed:
        raise EngineConfigError(f"--pooler-config: a {pooler.task} model pools {', '.join(allowed)}; got {pooling}")
    step_tag_id = overrides.get("step_tag_id", pooler.step_tag_id)
    returned = overrides.get("returned_token_ids") or ()
    if pooling != "STEP" and ("step_tag_id" in overrides or returned):
        raise EngineConfigError("--pooler-config: step_tag_id and returned_token_ids apply to STEP pooling")
    if step_tag_id is not None and not _index(step_tag_id):
        raise EngineConfigError(f"--pooler-config: step_tag_id must be a token id, got {step_tag_id!r}")
    if not isinstance(returned, list | tuple) or not all(_index(i) for i in returned):
        raise EngineConfigError(f"--pooler-config: returned_token_ids must be a list of indices, got {returned!r}")
    columns = pooler.labels or pooler.hidden_size
    if any(i >= columns for i in returned):
        raise EngineConfigError(f"--pooler-config: returned_token_ids index the {columns} outputs of each row; got "
                                f"{max(returned)}")
    activation = overrides.get("use_activation", overrides.get("normalize"))
    if activation is not None and not isinstance(activation, bool):
        raise EngineConfigError(f"--pooler-config: use_activation must be true or false, got {activation!r}")
    normalize = activation if activation is not None and pooler.task == "embed" else pooler.normalize
    return replace(pooler, pooling=pooling, normalize=normalize, step_tag_id=step_tag_id if pooling == "STEP" else None,
                   returned_token_ids=tuple(returned), use_activation=activation)


def _index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def with_token_ids(pooler: PoolerConfig, tokenizer: Any) -> PoolerConfig:
    """The pooler with its classifier tokens' ids, refused when the tokenizer lacks one."""
    if not pooler.from_tokens:
        return pooler
    ids = [tokenizer.convert_tokens_to_ids(token) for token in pooler.from_tokens]
    unknown = [t for t, i in zip(pooler.from_tokens, ids) if i is None or i == tokenizer.unk_token_id]
    if unknown:
        raise EngineConfigError(f"classifier_from_token: the tokenizer has no token {unknown[0]!r}")
    return replace(pooler, token_ids=tuple(int(i) for i in ids))


def dimensions_problem(matryoshka: bool, allowed: tuple[int, ...], size: int, dimensions: object) -> str | None:
    """Why a request's `dimensions` cannot be served, in vLLM's terms; None when it can."""
    if not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions < 1:
        return f"dimensions must be a positive integer, got {dimensions!r}"
    if not matryoshka:
        return ("this model does not support Matryoshka representations (no matryoshka_dimensions or "
                "is_matryoshka in its config): cutting its embeddings would make them poor; leave dimensions out")
    if allowed and dimensions not in allowed:
        return f"this model takes dimensions {', '.join(map(str, allowed))}; got {dimensions}"
    if dimensions > size:
        return f"dimensions {dimensions} is more than this model's {size}"
    return None


def generative_spec(spec: ModelSpec) -> ModelSpec:
    """The spec with each pooling architecture named as its generative sibling (Qwen3Model → Qwen3ForCausalLM),
    so the native model of that family loads its layers."""
    names = []
    for arch in spec.architectures:
        base = next((arch.removesuffix(s) for s in POOLING_SUFFIXES if arch.endswith(s)), None)
        names.append(f"{base}ForCausalLM" if base and not arch.endswith("ForCausalLM") else arch)
    return replace(spec, architectures=tuple(names))


def _raw_config(folder: Path) -> dict:
    try:
        return json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return {}
