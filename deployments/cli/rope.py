"""llama-server's RoPE options onto the model's config (GraphArgs ``config_overrides``, what
mlx_lm.load lays over config.json): ``--rope-freq-base`` is ``rope_theta``; ``--rope-scaling``,
``--rope-scale`` / ``--rope-freq-scale`` (one factor, the last given winning) and
``--yarn-orig-ctx``, ``--yarn-beta-fast``, ``--yarn-beta-slow`` are the ``rope_scaling`` object,
over the model's own.
``--yarn-ext-factor`` and ``--yarn-attn-factor`` are refused: MLX's YaRN has neither knob."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCALE_FLAGS = ("--rope-scale", "--rope-freq-scale")
KINDS = ("none", "linear", "yarn")


def _kind(value: str) -> str | None:
    return None if value in KINDS else "invalid value"


def options(option: type) -> tuple:
    o = option
    return (
        o(("--rope-scaling",), "rope_scaling", "LLAMA_ARG_ROPE_SCALING_TYPE", str,
          "{none,linear,yarn}: the model config's rope_scaling type (linear unless the model "
          "names one)", check=_kind),
        o(("--rope-scale",), "rope_scale", "LLAMA_ARG_ROPE_SCALE", float,
          "RoPE context scaling factor N (rope_scaling factor N)"),
        o(("--rope-freq-base",), "rope_freq_base", "LLAMA_ARG_ROPE_FREQ_BASE", float,
          "RoPE base frequency (the model config's rope_theta)"),
        o(("--rope-freq-scale",), "rope_freq_scale", "LLAMA_ARG_ROPE_FREQ_SCALE", float,
          "RoPE frequency scaling factor N (rope_scaling factor 1/N)"),
        o(("--yarn-orig-ctx",), "yarn_orig_ctx", "LLAMA_ARG_YARN_ORIG_CTX", int,
          "YaRN: the model's original context (original_max_position_embeddings)"),
        o(("--yarn-beta-slow",), "yarn_beta_slow", "LLAMA_ARG_YARN_BETA_SLOW", float,
          "YaRN: beta_slow"),
        o(("--yarn-beta-fast",), "yarn_beta_fast", "LLAMA_ARG_YARN_BETA_FAST", float,
          "YaRN: beta_fast"),
    )


def model_config(ns: Any, model_path: str) -> dict[str, Any]:
    """The config.json keys the options set, over the model's own values."""
    out: dict[str, Any] = {}
    if ns.rope_freq_base:  # 0: the model's, as the reference
        out["rope_theta"] = ns.rope_freq_base
    factor = _factor(ns)
    yarn = {k: v for k, v in (("original_max_position_embeddings", ns.yarn_orig_ctx),
                              ("beta_slow", ns.yarn_beta_slow),
                              ("beta_fast", ns.yarn_beta_fast)) if v}
    if ns.rope_scaling is None and factor is None and not yarn:
        return out
    own = _own_scaling(model_path)
    kind = ns.rope_scaling or own.get("type") or own.get("rope_type") or "linear"
    if kind == "none":
        out["rope_scaling"] = None
        return out
    base = {k: v for k, v in own.items() if k not in ("type", "rope_type")}
    if (own.get("type") or own.get("rope_type")) != kind:
        base = {}
    scaling = {**base, "type": kind, "factor": factor or base.get("factor", 1.0)}
    if kind == "yarn":
        scaling.update(yarn)
    elif yarn:
        raise ValueError(f"--yarn-* options need YaRN scaling (--rope-scaling yarn), not {kind}")
    out["rope_scaling"] = scaling
    return out


def _factor(ns: Any) -> float | None:
    given = [a.split("=", 1)[0] for a in ns.argv if a.split("=", 1)[0] in SCALE_FLAGS]
    last = given[-1] if given else ("--rope-freq-scale" if ns.rope_freq_scale else
                                    "--rope-scale" if ns.rope_scale else None)
    if last == "--rope-scale" and ns.rope_scale:
        return ns.rope_scale
    if last == "--rope-freq-scale" and ns.rope_freq_scale:
        return 1.0 / ns.rope_freq_scale
    return None


def _own_scaling(model_path: str) -> dict[str, Any]:
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return dict(config.get("rope_scaling") or {})
