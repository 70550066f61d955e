"""`--speculative-config`: vLLM's JSON keys, checked once at startup."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from llmctl.engine.errors import SpeculativeConfigError
from llmctl.kernels.limits import SHORT_QUERY_LIMIT

METHODS = ("ngram", "draft_model", "eagle", "eagle3", "mtp")
KNOWN_KEYS = {"method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "model",
              "disable_by_batch_size"}
MAX_SPECULATIVE_TOKENS = SHORT_QUERY_LIMIT  # verification chunks stay on the C++ CPU attention kernel everywhere


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str  # "ngram", "draft_model", "eagle", "eagle3" or "mtp"
    num_speculative_tokens: int
    prompt_lookup_max: int = 0  # n-gram: longest suffix matched
    prompt_lookup_min: int = 0  # n-gram: shortest suffix matched
    model: str | None = None  # draft model (same tokenizer as the target)
    # No proposals while this many sequences or more are running: verifying k + 1 tokens per
    # sequence costs about k + 1 times as much once the batch makes the GEMMs compute-bound.
    disable_by_batch_size: int | None = None

    def describe(self) -> str:
        if self.method == "ngram":
            what = (f"n-gram prompt lookup, up to {self.num_speculative_tokens} tokens per step "
                    f"(suffixes of {self.prompt_lookup_min}–{self.prompt_lookup_max} tokens)")
        elif self.method == "mtp":
            what = f"the checkpoint's multi-token-prediction layer, {self.num_speculative_tokens} chained tokens per step"
        elif self.method in ("eagle", "eagle3"):
            what = f"{'EAGLE-3' if self.method == 'eagle3' else 'EAGLE'} head {self.model}, " \
                   f"{self.num_speculative_tokens} chained tokens per step"
        else:
            what = f"draft model {self.model}, {self.num_speculative_tokens} tokens per step"
        if self.disable_by_batch_size is not None:
            what += f", off while {self.disable_by_batch_size}+ sequences run"
        return what


def parse_speculative_config(value: str | dict[str, Any] | SpeculativeConfig | None) -> SpeculativeConfig | None:
    """A JSON string or dict (vLLM's keys) → SpeculativeConfig; None or {} means off.

    As in vLLM: `method` is "draft_model" when a `model` is given, "ngram" with `"method": "ngram"`
    (or the older `"model": "[ngram]"`); an n-gram bound that is not given equals the other,
    and with neither both are 5."""
    if value is None or isinstance(value, SpeculativeConfig):
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise SpeculativeConfigError(
                f"--speculative-config is not valid JSON ({exc.msg}); e.g. "
                '\'{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}\'') from None
    if not isinstance(value, dict):
        raise SpeculativeConfigError("--speculative-config must be a JSON object of vLLM's keys")
    if not value:
        return None
    unknown = sorted(set(value) - KNOWN_KEYS)
    if unknown:
        raise SpeculativeConfigError(f"--speculative-config: unknown key(s) {', '.join(unknown)}; "
                                     f"llmctl reads {', '.join(sorted(KNOWN_KEYS))}")
    method, model = _method(value)
    k = _integer(value, "num_speculative_tokens", None)
    if k is None:
        raise SpeculativeConfigError("--speculative-config needs num_speculative_tokens (e.g. 4)")
    if not 1 <= k <= MAX_SPECULATIVE_TOKENS:
        raise SpeculativeConfigError(
            f"--speculative-config: num_speculative_tokens must be between 1 and {MAX_SPECULATIVE_TOKENS}, got {k}")
    disable_by = _integer(value, "disable_by_batch_size", None)
    if disable_by is not None and disable_by < 1:
        raise SpeculativeConfigError(f"--speculative-config: disable_by_batch_size must be at least 1, got {disable_by}")
    if method in ("draft_model", "eagle", "eagle3"):
        if not isinstance(model, str) or not model:
            raise SpeculativeConfigError(f'--speculative-config: method {method} needs "model": a hub id or folder')
        return SpeculativeConfig(method, k, model=model, disable_by_batch_size=disable_by)
    if method == "mtp":  # the layers ship in the target's checkpoint
        return SpeculativeConfig(method, k, disable_by_batch_size=disable_by)
    return _ngram(value, k, disable_by)


def _method(value: dict[str, Any]) -> tuple[str, Any]:
    """(the method, by vLLM's names and defaults; the "model" key's value)."""
    model = value.get("model")
    if model in ("[ngram]", "ngram"):
        return "ngram", None
    method = value.get("method") or ("draft_model" if model else None)
    if method is None:
        raise SpeculativeConfigError('--speculative-config needs "method": "ngram", or a draft "model"')
    method = {"draft": "draft_model", "deepseek_mtp": "mtp"}.get(method, method)  # vLLM's older names
    if method not in METHODS:
        raise SpeculativeConfigError(f"--speculative-config: method {method!r} is not supported; use ngram, "
                                     "draft_model (a \"model\" of the same tokenizer), eagle or eagle3 (an EAGLE head) or mtp")
    return method, model


def _ngram(value: dict[str, Any], k: int, disable_by: int | None) -> SpeculativeConfig:
    low, high = _integer(value, "prompt_lookup_min", None), _integer(value, "prompt_lookup_max", None)
    if low is None and high is None:
        low = high = 5
    low = low if low is not None else high
    high = high if high is not None else low
    if not 1 <= low <= high:
        raise SpeculativeConfigError(f"--speculative-config: need 1 ≤ prompt_lookup_min ≤ prompt_lookup_max, got "
                                     f"{low} and {high}")
    return SpeculativeConfig("ngram", k, prompt_lookup_max=high, prompt_lookup_min=low,
                             disable_by_batch_size=disable_by)


def _integer(value: dict[str, Any], key: str, default: int | None) -> int | None:
    got = value.get(key, default)
    if got is None:
        return None
    if isinstance(got, bool) or not isinstance(got, int):
        raise SpeculativeConfigError(f"--speculative-config: {key} must be an integer, got {got!r}")
    return got
