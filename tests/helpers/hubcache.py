"""Lay out tests/fixtures/hub as a Hugging Face cache, the way huggingface_hub writes one."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from helpers.paths import FIXTURES

HUB_FIXTURES = FIXTURES / "hub"


def fixture_repos() -> list[str]:
    return sorted(f"{org.name}/{repo.name}" for org in HUB_FIXTURES.iterdir() for repo in org.iterdir())


def commit_for(repo_id: str) -> str:
    return hashlib.sha1(repo_id.encode()).hexdigest()


def add_repo(cache: Path, repo_id: str, files: dict[str, bytes], *, revision: str = "main") -> Path:
    """Store files as blobs with snapshot symlinks and a ref, like huggingface_hub does."""
    repo_dir = cache / f"models--{repo_id.replace('/', '--')}"
    commit = commit_for(repo_id + revision)
    snapshot = repo_dir / "snapshots" / commit
    (repo_dir / "blobs").mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        blob = repo_dir / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        target = snapshot / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists() or target.is_symlink():
            target.unlink()
        os.symlink(os.path.relpath(blob, target.parent), target)
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / revision).write_text(commit)
    return snapshot


def build_hub_cache(cache: Path) -> Path:
    """Every fixture repo, minus its SOURCE.txt provenance note."""
    cache.mkdir(parents=True, exist_ok=True)
    for repo_id in fixture_repos():
        folder = HUB_FIXTURES / repo_id
        files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.name != "SOURCE.txt"}
        add_repo(cache, repo_id, files)
    return cache


def copy_repo_folder(repo_id: str, dest: Path) -> Path:
    shutil.copytree(HUB_FIXTURES / repo_id, dest)
    return dest
