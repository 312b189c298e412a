"""GGUF files loaded directly (engine/gguf): the reference file equals its HF folder, each family's
quirks are undone (logits equal to the same model's HF folder), every block type loads as gguf-py
dequantizes it, and what cannot be loaded right is refused by name. No Ray: the served file is
tests/serve/test_gguf_served.py."""

from __future__ import annotations

import inspect
import io
import json

import gguf
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants as gguf_quants

from engine.gguf.reader import GGUFError, GGUFFile, ftype_name
from engine.model import load_model
from engine.vocab import gguf_vocab, load_vocab

from ..conftest import MODEL
from ..gguf_files import (
    FAMILIES,
    REFERENCE_GGUF,
    copy_tokenizer,
    hf_folder,
    hf_tensors,
    random_blocks,
    write_gguf,
)

TEXTS = ["def main():\n    return 1\n", "import os\n\nclass  X:  pass  \t\n", "",
         "<s>hello</s> wörld 12345 ...", "  \n\n  x", "x = {'a': [1, 2.5e-3]}  # ü 漢字 🙂"]


PROMPT = "def main():\n    x = [1, 2, 3]\n    return x\n"


def logits(loaded, ids: list[int] | None = None) -> mx.array:
    return loaded.model(mx.array([ids or loaded.vocab.tokenize(PROMPT, True)]))


@pytest.fixture(scope="module")
def reference():
    return load_model(str(REFERENCE_GGUF)), load_model(MODEL)


def test_reference_file_is_the_hf_folder(reference):
    """The shipped GGUF (same weights as models/tiny-python): bit-identical logits, the same
    tokens, pieces, specials, end-of-generation set and chat template, and llama-server's
    figures for the file."""
    gguf_model, hf_model = reference
    assert mx.array_equal(logits(gguf_model), logits(hf_model))
    g, h = gguf_model.vocab, hf_model.vocab
    for text in TEXTS:
        for special in (True, False):
            assert g.tokenize(text, True, special) == h.tokenize(text, True, special), text
    assert (g.pieces, g.special_pieces, g.eog_ids, g.bos_id, g.add_bos) == (
        h.pieces, h.special_pieces, h.eog_ids, h.bos_id, h.add_bos)
    assert gguf_model.chat_template == hf_model.chat_template
    assert (gguf_model.n_params, gguf_model.size_bytes, gguf_model.ftype,
            gguf_model.n_ctx_train, gguf_model.n_embd) == (807552, 3230208, "all F32", 2048, 128)
    # the ingress reads the same tokenizer without the model
    assert load_vocab(str(REFERENCE_GGUF)).tokenize(TEXTS[0], True) == g.tokenize(TEXTS[0], True)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_equals_its_hf_folder(family, tmp_path):
    """A GGUF file written from an HF folder as llama.cpp's converter lays it out (llama's Q/K
    permutation, Gemma's 1 + w norms, Llama 3's rope factors, Phi-3's fused Q/K/V and long-rope
    factors) loads as the folder's model: the same logits."""
    folder = hf_folder(tmp_path / family, FAMILIES[family])
    config, tensors = hf_tensors(folder)
    from_gguf = load_model(str(write_gguf(tmp_path / f"{family}.gguf", config, tensors)))
    from_hf = load_model(str(folder))
    # the same ids for both (transformers gives a qwen2 folder Qwen2's own pre-tokenizer)
    ids = from_hf.vocab.tokenize(PROMPT, True)
    a, b = logits(from_gguf, ids), logits(from_hf, ids)
    if family == "llama3":  # rope_freqs are stored factors: float32 rounding of the periods
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=0, atol=2e-5)
    else:
        assert mx.array_equal(a, b)


# one tensor of each type in a llama file whose rows are long enough for K-quants
BLOCK_TYPES = {
    "token_embd.weight": Q.Q5_K, "output.weight": Q.Q6_K,
    "blk.0.attn_q.weight": Q.Q4_K, "blk.0.attn_k.weight": Q.Q5_K, "blk.0.attn_v.weight": Q.Q4_0,
    "blk.0.attn_output.weight": Q.Q4_1, "blk.0.ffn_gate.weight": Q.Q5_0,
    "blk.0.ffn_up.weight": Q.Q5_1, "blk.0.ffn_down.weight": Q.Q8_0,
    "blk.1.attn_q.weight": Q.Q6_K, "blk.1.attn_k.weight": Q.Q3_K, "blk.1.attn_v.weight": Q.Q2_K,
    "blk.1.attn_output.weight": Q.BF16, "blk.1.ffn_gate.weight": Q.F16,
    "blk.1.ffn_up.weight": Q.Q4_K, "blk.1.ffn_down.weight": Q.Q5_K,
}
REPACKED = {Q.Q4_0: 4, Q.Q4_1: 4, Q.Q5_0: 5, Q.Q5_1: 5, Q.Q8_0: 8, Q.Q4_K: 4, Q.Q5_K: 5}
BIG = {**FAMILIES["llama3"], "hidden_size": 256, "intermediate_size": 512, "head_dim": 64,
       "rope_scaling": None}


def block_tensors(rng: np.random.Generator) -> dict:
    """Random tensors of BLOCK_TYPES: raw blocks for block types, values for float ones."""
    shapes = {"token_embd": (2000, 256), "output": (2000, 256), "attn_q": (256, 256),
              "attn_k": (128, 256), "attn_v": (128, 256), "attn_output": (256, 256),
              "ffn_gate": (512, 256), "ffn_up": (512, 256), "ffn_down": (256, 512)}
    out: dict = {f"blk.{i}.{n}.weight": (1 + 0.1 * rng.standard_normal(256)).astype(np.float32)
                 for i in range(2) for n in ("attn_norm", "ffn_norm")}
    out["output_norm.weight"] = np.ones(256, np.float32)
    for name, qtype in BLOCK_TYPES.items():
        shape = shapes[name.split(".")[-2]]
        values = (0.05 * rng.standard_normal(shape)).astype(np.float32)
        if qtype == Q.F16:
            out[name] = values.astype(np.float16)
        elif qtype == Q.BF16:
            out[name] = ((values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8), qtype)
        else:
            out[name] = (random_blocks(qtype, *shape, rng), qtype)
    return out


def dequantized(value) -> np.ndarray:
    if not isinstance(value, tuple):
        return value.astype(np.float32)
    raw, qtype = value
    return gguf_quants.dequantize(raw, qtype).astype(np.float32)


@pytest.fixture(scope="module")
def block_files(tmp_path_factory):
    """The same weights twice: as blocks of every type, and as gguf-py's float32
    dequantization of those blocks."""
    tmp = tmp_path_factory.mktemp("blocks")
    tensors = block_tensors(np.random.default_rng(7))
    blocks = write_gguf(tmp / "blocks.gguf", BIG, tensors,
                        file_type=gguf.LlamaFileType.MOSTLY_Q4_K_M)
    floats = write_gguf(tmp / "floats.gguf", BIG, {k: dequantized(v) for k, v in tensors.items()})
    return tensors, load_model(str(blocks)), load_model(str(floats))


def test_block_types_load_as_gguf_py_dequantizes(block_files):
    """Q4_K and Q5_K (packed here with numpy), Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 become MLX affine
    weights (group 32, float32 scales) equal to gguf-py's dequantization; Q6_K, Q3_K and Q2_K are
    gguf-py's float32 values; BF16 and F16 stay as they are; Q and K rows are un-permuted."""
    tensors, loaded, _ = block_files
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
    modules = dict(loaded.model.named_modules())
    for param, value in dict(_flat(loaded.model.parameters())).items():
        gguf_name = names.get_name(param, try_suffixes=(".weight", ".bias"))
        if gguf_name is None or not param.endswith(".weight"):
            continue
        expected = dequantized(tensors[gguf_name])
        if ".q_proj." in param:
            expected = permute_back(expected, 4)
        if ".k_proj." in param:
            expected = permute_back(expected, 2)
        qtype = BLOCK_TYPES.get(gguf_name, Q.F32)
        module = modules[param.removesuffix(".weight")]
        if qtype in REPACKED:
            assert isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)), param
            assert (module.bits, module.group_size, module.scales.dtype) == (
                REPACKED[qtype], 32, mx.float32), param
            value = mx.dequantize(module.weight, module.scales, module.biases, group_size=32,
                                  bits=module.bits)
        else:
            assert not hasattr(module, "scales"), param
            want = {Q.F16: mx.float16, Q.BF16: mx.bfloat16}.get(qtype, mx.float32)
            assert value.dtype == want, param
        assert np.array_equal(np.array(value.astype(mx.float32)), expected), (param, qtype)
    assert loaded.ftype == "Q4_K - Medium"


def test_quantized_file_computes_its_dequantized_weights(block_files):
    """llama.cpp's CPU path quantizes activations, so a quantized file is checked against its
    own dequantized weights: the float32 file of the same values gives the same logits."""
    _, blocks, floats = block_files
    np.testing.assert_allclose(np.array(logits(blocks)), np.array(logits(floats)),
                               rtol=1e-4, atol=1e-4)


def permute_back(rows: np.ndarray, heads: int) -> np.ndarray:
    shape = rows.shape
    return rows.reshape(heads, shape[0] // heads // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(
        shape)


def _flat(tree, prefix=""):
    from mlx.utils import tree_flatten

    return tree_flatten(tree, prefix)


def small_llama(tmp_path, name="x.gguf", drop=(), **extra):
    folder = hf_folder(tmp_path / "hf", FAMILIES["qwen3"] | {"model_type": "llama",
                                                             "head_dim": 16})
    config, tensors = hf_tensors(folder)
    return config, {k: v for k, v in tensors.items() if k not in drop}, tmp_path / name


def test_unloadable_tensor_types_are_refused_by_name(tmp_path):
    """Every tensor's type is checked before anything loads: each one that cannot be loaded
    exactly or dequantized is named with its type, all in one error."""
    config, tensors, path = small_llama(tmp_path)
    rows, cols = tensors["blk.0.attn_q.weight"].shape
    tensors["blk.0.attn_q.weight"] = (np.zeros((rows, cols // 256 * 292), np.uint8), Q.Q8_K)
    tensors["blk.1.attn_v.weight"] = tensors["blk.1.attn_v.weight"].astype(np.int32)
    write_gguf(path, config, tensors)
    with pytest.raises(GGUFError) as refused:
        load_model(str(path))
    message = str(refused.value)
    assert "2 tensor(s)" in message
    assert "blk.0.attn_q.weight (Q8_K)" in message and "blk.1.attn_v.weight (I32)" in message


def test_missing_and_unplaced_tensors_are_refused_by_name(tmp_path):
    config, tensors, path = small_llama(tmp_path, drop=("blk.1.ffn_up.weight",))
    write_gguf(path, config, tensors)
    with pytest.raises(GGUFError, match=r"model.layers.1.mlp.up_proj.weight "
                                        r"\(blk.1.ffn_up.weight\)"):
        load_model(str(path))
    config, tensors, path = small_llama(tmp_path, "extra.gguf")
    tensors["blk.0.attn_q_norm.weight"] = np.ones(16, np.float32)
    write_gguf(path, config, tensors)
    with pytest.raises(GGUFError, match="no place for .*: blk.0.attn_q_norm.weight"):
        load_model(str(path))


def test_unknown_architecture_and_pre_tokenizer_are_refused_by_name(tmp_path):
    config, tensors, path = small_llama(tmp_path)
    write_gguf(path, config, tensors, **{"general.architecture": ("mamba9", gguf.GGUFValueType
                                                                   .STRING)})
    with pytest.raises(GGUFError, match="architecture 'mamba9' is not supported"):
        load_model(str(path))
    other = tmp_path / "pre.gguf"
    w = gguf.GGUFWriter(other, "llama")
    copy_tokenizer(w, **{"tokenizer.ggml.pre": "made-up-bpe"})
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFError, match="unknown pre-tokenizer 'made-up-bpe'"):
        load_vocab(str(other))


def spm_fixture(tmp_path):
    """A SentencePiece BPE model trained here on Python source, and its vocabulary written
    as llama.cpp's converter writes one (pieces, scores, token types)."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    lines = [line for line in (inspect.getsource(json) + inspect.getsource(inspect)).splitlines()
             if line.strip()]
    proto_bytes = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=proto_bytes, vocab_size=600,
        model_type="bpe", byte_fallback=True, character_coverage=1.0, minloglevel=2,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=True, user_defined_symbols=["<|im_start|>"])
    proto = pb.ModelProto()
    proto.ParseFromString(proto_bytes.getvalue())
    path = tmp_path / "spm.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list([p.piece for p in proto.pieces])
    w.add_token_scores([p.score for p in proto.pieces])
    w.add_token_types([int(p.type) for p in proto.pieces])  # the same numbering as GGUF's
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return spm.SentencePieceProcessor(model_proto=proto_bytes.getvalue()), path


def test_sentencepiece_vocabulary_tokenizes_as_llama_cpp(tmp_path):
    """llama.cpp's SPM tokenizer: merges by score, a space prefix, byte fallback, BOS added; a
    user-defined token splits the text, each fragment getting its own prefix."""
    sp, path = spm_fixture(tmp_path)
    vocab = gguf_vocab(GGUFFile(path))
    texts = ["def main():\n    return 1", "  two  spaces", "héllo wörld 漢字 🙂", "",
             "import os, sys\nclass Foo(object):\n    pass", "12345 67"]
    for text in texts:
        assert vocab.tokenize(text, add_special=False) == sp.encode(text), text
    im_start = sp.piece_to_id("<|im_start|>")
    assert vocab.tokenize("x<|im_start|>y", add_special=False) == (
        sp.encode("x") + [im_start] + sp.encode("y"))
    assert vocab.tokenize("hi", add_special=True) == [1, *sp.encode("hi")]
    assert vocab.piece(sp.piece_to_id("<0x0A>")) == b"\n"
    assert vocab.eog_ids == {2}


def test_file_type_names_are_llama_servers():
    from collections import Counter

    assert ftype_name(0, Counter()) == "all F32"
    assert ftype_name(15, Counter()) == "Q4_K - Medium"
    assert ftype_name(1, Counter()) == "F16"
    assert ftype_name(None, Counter({Q.Q8_0: 3, Q.F32: 2})) == "Q8_0 (guessed)"
    assert ftype_name(None, Counter({Q.Q8_K: 3})) == "all F32 (guessed)"
    assert GGUFFile(REFERENCE_GGUF).ftype == "all F32"


# tokenizer.json's own pre-tokenizer regexes, which llama.cpp rewrote for its regex engine
ORIGINAL_SPLITS = {
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}"
                 r"\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
             r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "tekken": r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
              r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
              r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "gpt-4o": r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
              r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
              r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}"
              r"\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}
SPLIT_TEXTS = ["I'M here, don'T go", "HelloWorld ABCdef xYZ", "1234567 89.5", "x\r\n\n  y",
               "   leading\t\ttabs  ", "a/b//c\n\nd", "def f(x):\n    return x**2  # ok"]


@pytest.mark.parametrize("pre_name", list(ORIGINAL_SPLITS))
def test_pre_tokenizer_splits_as_the_models_own_regex(pre_name):
    """llama.cpp's rewritten regexes (engine/gguf/tokenizer.py) split text as the model's
    tokenizer.json does, on ASCII text (llama.cpp's rewrites treat non-ASCII letters by its own
    rules, which the GGUF tokenizer follows)."""
    from tokenizers import Regex
    from tokenizers import pre_tokenizers as pre

    from engine.gguf.tokenizer import PRE_TOKENIZERS

    ours = pre.Sequence([pre.Split(Regex(r), "isolated") for r in PRE_TOKENIZERS[pre_name][0]])
    theirs = pre.Split(Regex(ORIGINAL_SPLITS[pre_name]), "isolated")
    texts = SPLIT_TEXTS + (["ünïcödé Ünï 漢字"] if pre_name in ("llama-bpe", "qwen2") else [])
    for text in texts:
        assert ours.pre_tokenize_str(text) == theirs.pre_tokenize_str(text), text


def test_command_line_takes_a_gguf_file():
    """-m file.gguf: the path resolved, -c 0 the file's training context split over -np."""
    from deployments.cli import command as cli

    args = cli.serve_config(cli.parse(["-m", "tests/fixtures/model.gguf", "-np", "4"], {}))
    args = args["applications"][0]["args"]
    assert (args["model"], args["n_ctx"]) == (str(REFERENCE_GGUF), 512)
    with pytest.raises(ValueError, match="GGUF file not found: missing.gguf"):
        cli.serve_config(cli.parse(["-m", "missing.gguf"], {}))
