"""Multimodal RoPE (Qwen2-VL's M-RoPE): each token has a (temporal, height, width) position. Text tokens take
the same number three times, counting on; an image's placeholders take its grid's rows and columns from where
the text stopped, and the text after it goes on from the image's largest position + 1. Generated tokens keep
counting from there: position + delta, the delta fixed by the prompt (transformers' get_rope_index)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MRopePositions:
    rows: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]  # (t, h, w) of each prompt token
    delta: int  # a token past the prompt at position p has (p + delta) three times

    def at(self, position: int) -> tuple[int, int, int]:
        if position < len(self.rows[0]):
            return self.rows[0][position], self.rows[1][position], self.rows[2][position]
        shifted = position + self.delta
        return shifted, shifted, shifted


def mrope_positions(num_tokens: int, images: list[tuple[list[int], tuple[int, int, int]]],
                    merge: int) -> MRopePositions:
    """`images`: each image's placeholder positions (one run) and its (t, h, w) patch grid, in prompt order."""
    rows: list[list[int]] = [[], [], []]
    next_text = 0  # where the prompt's position counter stands
    cursor = 0  # the next token index not yet given positions
    for positions, (t, h, w) in images:
        for _ in range(cursor, positions[0]):  # the text before this image
            for row in rows:
                row.append(next_text)
            next_text += 1
        height, width = h // merge, w // merge
        for frame in range(t):
            for y in range(height):
                for x in range(width):
                    rows[0].append(next_text + frame)
                    rows[1].append(next_text + y)
                    rows[2].append(next_text + x)
        next_text += max(height, width)
        cursor = positions[-1] + 1
    for _ in range(cursor, num_tokens):
        for row in rows:
            row.append(next_text)
        next_text += 1
    return MRopePositions((tuple(rows[0]), tuple(rows[1]), tuple(rows[2])), next_text - num_tokens)
