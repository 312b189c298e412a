"""The reference GGUF file (tests/fixtures/model.gguf, the embedded model's weights for
llama.cpp) served in the suite's cluster with the conformance settings: every public capture
replays as it does against the HF folder, and /props and /models describe the file as
llama-server does."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from ..captures import compare, load_captures, send
from ..conftest import CAPTURES, CONFORMANCE_ARGS
from ..gguf_files import REFERENCE_GGUF
from ..reliability import dedicated_app
from .test_conformance import KNOWN_DIFFERENCES

APP = "gguf"
CAPTURE_LIST = load_captures(CAPTURES)


@pytest.fixture(scope="module")
def served(serve_instance: int) -> Iterator[httpx.Client]:
    """A fresh graph of its own (the cache captures come first and need it fresh)."""
    args = {**CONFORMANCE_ARGS, "model": str(REFERENCE_GGUF)}
    with dedicated_app(serve_instance, APP, args) as base:
        with httpx.Client(base_url=base, timeout=120) as client:
            yield client


@pytest.mark.parametrize("capture", [
    pytest.param(c, id=c["probe"]["name"], marks=pytest.mark.xfail(
        reason=KNOWN_DIFFERENCES[c["probe"]["name"]], strict=True))
    if c["probe"]["name"] in KNOWN_DIFFERENCES else pytest.param(c, id=c["probe"]["name"])
    for c in CAPTURE_LIST
])
def test_capture_from_gguf(served, capture):
    problems = compare(capture, send(served, capture["probe"]))
    assert not problems, "\n".join(problems)


def test_props_and_models_describe_the_file(served):
    props = served.get("/props").json()
    assert props["model_path"] == str(REFERENCE_GGUF)
    assert (props["model_ftype"], props["bos_token"], props["eos_token"]) == (
        "all F32", "<s>", "</s>")
    assert props["chat_template"].startswith("{% for message in messages %}")
    models = served.get("/models").json()
    assert models["models"][0]["details"]["format"] == "gguf"
    assert models["data"][0]["meta"] == {
        "vocab_type": True, "n_vocab": 2000, "n_ctx": 2048, "n_ctx_train": 2048,
        "n_embd": 128, "n_params": 807552, "size": 3230208, "ftype": "all F32"}
