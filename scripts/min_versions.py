"""Print the direct dependencies of llmctl pinned at their declared floors (`name==floor`), for the
minimum-versions check (scripts/min-versions.sh). torch is the exception: only the local CPU wheel
torch==2.13.0 can be installed here, so its floor is checked no lower than that."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

NOT_BELOW = {"torch": "2.13.0"}


def floors(pyproject: Path) -> list[str]:
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    pins = []
    for requirement in dependencies:
        spec, _, marker = requirement.partition(";")
        name, floor = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9.]*)\s*", spec).groups()
        pin = f"{name}=={NOT_BELOW.get(name, floor)}"
        pins.append(f"{pin}; {marker.strip()}" if marker.strip() else pin)
    return pins


if __name__ == "__main__":
    print("\n".join(floors(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("pyproject.toml"))))
