"""engine/fake.py's engine: the seam's other implementation (engine/seam.py), for the tests of
the API and graph layers. It must keep the real engine's contract, or those tests would pass
against something the MLX engine is not."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from engine import aio
from engine.fake import fake_engine
from engine.seam import EngineLike
from engine.types import EngineConfig, EngineError, FinalEvent, GenerationRequest, TokenEvent

from ..local_graph import MODEL

MEMBERS = [name for name in vars(EngineLike) if not name.startswith("_")] + [
    name for name in EngineLike.__annotations__]


@pytest.fixture(scope="module")
def fake():
    engine = fake_engine(MODEL, EngineConfig(n_parallel=2, n_ctx=64, max_queue=1))
    engine.start()
    yield engine
    engine.stop()


def run(engine, *requests) -> list:
    async def collect() -> list:
        return [e async for batch in aio.generate(engine, list(requests)) for e in batch]

    return asyncio.run(collect())


def test_both_engines_have_every_member_of_the_seam(fake):
    from engine.scheduler import Engine

    assert {"submit", "cancel", "slot_states", "metrics_snapshot", "run_on_loop"} <= set(MEMBERS)
    for name in MEMBERS:
        assert hasattr(fake, name), name
        assert hasattr(Engine, name) or name in Engine.__init__.__code__.co_names, name


def test_tokens_are_deterministic_and_limits_hold(fake):
    prompt = fake.vocab.tokenize("def f():", add_special=False)
    first = run(fake, GenerationRequest(prompt, n_predict=6, stream=True))
    again = run(fake, GenerationRequest(prompt, n_predict=6))
    (final,) = [e for e in first if isinstance(e, FinalEvent)]
    assert (final.stop_type, final.n_predicted, again[-1].content) == ("limit", 6, final.content)
    assert "".join(e.text for e in first if isinstance(e, TokenEvent)) == final.content
    other = run(fake, GenerationRequest(fake.vocab.tokenize("x = 1", add_special=False),
                                        n_predict=6))
    assert other[-1].content != final.content
    full = run(fake, GenerationRequest(prompt))[-1]  # to the end of the 64-token slot
    assert (full.stop_type, full.truncated, full.n_prompt + full.n_predicted) == (
        "limit", True, 64)


def test_a_stop_string_ends_the_text_before_it(fake):
    prompt = fake.vocab.tokenize("def f():", add_special=False)
    text = run(fake, GenerationRequest(prompt, n_predict=6))[-1].content
    word = text.split()[1]
    stopped = run(fake, GenerationRequest(prompt, n_predict=6, stop=[word]))[-1]
    assert (stopped.stop_type, stopped.stopping_word) == ("word", word)
    assert stopped.content == text[:text.index(word)]


def test_refusals_are_the_real_engines(fake):
    with pytest.raises(EngineError, match="Prompt contains invalid tokens"):
        fake.submit([GenerationRequest([10**6])], lambda events: None)
    bad = GenerationRequest([5], n_predict=1)
    bad.sampling.repeat_penalty = 0
    with pytest.raises(EngineError, match="penalty_repeat must be finite"):
        fake.submit([bad], lambda events: None)
    with pytest.raises(EngineError, match="does not run a grammar"):  # refused, never ignored
        fake.submit([GenerationRequest([5], grammar='root ::= "a"')], lambda events: None)
    probs = GenerationRequest([5])
    probs.sampling.n_probs = 2
    with pytest.raises(EngineError, match="does not run token probabilities"):
        fake.submit([probs], lambda events: None)
    with pytest.raises(EngineError, match="does not run n_indent, a time limit"):
        fake.submit([GenerationRequest([5], n_indent=2, t_max_predict_ms=5)], lambda e: None)


def test_the_queue_bound_counts_sequences_and_refuses_a_whole_request(fake):
    """Two free slots and a queue of one take three sequences. A request of four (an n_cmpl
    child counts as one) is refused whole, none of it queued; three are answered."""
    def sequences(n: int, children: bool = False) -> list[GenerationRequest]:
        return [GenerationRequest([5, 6], n_predict=1, index=i, child=children and i % 2 == 1)
                for i in range(n)]

    submitted = fake.debug_state()["n_submitted"]
    for refused in (sequences(4), sequences(4, children=True)):
        with pytest.raises(EngineError, match="too many queued requests") as exc:
            fake.submit(refused, lambda events: None)
        assert (exc.value.code, fake.n_waiting) == (503, 0)
    assert fake.debug_state()["n_submitted"] == submitted
    finals = [e for e in run(fake, *sequences(3)) if isinstance(e, FinalEvent)]
    assert len(finals) == 3 and fake.n_waiting == 0


def test_a_cancelled_group_frees_its_slot(fake):
    group = fake.submit([GenerationRequest([5, 6], n_predict=-1)], lambda events: None)
    fake.cancel(group)
    for _ in range(200):
        if fake.debug_state()["n_active"] == 0 and fake.n_cancelled:
            break
        asyncio.run(asyncio.sleep(0.01))
    assert fake.debug_state()["n_active"] == 0 and fake.n_cancelled >= 1


def test_a_replica_on_the_fake_engine_imports_no_mlx():
    code = ("import sys; from deployments.api.config import GraphArgs; "
            "from deployments.serve import engines, replica; "
            f"e = engines.fake(GraphArgs(model={MODEL!r})); e.start(); e.stop(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "[]"
