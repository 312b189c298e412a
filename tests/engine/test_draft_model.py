"""Speculative decoding with a draft model (engine/draft_model.py) and under a sampled chain
(engine/speculative.py): tokens identical to decoding without speculation, greedy and seeded
sampled, alone and eight in one batch, for both drafters; the draft settings' bounds; the
counters; a draft model of another vocabulary refused; and the flags."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from deployments.cli import command as cli
from engine.draft_model import DraftRefused, check_pair
from engine.types import FinalEvent, GenerationRequest, SamplingParams

from ..conftest import MODEL, run_engine
from ..draft_models import build_truncated_draft

PROMPTS = ["def add(a, b):\n    return a + b\n\n" * 3, "import os\n", "class Foo:\n",
           "for i in range(10):\n    print(i)\n" * 3, "def main():\n", "x = [1, 2, 3]\n" * 3,
           "    for i in range(", "while True:\n"]
# the fifty: functions given whole and again in part (n-grams repeat), and single lines
# of the engine's own source (nothing repeats)
SOURCE = [line for line in (Path(MODEL).parents[1] / "engine" / "speculative.py").read_text()
          .splitlines() if line.strip()]
FIFTY = [f"def f{i}(x):\n    return x * {i} + 1\n\n" * (1 + i % 3) + f"def f{i}("
         for i in range(25)] + [line + "\n" for line in SOURCE[:25]]
# llama-server's default sampled chain, seeded
SAMPLED = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}


def engine_with(spec_type: str, draft_path: str | None = None, **settings):
    """An engine that speculates every step it can (spec_pace off), unless told otherwise."""
    from engine.model import load_model
    from engine.scheduler import Engine, EngineConfig

    engine = Engine(load_model(MODEL), EngineConfig(
        n_parallel=8, n_ctx=512, n_batch=64, spec_type=spec_type,
        spec_ngram_size_n=3, spec_ngram_size_m=8, **{"spec_pace": False, **settings}),
        load_model(draft_path) if draft_path else None)
    engine.start()
    return engine


@pytest.fixture(scope="module")
def draft_folder(tmp_path_factory) -> str:
    return str(build_truncated_draft(tmp_path_factory.mktemp("draft"), layers=1))


@pytest.fixture(scope="module")
def engines(draft_folder):
    made = {"plain": engine_with("none"), "ngram": engine_with("ngram-simple"),
            "draft": engine_with("draft-simple", draft_folder),
            "self": engine_with("draft-simple", MODEL, spec_draft_n_max=4),
            # measured, as served: speculative and plain steps mixed as the pacer chooses
            "paced": engine_with("draft-simple", draft_folder, spec_pace=True)}
    yield made
    for engine in made.values():
        engine.stop()


def request(engine, prompt: str, index: int = 0, seed: int | None = None, n: int = 40,
            **sampling) -> GenerationRequest:
    params = SamplingParams(**(sampling or {"temperature": 0.0}),
                            **({} if seed is None else {"seed": seed}))
    return GenerationRequest(engine.vocab.tokenize(prompt, add_special=True), params,
                             n_predict=n, cache_prompt=False, index=index)


def finals(engine, *requests) -> list[FinalEvent]:
    events = run_engine(engine, *requests)
    by_index = {e.index: e for e in events if isinstance(e, FinalEvent)}
    assert len(by_index) == len(requests), [e for e in events if not isinstance(e, FinalEvent)][:2]
    return [by_index[i] for i in range(len(requests))]


def tokens_of(engine, sampling: dict, batched: bool) -> list[list[int]]:
    if batched:
        made = [request(engine, p, i, seed=1000 + i, **sampling) for i, p in enumerate(PROMPTS)]
        return [f.tokens for f in finals(engine, *made)]
    return [finals(engine, request(engine, p, seed=1000 + i, **sampling))[0].tokens
            for i, p in enumerate(PROMPTS)]


_PLAIN: dict = {}  # the plain engine's answers, each computed once for the module


def plain_answer(engines, key: tuple, compute):
    if key not in _PLAIN:
        _PLAIN[key] = compute(engines["plain"])
    return _PLAIN[key]


@pytest.mark.parametrize("kind", ["draft", "self", "ngram", "paced"])
@pytest.mark.parametrize("sampling", [{}, SAMPLED], ids=["greedy", "sampled"])
def test_tokens_equal_decoding_without_speculation(engines, kind, sampling):
    spec = engines[kind]
    accepted_before = spec.metrics.spec.accepted
    reference = plain_answer(engines, tuple(sampling.items()),
                             lambda plain: tokens_of(plain, sampling, batched=False))
    assert tokens_of(spec, sampling, batched=False) == reference
    assert tokens_of(spec, sampling, batched=True) == reference  # eight rows in one batch
    if kind != "paced":  # the pacer may find speculation slower here, and stop it
        assert spec.metrics.spec.accepted > accepted_before  # drafts were really taken


@pytest.mark.parametrize("kind", ["draft", "ngram"])
def test_fifty_prompts_in_batches_of_eight_keep_their_greedy_tokens(engines, kind):
    spec = engines[kind]
    for start in range(0, len(FIFTY), 8):
        prompts = FIFTY[start:start + 8]
        expected = plain_answer(engines, ("fifty", start), lambda plain, prompts=prompts: [
            f.tokens for f in finals(plain, *[request(plain, p, i, n=24)
                                              for i, p in enumerate(prompts)])])
        assert [f.tokens for f in finals(spec, *[
            request(spec, p, i, n=24) for i, p in enumerate(prompts)])] == expected


def test_each_draft_holds_at_most_n_max_tokens(engines):
    spec = engines["self"]  # the target as its own draft: every greedy draft is accepted
    before = (spec.metrics.spec.drafts, spec.metrics.spec.draft_tokens)
    final = finals(spec, request(spec, PROMPTS[1], n=40))[0]
    drafts = spec.metrics.spec.drafts - before[0]
    assert spec.metrics.spec.draft_tokens - before[1] == final.timings.draft_n == 4 * drafts
    assert final.timings.draft_n_accepted == final.timings.draft_n
    assert drafts == 8  # each step answers its current token and 4 accepted: 8 steps, 40


@pytest.mark.parametrize(("settings", "drafted"), [
    ({"spec_draft_p_min": 1.01}, False),  # no token is that likely: no draft
    ({"spec_draft_n_min": 4, "spec_draft_n_max": 3}, False),  # never long enough
    ({"spec_draft_n_min": 2, "spec_draft_n_max": 2}, True),
])
def test_draft_bounds(draft_folder, settings, drafted):
    spec = engine_with("draft-simple", draft_folder, **settings)
    try:
        final = finals(spec, request(spec, PROMPTS[0]))[0]
    finally:
        spec.stop()
    assert (final.timings.draft_n > 0) == drafted
    if drafted:
        assert final.timings.draft_n % 2 == 0


def test_a_draft_of_another_vocabulary_is_refused(engines):
    vocab = engines["plain"].vocab
    other = SimpleNamespace(pieces=[*vocab.pieces[:-1], b"?"], eog_ids=vocab.eog_ids)
    with pytest.raises(DraftRefused, match="vocab type must match"):
        check_pair(vocab, other, engines["draft"].draft.model)


@pytest.mark.parametrize(("argv", "env", "expected"), [
    (["-md", MODEL], {}, ("draft-simple", MODEL, 3, 0, 0.0, True)),
    (["--spec-type", "draft-simple", "--model-draft", MODEL, "--spec-draft-n-max", "8",
      "--spec-draft-n-min", "2", "--draft-p-min", "0.5", "--no-spec-pace"], {},
     ("draft-simple", MODEL, 8, 2, 0.5, False)),
    ([], {"LLAMA_ARG_MODEL_DRAFT": MODEL, "LLAMA_ARG_SPEC_DRAFT_N_MAX": "5"},
     ("draft-simple", MODEL, 5, 0, 0.0, True)),
])
def test_draft_flags_reach_the_config(argv, env, expected):
    args = cli.graph_args(cli.parse(["-m", MODEL, *argv], env))
    assert (args.spec_type, args.model_draft, args.spec_draft_n_max, args.spec_draft_n_min,
            args.spec_draft_p_min, args.spec_pace) == expected


@pytest.mark.parametrize(("argv", "message"), [
    (["--spec-type", "draft-simple"], "needs a draft model"),
    (["--spec-type", "ngram-simple", "-md", MODEL], "drafts with --spec-type draft-simple"),
    (["-md", "/no/such/draft"], "draft model not found"),
])
def test_draft_settings_that_cannot_run_are_refused(argv, message):
    with pytest.raises(Exception, match=message):
        cli.graph_args(cli.parse(["-m", MODEL, *argv], {}))


def test_a_stop_string_inside_an_accepted_draft_ends_the_text_there(engines):
    plain, spec = engines["plain"], engines["self"]  # every draft accepted: 5 tokens a step
    text = finals(plain, request(plain, PROMPTS[1]))[0].content
    stop = {"stop": [text[len(text) // 2:len(text) // 2 + 3]]}
    expected = finals(plain, request(plain, PROMPTS[1]))[0]
    plain_cut = finals(plain, replace(request(plain, PROMPTS[1]), **stop))
    cut = finals(spec, replace(request(spec, PROMPTS[1]), **stop))[0]
    assert (cut.content, cut.stop_type, cut.n_predicted) == (
        plain_cut[0].content, "word", plain_cut[0].n_predicted)
    assert len(cut.content) < len(expected.content)
    assert cut.timings.draft_n_accepted > 0


def test_adapters_and_the_prompt_cache_with_a_draft_model(draft_folder, tmp_path):
    """A LoRA sequence beside a plain one, drafted for by the (adapter-less) draft model: each
    keeps mlx-lm's own tokens with its adapter; asked again, each reads its prompt from the
    cache and answers the same."""
    from engine.lora import read_lora

    from ..adapters import mlx_lm_greedy, write_adapter

    folder = write_adapter(tmp_path / "a", seed=11)
    spec = engine_with("draft-simple", draft_folder)
    try:
        spec.run_on_loop(lambda e: e.adapters.add(read_lora(folder, "a")))
        made = [replace(request(spec, PROMPTS[4], i, n=16), cache_prompt=True, adapters=a)
                for i, a in enumerate([(), (("a", 1.0),)])]
        first, again = finals(spec, *made), finals(spec, *made)
    finally:
        spec.stop()
    expected = [mlx_lm_greedy(PROMPTS[4], 16), mlx_lm_greedy(PROMPTS[4], 16, folder)]
    assert expected[0] != expected[1]
    assert [f.tokens for f in first] == [f.tokens for f in again] == expected
    assert all(f.timings.cache_n > 0 for f in again)
    assert sum(f.timings.draft_n_accepted for f in first + again) > 0
