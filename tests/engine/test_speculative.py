"""N-gram speculative decoding (engine/speculative.py): the reference's ngram-simple lookup,
greedy identity with speculation off (alone and batched, drafts really accepted), stop strings
and grammars with drafts on, counters and timings that add up, and the flags."""

from __future__ import annotations

import pytest

from deployments.cli import command as cli
from deployments.cli.refused import Refused
from engine.speculative import ngram_draft
from engine.types import FinalEvent, GenerationRequest, SamplingParams

from ..conftest import MODEL, run_engine

# repetitive prompts (code to rewrite, given in the prompt) and plain ones
BLOCK = "def add(a, b):\n    return a + b\n\n"
PROMPTS = [BLOCK * 4, "class Foo:\n    def __init__(self):\n        self.x = 1\n" * 3,
           "for i in range(10):\n    print(i)\n" * 4, "def main():\n", "import os\n",
           "    for i in range(", "x = [1, 2, 3]\nx = [1, 2, 3]\nx = [1, 2, 3]\n"]


def engine_with(spec_type: str, n_parallel: int):
    from engine.model import load_model
    from engine.scheduler import Engine, EngineConfig

    engine = Engine(load_model(MODEL), EngineConfig(
        n_parallel=n_parallel, n_ctx=512, n_batch=64, spec_type=spec_type, spec_pace=False,
        spec_ngram_size_n=3, spec_ngram_size_m=8))
    engine.start()
    return engine


@pytest.fixture(scope="module")
def engines():
    plain, spec = engine_with("none", 4), engine_with("ngram-simple", 4)
    yield plain, spec
    plain.stop()
    spec.stop()


def request(engine, prompt: str, index: int = 0, n: int = 48, **kw) -> GenerationRequest:
    return GenerationRequest(engine.vocab.tokenize(prompt, add_special=True),
                             SamplingParams(temperature=0.0), n_predict=n, cache_prompt=False,
                             index=index, **kw)


def finals(engine, *requests) -> list[FinalEvent]:
    by_index = {e.index: e for e in run_engine(engine, *requests) if isinstance(e, FinalEvent)}
    return [by_index[i] for i in range(len(requests))]


def test_ngram_draft_follows_the_reference_lookup():
    tokens = [9, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2]
    assert ngram_draft(tokens, 3, 3, 4) == [4, 5, 6, 7]  # 1 2 3 seen at 1: what followed
    assert ngram_draft(tokens, 3, 3, 9) == []  # too short a context for such an m-gram
    assert ngram_draft(tokens, 7, 3, 4) == []  # no earlier 1 2 7
    # the latest match wins, and fewer than size_n tokens after it draft nothing
    assert ngram_draft([1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2], 3, 3, 4) == []


def test_greedy_tokens_equal_plain_decoding_alone_and_batched(engines):
    plain, spec = engines
    drafts_before = spec.metrics.spec.accepted
    alone = [finals(spec, request(spec, p))[0] for p in PROMPTS]
    reference = [finals(plain, request(plain, p))[0].tokens for p in PROMPTS]
    assert [f.tokens for f in alone] == reference
    together = finals(spec, *[request(spec, p, i) for i, p in enumerate(PROMPTS)])
    assert [f.tokens for f in together] == reference
    accepted = sum(f.timings.draft_n_accepted for f in alone + together)
    assert accepted > 0  # drafts were really taken
    assert spec.metrics.spec.accepted - drafts_before == accepted
    for f in alone + together:
        assert 0 <= f.timings.draft_n_accepted <= f.timings.draft_n
        assert f.timings.draft_n_accepted < f.timings.predicted_n


def test_stop_strings_and_grammars_with_drafts_on(engines):
    plain, spec = engines
    text = finals(plain, request(plain, PROMPTS[0]))[0].content
    stop = {"stop": [text[len(text) // 2:len(text) // 2 + 3]]}  # a word halfway through
    cut = finals(spec, request(spec, PROMPTS[0], **stop))[0]
    assert (cut.content, cut.stop_type) == (
        finals(plain, request(plain, PROMPTS[0], **stop))[0].content, "word")
    grammar = {"grammar": 'root ::= ("def add" [^\\n]* "\\n")+'}
    constrained = finals(spec, request(spec, PROMPTS[0], n=24, **grammar))[0]
    assert constrained.tokens == finals(plain, request(plain, PROMPTS[0], n=24, **grammar))[
        0].tokens
    assert constrained.timings.draft_n == 0  # a grammar's sequence does not speculate


@pytest.mark.parametrize(("argv", "env", "expected"), [
    ([], {}, ("none", 12, 48)),
    (["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "4",
      "--spec-ngram-simple-size-m", "16"], {}, ("ngram-simple", 4, 16)),
    ([], {"LLAMA_ARG_SPEC_TYPE": "ngram-simple"}, ("ngram-simple", 12, 48)),
])
def test_spec_flags_reach_the_config(argv, env, expected):
    args = cli.graph_args(cli.parse(["-m", MODEL, *argv], env))
    assert (args.spec_type, args.spec_ngram_size_n, args.spec_ngram_size_m) == expected


@pytest.mark.parametrize("kind", ["draft-eagle3", "ngram-mod", "bogus"])
def test_spec_types_mlxray_lacks_are_refused(kind):
    with pytest.raises(Refused, match="--spec-type"):
        cli.graph_args(cli.parse(["-m", MODEL, "--spec-type", kind], {}))
