"""The suite on two workers (pytest-xdist; `-n 2 --dist loadfile` in pyproject.toml's addopts).

A module runs whole on one worker, so its module-scoped engines and servers are built once. Workers take
modules in collection order, so the costly ones go first: a slow module picked up last would leave the other
worker idle while it runs. Within a module, and among modules of one cost, the order stays as collected."""

from __future__ import annotations

import pytest

COSTLIEST_FIRST = ("slow", "subprocess")  # markers, in order of what a module costs


def module_cost(item: pytest.Item) -> int:
    for rank, marker in enumerate(COSTLIEST_FIRST):
        if item.get_closest_marker(marker) is not None:
            return rank
    return len(COSTLIEST_FIRST)


def costliest_modules_first(items: list[pytest.Item]) -> None:
    """Reorder items in place: whole modules, the costliest first."""
    first_seen: dict[str, int] = {}
    cost: dict[str, int] = {}
    for index, item in enumerate(items):
        module = item.nodeid.split("::", 1)[0]
        first_seen.setdefault(module, index)
        cost[module] = min(cost.get(module, len(COSTLIEST_FIRST)), module_cost(item))
    items.sort(key=lambda item: (cost[m := item.nodeid.split("::", 1)[0]], first_seen[m]))
