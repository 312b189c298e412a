"""Probes for issue #36: the sampler chain with ``penalties`` and ``dry`` at every position
relative to ``top_k``, ``top_p`` and ``temperature`` (each order of those three, the other sampler
inserted before, between and after them), and XTC at the edges of its threshold under greedy and
sampled decoding. Chain probes draw one token with ``post_sampling_probs``: the candidates the
chain leaves are compared, not the draw."""

from __future__ import annotations

from itertools import permutations

REPEATS = ("for x in items:\n    total = total + x\n    total = total + x\n    total = total + x\n"
           "    total")
CHAIN = {"n_predict": 1, "n_probs": 12, "post_sampling_probs": True, "cache_prompt": False,
         "seed": 5, "prompt": REPEATS, "temperature": 1.3, "top_k": 20, "top_p": 0.9,
         "min_p": 0.0}
PENALTIES = {"repeat_penalty": 1.5, "presence_penalty": 0.4, "frequency_penalty": 0.3}
DRY = {"dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2}
BASE = ("top_k", "top_p", "temperature")
SHORT = {"top_k": "k", "top_p": "p", "temperature": "t", "penalties": "pen", "dry": "dry"}


def _grid(extra: str, fields: dict) -> list[dict]:
    out = []
    for order in permutations(BASE):
        for at in range(len(order) + 1):
            samplers = [*order[:at], extra, *order[at:]]
            name = "chain_grid_" + "_".join(SHORT[s] for s in samplers)
            out.append({"name": name, "method": "POST", "path": "/completion", "mode": "chain",
                        "public": True, "body": {**CHAIN, **fields, "samplers": samplers}})
    return out


def _xtc() -> list[dict]:
    out = []
    for label, threshold in (("0", 0.0), ("neg", -1.0), ("tiny", 1e-30), ("half", 0.5),
                             ("over_half", 0.51)):
        for decoding, fields in (("greedy", {"temperature": 0.0}),
                                 ("sampled", {"temperature": 1.0, "seed": 3})):
            body = {"prompt": "def main():\n", "n_predict": 4, "cache_prompt": False,
                    "xtc_probability": 1.0, "xtc_threshold": threshold, **fields}
            mode = "exact" if decoding == "greedy" else "shape"
            out.append({"name": f"xtc_edge_{label}_{decoding}", "method": "POST",
                        "path": "/completion", "mode": mode, "public": True, "body": body})
    return out


PROBES = [*_grid("penalties", PENALTIES), *_grid("dry", DRY), *_xtc()]
