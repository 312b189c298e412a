"""llama-server's LoRA options: ``--lora FNAME`` and ``--lora-scaled FNAME:SCALE`` (each
comma-separated and repeatable, ids in command-line order across both) and
``--lora-init-without-apply``; mlx-lm adapter folders here (``mlx_lm.lora``'s output)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

FLAGS = ("--lora", "--lora-scaled")


def _scaled(value: str) -> str | None:
    """The reference's refusal of an item that is not FNAME:SCALE."""
    for item in value.split(","):
        parts = item.split(":")
        if len(parts) != 2:
            return "lora-scaled format: FNAME:SCALE"
        try:
            float(parts[1])
        except ValueError:
            return "lora-scaled format: FNAME:SCALE"
    return None


def options(option: type) -> tuple:
    """The three options, as ``option`` (the command's Option class) describes them."""
    return (
        option(("--lora",), "lora", None, str,
               "an mlx-lm LoRA adapter folder, applied at scale 1 (comma-separated: several; "
               "DoRA and full fine-tunes become a model of their own)"),
        option(("--lora-scaled",), "lora_scaled", None, str,
               "an adapter folder with its scale: FNAME:SCALE (comma-separated: several)",
               check=_scaled),
        option(("--lora-init-without-apply",), "lora_init_without_apply", None, None,
               "load the adapters at scale 0 (apply later via POST /lora-adapters)"),
    )


def adapters(argv: Sequence[str]) -> list[dict[str, Any]]:
    """Every --lora and --lora-scaled item in command-line order: llama-server numbers the
    adapters so, whichever flag named them."""
    out: list[dict[str, Any]] = []
    args = list(argv)
    for i, arg in enumerate(args):
        flag, _, value = arg.partition("=")
        if flag not in FLAGS:
            continue
        if not _:
            value = args[i + 1] if i + 1 < len(args) else ""
        for item in value.split(","):
            path, scale = (item.rsplit(":", 1)[0], float(item.rsplit(":", 1)[1])) if (
                flag == "--lora-scaled") else (item, 1.0)
            resolved = str(Path(path).resolve()) if Path(path).is_dir() else path
            out.append({"path": resolved, "scale": scale})
    return out


def lora_fields(ns: Any, argv: Sequence[str]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    found = adapters(argv)
    if found:
        fields["adapters"] = [a if a["scale"] != 1.0 else a["path"] for a in found]
    if ns.lora_init_without_apply:
        fields["lora_init_without_apply"] = True
    return fields
