"""N-gram prompt lookup: propose the tokens that followed the last time the context's
suffix appeared (vLLM's `ngram` method; "prompt lookup decoding").

The longest suffix of `prompt_lookup_max` down to `prompt_lookup_min` tokens that occurs
earlier in prompt + output wins; of its occurrences the earliest is used; up to k of the
tokens after it are proposed. Nothing is proposed when no suffix recurs.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def propose_ngram(tokens: list[int] | np.ndarray, min_n: int, max_n: int, k: int) -> list[int]:
    """Up to k proposed tokens for the context `tokens` (prompt + output so far)."""
    context = np.asarray(tokens, dtype=np.int64)
    length = len(context)
    if k <= 0:
        return []
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        # Windows that start early enough to have at least one token after them, before the suffix itself.
        windows = sliding_window_view(context[:length - 1], n)
        hits = np.flatnonzero((windows == context[length - n:]).all(axis=1))
        if hits.size:
            start = int(hits[0]) + n
            return context[start:start + k].tolist()
    return []
