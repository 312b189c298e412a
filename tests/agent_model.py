"""A test model for the agent tests, built at test time: an mlx-lm Llama folder (mlx-lm's own
class, one layer, one attention head of 16 dims, so that an agent's 20,000-token first prompt
prefills in seconds) with the embedded model's tokenizer and chat template.

Its weights make it a bigram table that answers ANSWER then ends the turn (the end-of-generation
token) whatever it was asked: the attention and MLP outputs are zero (their input weights stay
mlx-lm's random ones, so the prefill costs what it costs), the residual stream is the current
token's embedding, a one-hot vector, and the output projection maps each token of the chain to
the next: the generation prompt's last token (a newline) to ANSWER's first, ANSWER's last token
and every other token to EOS. A random-weight model writes until max_tokens, which Claude Code
reports as a failed turn.

    from tests.agent_model import build_agent_model
    folder = build_agent_model(Path("/tmp/agent-model"))

or from the command line: ``python -m tests.agent_model /tmp/agent-model``.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from .zoo import TOKENIZER, TOKENIZER_FILES

ANSWER = "Hello from mlxray."
EOS = 1
HIDDEN = 64
MARGIN = 5.0  # x sqrt(HIDDEN) after the final norm: the chosen token's logit is 40, the rest 0
CONFIG = {"model_type": "llama", "hidden_size": HIDDEN, "num_hidden_layers": 1,
          "intermediate_size": 64, "num_attention_heads": 1, "num_key_value_heads": 1,
          "head_dim": 16, "rms_norm_eps": 1e-5, "vocab_size": 2000,
          "max_position_embeddings": 131072, "rope_theta": 10000.0, "tie_word_embeddings": False,
          "bos_token_id": 0, "eos_token_id": EOS}


def answer_chain() -> list[int]:
    """The generation prompt's last token, then ANSWER's tokens (each a different one)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))
    last = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False).ids[-1]
    chain = [last, *tokenizer.encode(ANSWER, add_special_tokens=False).ids]
    assert len(set(chain)) == len(chain) < HIDDEN, "a bigram chain needs distinct tokens"
    return chain


def build_agent_model(folder: Path) -> Path:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(CONFIG)
    mx.random.seed(27)
    model = model_class(args_class.from_dict(CONFIG))
    _bigram(model, answer_chain())
    mx.eval(model.parameters())
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())),
                        metadata={"format": "mlx"})
    (folder / "config.json").write_text(json.dumps(CONFIG, indent=1))
    for name in (*TOKENIZER_FILES, "tokenizer_config.json"):
        shutil.copy(TOKENIZER / name, folder / name)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": EOS}))
    return folder


def _bigram(model, chain: list[int]) -> None:
    """Token chain[i] embeds as unit vector i, every other token as the last unit vector; the
    output row of chain[i + 1] reads unit vector i, EOS's reads the chain's end and the rest."""
    import mlx.core as mx

    vocab = CONFIG["vocab_size"]
    rest = HIDDEN - 1
    slot = [rest] * vocab
    for i, token in enumerate(chain):
        slot[token] = i
    embedding = mx.zeros((vocab, HIDDEN))
    embedding[mx.arange(vocab), mx.array(slot)] = 1.0
    head = mx.zeros((vocab, HIDDEN))
    for i, token in enumerate(chain[1:]):
        head[token, i] = MARGIN
    head[EOS, len(chain) - 1] = MARGIN
    head[EOS, rest] = MARGIN
    model.model.embed_tokens.weight = embedding
    model.lm_head.weight = head
    model.model.norm.weight = mx.ones((HIDDEN,))
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight = mx.zeros_like(layer.self_attn.o_proj.weight)
        layer.mlp.down_proj.weight = mx.zeros_like(layer.mlp.down_proj.weight)


if __name__ == "__main__":
    print(build_agent_model(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/agent-model")))
