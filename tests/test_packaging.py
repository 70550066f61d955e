"""The installed package is the source tree: every Python package under llmctl/ is listed in pyproject.

setup.sh installs in editable mode, where a package missing from pyproject's explicit list still
imports; a regular `pip install .` (a wheel) would leave it out and break at import time.
"""

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_under_llmctl_is_in_the_wheel_list():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(project["tool"]["setuptools"]["packages"])
    on_disk = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "llmctl").rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert on_disk - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
