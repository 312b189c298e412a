"""A model zoo for the tests: small random-weight folders of mlx-lm's own model classes, built at
test time with the embedded model's tokenizer (models/tiny-python), never committed.

Each family is one architecture with the cache type people meet in it (KVCache, RotatingKVCache,
attention sinks, ArraysCache, hybrids) plus 4- and 8-bit conversions, and a Jinja chat template
written in that family's style (think and tool tags where it has them). ``build_zoo(folder)``
writes the folders in a few seconds; the session fixture ``zoo`` (registered in conftest.py)
builds them once per test session. ``reference_ids`` is mlx-lm's own greedy generation, the
oracle the served ids are compared with.

    from tests.zoo import build_zoo
    folders = build_zoo(Path("/tmp/zoo"))        # {"llama": Path(...), "gemma3_text": ...}
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

TOKENIZER = Path(__file__).resolve().parent.parent / "models" / "tiny-python"
TOKENIZER_FILES = ("tokenizer.json", "special_tokens_map.json")
VOCAB = 2000
SEED = 7
MUTED = [0, 1, *range(96, 190), *range(224, 258)]  # BOS, EOS, tiny-python's 128 lone bytes

# ---- chat templates in each family's style (written for the tests, not copied) ---------------
_ARGUMENTS = ("{{ call.function.arguments if call.function.arguments is string "
              "else call.function.arguments | tojson }}")
_TOOL_JSON = '{"name": "{{ call.function.name }}", "arguments": ' + _ARGUMENTS + "}"

CHATML_THINK = (  # Qwen3: ChatML, <think> blocks, <tool_call>/<tool_response>
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n"
    "{% elif m.role == 'assistant' %}<|im_start|>assistant\n"
    "{% if m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}"
    "{{ m.content }}"
    "{% for call in m.tool_calls or [] %}{{ '\\n' }}<tool_call>\n" + _TOOL_JSON + "\n</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)

LLAMA3 = (  # Llama 3.1: header ids, <|eot_id|>, JSON tool calls and ipython results
    "{% for m in messages %}<|start_header_id|>"
    "{{ 'ipython' if m.role == 'tool' else m.role }}<|end_header_id|>\n\n"
    "{% if m.tool_calls %}{% for call in m.tool_calls %}" + _TOOL_JSON + "{% endfor %}"
    "{% else %}{{ m.content }}{% endif %}<|eot_id|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)

GEMMA3 = (  # Gemma 3: <start_of_turn>, the model role, the system prompt folded into the user turn
    "{% set system = messages[0].content + '\n\n' if messages[0].role == 'system' else '' %}"
    "{% for m in messages if m.role != 'system' %}<start_of_turn>"
    "{{ 'model' if m.role == 'assistant' else 'user' }}\n"
    "{{ system if loop.first else '' }}{{ m.content }}<end_of_turn>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

HARMONY = (  # gpt-oss: channels, analysis for reasoning, commentary for tool calls
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}<|start|>functions.{{ m.name }} to=assistant<|channel|>commentary"
    "<|message|>{{ m.content }}<|end|>"
    "{% elif m.role == 'assistant' %}"
    "{% if m.reasoning_content %}<|start|>assistant<|channel|>analysis<|message|>"
    "{{ m.reasoning_content }}<|end|>{% endif %}"
    "{% for call in m.tool_calls or [] %}<|start|>assistant to=functions.{{ call.function.name }}"
    "<|channel|>commentary json<|message|>" + _ARGUMENTS + "<|call|>"
    "{% endfor %}"
    "{% if m.content %}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>"
    "{% endif %}"
    "{% else %}<|start|>{{ 'developer' if m.role == 'system' else m.role }}<|message|>"
    "{{ m.content }}<|end|>{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)

MISTRAL = (  # Mamba-Codestral / Mistral: [INST], [TOOL_CALLS], [TOOL_RESULTS]
    "{% for m in messages %}"
    "{% if m.role == 'user' or m.role == 'system' %}[INST] {{ m.content }} [/INST]"
    "{% elif m.role == 'tool' %}[TOOL_RESULTS] {{ m.content }} [/TOOL_RESULTS]"
    "{% elif m.tool_calls %}[TOOL_CALLS] [{% for call in m.tool_calls %}" + _TOOL_JSON
    + "{% endfor %}]</s>"
    "{% else %}{{ m.content }}</s>{% endif %}"
    "{% endfor %}"
)


@dataclass(frozen=True)
class Family:
    """One zoo folder: an mlx-lm architecture's config (over tiny-python's vocabulary), its chat
    template, and an optional quantization (bits) of its weights."""

    name: str
    config: dict
    template: str
    bits: int | None = None
    thinks: bool = False  # the template has think tags (enable_thinking)
    tools: bool = True  # the template renders tool calls and results

    @property
    def model_type(self) -> str:
        return self.config["model_type"]


def _attention(**extra) -> dict:
    base = {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "rms_norm_eps": 1e-5, "vocab_size": VOCAB, "max_position_embeddings": 2048,
            "rope_theta": 10000.0, "tie_word_embeddings": False}
    return {**base, **extra}


LLAMA = _attention(model_type="llama")
QWEN3 = _attention(model_type="qwen3")
# one sliding-window layer then one global one; the window (16) is smaller than prompt + answer
GEMMA3_TEXT = _attention(model_type="gemma3_text", sliding_window=16, sliding_window_pattern=2,
                         query_pre_attn_scalar=16, rope_local_base_freq=10000.0)
GPT_OSS = _attention(model_type="gpt_oss", num_local_experts=4, num_experts_per_tok=2,
                     sliding_window=16, layer_types=["sliding_attention", "full_attention"],
                     intermediate_size=64, rope_theta=150000)
QWEN3_NEXT = _attention(  # a gated-delta (linear) layer, then a full-attention one; MoE MLPs
    model_type="qwen3_next", linear_num_value_heads=4, linear_num_key_heads=2,
    linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=4,
    num_experts_per_tok=2, decoder_sparse_step=1, shared_expert_intermediate_size=64,
    mlp_only_layers=[], moe_intermediate_size=64, partial_rotary_factor=0.25,
    full_attention_interval=2)
MAMBA2 = {"model_type": "mamba2", "num_heads": 4, "head_dim": 16, "vocab_size": VOCAB,
          "hidden_size": 64, "intermediate_size": 64, "state_size": 16, "num_hidden_layers": 2,
          "layer_norm_epsilon": 1e-5, "conv_kernel": 4, "n_groups": 1, "use_bias": False,
          "use_conv_bias": True, "tie_word_embeddings": True, "time_step_limit": [0.0, 1e9],
          "time_step_rank": "auto", "expand": 1, "max_position_embeddings": 2048}

FAMILIES = (
    Family("llama", LLAMA, LLAMA3),
    Family("qwen3", QWEN3, CHATML_THINK, thinks=True),
    Family("gemma3_text", GEMMA3_TEXT, GEMMA3, tools=False),
    Family("gpt_oss", GPT_OSS, HARMONY, thinks=True),
    Family("qwen3_next", QWEN3_NEXT, CHATML_THINK, thinks=True),
    Family("mamba2", MAMBA2, MISTRAL),
    Family("qwen3-4bit", QWEN3, CHATML_THINK, bits=4, thinks=True),
    Family("gemma3_text-8bit", GEMMA3_TEXT, GEMMA3, bits=8, tools=False),
)
BY_NAME = {f.name: f for f in FAMILIES}


def build_family(family: Family, folder: Path) -> Path:
    """Write one model folder: config.json, model.safetensors (seeded random weights, the
    conversion's own layout when quantized), the tokenizer and the family's chat template."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes, quantize_model

    config = {**family.config, "bos_token_id": 0, "eos_token_id": 1}
    model_class, args_class = _get_classes(config)
    mx.random.seed(SEED)
    model = model_class(args_class.from_dict(config))
    _sharpen(model)
    _mute(model)
    if family.bits is not None:
        model, config = quantize_model(model, config, group_size=32, bits=family.bits)
    mx.eval(model.parameters())
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())),
                        metadata={"format": "mlx"})
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    for name in TOKENIZER_FILES:
        shutil.copy(TOKENIZER / name, folder / name)
    tokenizer_config = json.loads((TOKENIZER / "tokenizer_config.json").read_text())
    tokenizer_config["chat_template"] = family.template
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 1}))
    return folder


def _sharpen(model) -> None:
    """mlx-lm's initial weights make tiny models repeat one or two tokens whatever the context;
    three times larger matrices make the next token depend on it (a wrong cache shows), and
    attention sinks, zero at init, get values so they weigh in."""
    import mlx.core as mx
    from mlx.utils import tree_map_with_path

    def sharpen(path: str, p: mx.array) -> mx.array:
        if path.endswith("sinks"):
            return mx.random.normal(p.shape)
        return p * 3 if p.ndim >= 2 else p

    model.update(tree_map_with_path(sharpen, model.parameters()))


def _mute(model) -> None:
    """Zero the output rows of BOS, EOS and the 128 lone-byte tokens (0x80-0xFF): their logit
    stays 0, far below the largest, so the served text is valid UTF-8 (the reference fails a
    request on an invalid sequence) and every generation runs to n_predict."""
    import mlx.core as mx
    import mlx.nn as nn

    head = getattr(model, "lm_head", None) if "lm_head" in model else None
    if head is None:  # tied: the embedding is the output projection
        head = next(m for _, m in model.named_modules() if isinstance(m, nn.Embedding))
    keep = mx.ones((head.weight.shape[0], 1), head.weight.dtype)
    keep[mx.array(MUTED)] = 0
    head.weight = head.weight * keep


def build_zoo(root: Path, names: tuple[str, ...] | None = None) -> dict[str, Path]:
    return {f.name: build_family(f, root / f.name) for f in FAMILIES
            if names is None or f.name in names}


def reference_ids(folder: Path, prompt: list[int], n: int) -> list[int]:
    """mlx-lm's own greedy generation of ``n`` tokens (ignoring end of generation)."""
    from mlx_lm.utils import load

    from .conftest import mlx_lm_ids

    model, _ = _load_cached(str(folder), load)
    return mlx_lm_ids(model, prompt, n)


_LOADED: dict[str, tuple] = {}


def _load_cached(path: str, load) -> tuple:
    if path not in _LOADED:
        _LOADED[path] = load(path)
    return _LOADED[path]


@pytest.fixture(scope="session")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """Every zoo folder, built once per session (a few MB in all, in the session's tmp dir)."""
    yield build_zoo(tmp_path_factory.mktemp("zoo"))
