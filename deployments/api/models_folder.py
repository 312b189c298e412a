"""The models of a folder, found and named as llama-server's router finds them
(common/preset.cpp ``load_from_models_dir``): a ``.gguf`` file directly in the folder is a model
named after the file less ``.gguf``; a subfolder is a model named after it when it holds a
``.gguf`` file (the first shard ``-00001-of-`` of a split one), and here also when it is an mlx-lm
folder (a ``config.json``). Projector (``mmproj``) and draft files are companions, never models.
"""

from __future__ import annotations

from pathlib import Path

DRAFT_PREFIXES = ("mtp-", "dspark-", "dflash-")  # the reference's draft_prefixes


def _companion(name: str) -> bool:
    """A projector or draft file the reference pairs with a model, never loads as one."""
    return "mmproj" in name or name.startswith(DRAFT_PREFIXES)


def _folder_model(folder: Path) -> Path | None:
    """The file or folder to load for one subfolder of the models folder, if it is a model."""
    ggufs = sorted(f for f in folder.iterdir() if f.name.endswith(".gguf") and f.is_file()
                   and not _companion(f.name))
    first_shards = [f for f in ggufs if "-00001-of-" in f.name]
    if first_shards:
        return first_shards[0]
    if ggufs:
        return ggufs[-1]  # the reference keeps the last one it lists
    return folder if (folder / "config.json").is_file() else None


def find_models(models_dir: str) -> list[tuple[str, Path]]:
    """(name, path) of every model under ``models_dir``, sorted by name."""
    root = Path(models_dir)
    if not root.is_dir():
        raise ValueError(f"error: '{models_dir}' does not exist or is not a directory")
    found: list[tuple[str, Path]] = []
    for entry in sorted(root.iterdir()):
        if entry.is_dir():
            path = _folder_model(entry)
            if path is not None:
                found.append((entry.name, path))
        elif entry.name.endswith(".gguf") and not _companion(entry.name):
            found.append((entry.name.replace(".gguf", ""), entry))
    return sorted(found)
