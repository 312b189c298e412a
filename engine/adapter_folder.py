"""An mlx-lm adapter folder (what ``mlx_lm.lora`` writes): ``adapter_config.json`` and
``adapters.safetensors``. Reading its kind needs no MLX, so configs are checked anywhere."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapters.safetensors"
KINDS = ("lora", "dora", "full")
BASE_KEY = "model"  # the prefix cache's key of sequences without adapters


class AdapterError(ValueError):
    """An adapter folder that cannot be served (missing, malformed, or not for this model)."""


def adapter_config(path: str | Path) -> dict[str, Any]:
    """The folder's adapter_config.json, checked to be one mlx-lm writes."""
    folder = Path(path)
    try:
        config = json.loads((folder / CONFIG_FILE).read_text())
    except OSError:
        raise AdapterError(f"not an mlx-lm adapter folder (no {CONFIG_FILE}): {path}") from None
    except ValueError as exc:
        raise AdapterError(f"{folder / CONFIG_FILE}: {exc}") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{folder / CONFIG_FILE}: not a JSON object")
    if not (folder / WEIGHTS_FILE).is_file():
        raise AdapterError(f"not an mlx-lm adapter folder (no {WEIGHTS_FILE}): {path}")
    if config.get("fine_tune_type", "lora") not in KINDS:
        raise AdapterError(f"{folder / CONFIG_FILE}: unknown fine_tune_type "
                           f"{config['fine_tune_type']!r}")
    return config


def adapter_kind(path: str | Path) -> str:
    """``lora`` (served per request, mixed in a batch), ``dora`` or ``full`` (fused)."""
    return adapter_config(path).get("fine_tune_type", "lora")
