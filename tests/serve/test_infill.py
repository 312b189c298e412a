"""POST /infill: the FIM tokens found in a vocabulary, the reference's prompt assembly
(format_prompt_infill) token for token, its field errors, one real generation through the
graph (stream and not), and the reference's 501 on the embedded model (no FIM tokens).

The FIM model is built here: a random-weight mlx-lm Llama (tests/zoo.py) whose tokenizer is the
embedded model's with Qwen2.5-Coder's six FIM special tokens added (ids 2000-2005)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deployments.api.errors import ApiError
from deployments.api.infill import InfillBudget, check_infill_body, infill_prompt
from engine.vocab import load_vocab
from tests.reliability import dedicated_app
from tests.zoo import BY_NAME, VOCAB, build_family

FIM_TOKENS = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>",
              "<|repo_name|>", "<|file_sep|>"]
PRE, SUF, MID, PAD, REP, SEP = range(VOCAB, VOCAB + len(FIM_TOKENS))
WIDE = InfillBudget(n_batch=2048, n_predict=-1, n_ctx=4096)


def build_fim_model(folder: Path) -> Path:
    from tokenizers import AddedToken, Tokenizer

    llama = BY_NAME["llama"]
    family = dataclasses.replace(llama, config={**llama.config,
                                                "vocab_size": VOCAB + len(FIM_TOKENS)})
    build_family(family, folder)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t in FIM_TOKENS])
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture(scope="module")
def fim_folder(tmp_path_factory) -> Path:
    return build_fim_model(tmp_path_factory.mktemp("fim") / "llama-fim")


@pytest.fixture(scope="module")
def vocab(fim_folder):
    return load_vocab(str(fim_folder))


def text(vocab, s: str) -> list[int]:
    return vocab.tokenize(s, add_special=False, parse_special=False)


def test_fim_tokens_found_by_text(vocab):
    assert vocab.fim_ids == {"pre": PRE, "suf": SUF, "mid": MID, "pad": PAD, "rep": REP,
                             "sep": SEP}
    assert {PAD, REP, SEP} <= vocab.eog_ids  # llama.cpp ends generation at them


def test_embedded_model_has_no_fim_tokens():
    from tests.conftest import MODEL

    assert load_vocab(MODEL).fim_ids == {}


def assemble(vocab, body: dict, budget: InfillBudget = WIDE) -> list[int]:
    return infill_prompt(vocab, body, check_infill_body(body), budget)


def test_psm_and_spm_layouts(vocab):
    body = {"input_prefix": "def add(a, b):\n    ", "input_suffix": "\n\nprint(add(1, 2))\n",
            "prompt": "return"}
    prefix, suffix, prompt = (text(vocab, body["input_prefix"]),
                              text(vocab, body["input_suffix"]),
                              vocab.tokenize("return", add_special=False))
    repo = [REP, *text(vocab, "myproject\n"), SEP, *text(vocab, "filename\n")]
    bos = [vocab.bos_id] if vocab.add_bos else []
    assert assemble(vocab, body) == [*repo, *bos, PRE, *prefix, *prompt, SUF, *suffix, MID]
    spm = dataclasses.replace(WIDE, spm_infill=True)
    assert assemble(vocab, body, spm) == [*repo, *bos, SUF, *suffix, PRE, *prefix, *prompt,
                                          MID]


def test_input_extra_chunks_and_mixed_prefix(vocab):
    body = {"input_prefix": ["x = ", 5], "input_suffix": "",
            "input_extra": [{"filename": "util.py", "text": "import os\n"},
                            {"text": "y = 2\n"}]}
    extra = [REP, *text(vocab, "myproject\n"),
             SEP, *text(vocab, "util.py\n"), *text(vocab, "import os\n"),
             SEP, *text(vocab, "tmp\n"), *text(vocab, "y = 2\n"),
             SEP, *text(vocab, "filename\n")]
    bos = [vocab.bos_id] if vocab.add_bos else []
    assert assemble(vocab, body) == [*extra, *bos, PRE, *text(vocab, "x = "), 5, SUF, MID]


def test_budgets_cut_prefix_head_suffix_tail_and_extra_head(vocab):
    body = {"input_prefix": list(range(10, 40)), "input_suffix": list(range(50, 80)),
            "prompt": "", "input_extra": [{"filename": "a", "text": "print(1)\n" * 20}]}
    # n_batch 16: prefix keeps its last 12, suffix its first 16/4 - 2 = 2
    # extra keeps its last n_ctx - n_batch - 2 n_predict = 40 - 16 - 2*10 = 4 tokens
    budget = InfillBudget(n_batch=16, n_predict=10, n_ctx=40)
    bos = [vocab.bos_id] if vocab.add_bos else []
    extra = assemble(vocab, body)[:-(len(bos) + 1 + 30 + 1 + 30 + 1)]
    assert assemble(vocab, body, budget) == [*extra[-4:], *bos, PRE, *range(28, 40),
                                             SUF, 50, 51, MID]


@pytest.mark.parametrize(("body", "message"), [
    ({"input_suffix": ""}, "[json.exception.out_of_range.403] key 'input_prefix' not found"),
    ({"input_prefix": ""}, "[json.exception.out_of_range.403] key 'input_suffix' not found"),
    ({"input_prefix": "", "input_suffix": "", "input_extra": {}},
     '"input_extra" must be an array of {"filename": string, "text": string}'),
    ({"input_prefix": "", "input_suffix": "", "input_extra": [{"filename": "a"}]},
     'extra_context chunk must contain a "text" field with a string value'),
    ({"input_prefix": "", "input_suffix": "", "input_extra": [{"text": "", "filename": 1}]},
     'extra_context chunk\'s "filename" field must be a string'),
])
def test_field_errors(body, message):
    with pytest.raises(ApiError) as err:
        check_infill_body(body)
    assert (err.value.message, err.value.type) == (message, "invalid_request_error")


# ---- served --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fim_url(serve_instance, fim_folder) -> Iterator[str]:
    """Deleted when the module ends: an idle app costs every later test CPU on CI's 2 cores."""
    with dedicated_app(serve_instance, "fim", {"model": str(fim_folder), "n_parallel": 1,
                                               "n_ctx": 512, "n_batch": 64}) as base:
        yield base


# the served graph's budget: -b 2048 and n_ctx 512 leave no room for the repo-level context
SERVED = InfillBudget(n_batch=2048, n_predict=-1, n_ctx=512)
BODY = {"input_prefix": "def f(x):\n    ", "input_suffix": "\n", "n_predict": 6,
        "temperature": 0, "ignore_eos": True}


def test_infill_generates_from_the_assembled_prompt(fim_url, vocab):
    r = httpx.post(f"{fim_url}/infill", json={**BODY, "return_tokens": True}, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    prompt = assemble(vocab, BODY, SERVED)
    assert len(out["tokens"]) == 6 and out["tokens_evaluated"] == len(prompt)
    same = httpx.post(f"{fim_url}/completion", timeout=60, json={
        "prompt": prompt, "n_predict": 6, "temperature": 0, "ignore_eos": True})
    assert same.json()["content"] == out["content"]
    with httpx.stream("POST", f"{fim_url}/infill", json={**BODY, "stream": True},
                      timeout=60) as s:
        frames = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    assert "".join(f["content"] for f in frames) == out["content"] and frames[-1]["stop"]


def test_infill_errors_served(fim_url):
    r = httpx.post(f"{fim_url}/infill", json={"input_prefix": "", "input_suffix": "",
                                              "input_extra": 3}, timeout=30)
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith('"input_extra" must be an array')


def test_embedded_model_answers_501(client):
    r = client.post("/infill", json={"input_prefix": "", "input_suffix": ""})
    assert r.status_code == 501
    assert r.json() == {"error": {"code": 501, "type": "not_supported_error", "message":
                                  "Infill is not supported by this model: prefix token is "
                                  "missing. suffix token is missing. middle token is "
                                  "missing. "}}


def test_gguf_metadata_ids_come_first():
    from engine.fim import fim_from_metadata

    meta = {"tokenizer.ggml.prefix_token_id": 5, "tokenizer.ggml.fim_suf_token_id": 6,
            "tokenizer.ggml.fim_mid_token_id": 99}  # past the vocabulary: not a token
    assert fim_from_metadata(meta.get, 10) == {"pre": 5, "suf": 6}


def test_an_editor_shaped_request(fim_url):
    """llama.vim's body (its samplers with infill, time limits, response_fields)."""
    body = {"input_prefix": "import os\n", "input_suffix": "\n", "prompt": "    ",
            "input_extra": [{"filename": "a.py", "text": "x = 1\n"}], "n_predict": 8,
            "stop": [], "n_indent": 4, "top_k": 40, "top_p": 0.9, "stream": False,
            "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True,
            "t_max_prompt_ms": 500, "t_max_predict_ms": 1000,
            "response_fields": ["content", "timings/prompt_n", "truncated"]}
    r = httpx.post(f"{fim_url}/infill", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert set(r.json()) == {"content", "timings/prompt_n", "truncated"}
