"""LLaVA-NeXT's any-resolution tiling: the grid of tower-sized tiles an image is resized into (the
pinpoint that keeps most of its pixels, wasting least), as transformers' processor chooses it."""

from __future__ import annotations


def best_resolution(height: int, width: int, pinpoints: list[list[int]]) -> tuple[int, int]:
    """The (height, width) pinpoint that keeps most of the image's pixels after a fitting resize; of those,
    the one that wastes least (transformers' select_best_resolution)."""
    best, kept_best, wasted_best = (0, 0), 0, float("inf")
    for pin_height, pin_width in pinpoints:
        scale = min(pin_width / width, pin_height / height)
        kept = min(int(width * scale) * int(height * scale), width * height)
        wasted = pin_width * pin_height - kept
        if kept > kept_best or (kept == kept_best and wasted < wasted_best):
            best, kept_best, wasted_best = (pin_height, pin_width), kept, wasted
    return best


def tile_grid(height: int, width: int, pinpoints: list[list[int]], tile: int) -> tuple[int, int]:
    """(rows, columns) of tiles for an image of this size."""
    best_height, best_width = best_resolution(height, width, pinpoints)
    return best_height // tile, best_width // tile


def tile_count(height: int, width: int, pinpoints: list[list[int]], tile: int) -> int:
    """The tiles the processor makes of the image: its grid and the base (whole-image) view."""
    rows, columns = tile_grid(height, width, pinpoints, tile)
    return rows * columns + 1
