"""llama-server's ``-hf <user>/<model>[:quant]``: a Hugging Face repository as the model.

A repository of GGUF files gives the one whose name holds the quant (case-insensitive; Q4_K_M
by default, else the first), downloaded into the hub cache, as the reference's; one without
GGUF files (an mlx-community folder) is the model's Hugging Face id, which mlx-lm loads from
the cache or the hub when the replica starts. Nothing is downloaded for ``--dump-config`` or
with ``HF_HUB_OFFLINE=1``: the hub cache (``HF_HUB_CACHE``, ``HF_HOME``) must hold it then.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_QUANT = "Q4_K_M"
TRUTHY = ("1", "true", "on", "yes")


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in TRUTHY


def model(spec: str, download: bool, file: str | None = None) -> str:
    """The model -hf names: a GGUF file's local path (``file``, -hff, wins over the quant), or
    the repository's id."""
    repo, _, quant = spec.partition(":")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise ValueError(f"-hf {spec}: expected <user>/<model>[:quant]")
    download = download and not offline()
    if file:
        return _fetch(repo, file, download)
    ggufs = [f for f in _files(repo, download) if f.endswith(".gguf") and "mmproj" not in f]
    if not ggufs:
        if quant:
            raise ValueError(f"-hf {spec}: no GGUF file in {repo}" + (
                "" if download else " in the local hub cache (nothing is downloaded with "
                "--dump-config or HF_HUB_OFFLINE=1)"))
        return repo
    return _fetch(repo, pick(ggufs, quant or DEFAULT_QUANT), download)


def pick(names: list[str], quant: str) -> str:
    """The first file whose name holds the quant, case-insensitive; else the first file."""
    ordered = sorted(names)
    return next((n for n in ordered if quant.lower() in Path(n).name.lower()), ordered[0])


def _cache_dir() -> str | None:
    return os.environ.get("HF_HUB_CACHE") or None


def _files(repo: str, download: bool) -> list[str]:
    """The repository's files: the hub's listing when it may be asked, else the cached
    snapshot's (none when it is not cached)."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    if download:
        return list(HfApi().list_repo_files(repo))
    try:
        folder = Path(snapshot_download(repo, local_files_only=True, cache_dir=_cache_dir()))
    except LocalEntryNotFoundError:
        return []
    return [str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()]


def _fetch(repo: str, name: str, download: bool) -> str:
    from huggingface_hub import hf_hub_download

    return hf_hub_download(repo, name, local_files_only=not download, cache_dir=_cache_dir())
