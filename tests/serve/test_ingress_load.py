"""The ingress stays responsive under bodies that take it long to prepare, and a request of more
prompts than the queue can take is refused before any is tokenized or queued (issue #28).

The in-process graph (tests/local_graph.py: the real ingress, shaper and replica, the fake
engine on the model's real tokenizer). The figures (``/health``'s p99 while a 16 MiB prompt is
tokenized) are bench/ingress_stall.py's; these tests check the order of events, not time.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest

from engine.vocab import Vocab

from ..local_graph import local_graph

LARGE = 200_000  # characters: a prompt far past the context
GATE_S = 10.0
BUSY = {"error": {"code": 503, "message": "the server is busy: too many queued requests",
                  "type": "unavailable_error"}}


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with local_graph({"n_parallel": 2, "max_queue": 1, "n_ctx": 128}) as c:
        yield c


class HeldTokenizer:
    """Vocab.tokenize, held at a large text until the test lets it go (or GATE_S passed): while
    it is held, the large request is being tokenized."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.started, self.released = threading.Event(), threading.Event()
        self.released_in_time: bool | None = None
        self.calls = 0
        real = Vocab.tokenize

        def tokenize(vocab: Vocab, text: str, *args, **kwargs) -> list[int]:
            self.calls += 1
            if len(text) >= LARGE:
                self.started.set()
                self.released_in_time = self.released.wait(GATE_S)
            return real(vocab, text, *args, **kwargs)

        monkeypatch.setattr(Vocab, "tokenize", tokenize)


@pytest.mark.parametrize("path,body", [
    ("/completion", {"prompt": "x = 1\n" * (LARGE // 6 + 1)}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "y " * (LARGE // 2)}]}),
    ("/tokenize", {"content": "z " * (LARGE // 2)}),
])
def test_health_and_a_small_request_answer_while_a_large_prompt_is_tokenized(
        client, monkeypatch, path, body):
    """Today's failure: the large prompt tokenized on the event loop, which answers nothing else
    until the tokenizer lets go."""
    held = HeldTokenizer(monkeypatch)
    answers: dict[str, httpx.Response] = {}
    large = threading.Thread(target=lambda: answers.update(large=client.post(path, json=body)))
    large.start()
    try:
        assert held.started.wait(30), "the large prompt was never tokenized"
        answers["health"] = client.get("/health")
        answers["small"] = client.post("/tokenize", json={"content": "def f():"})
    finally:
        held.released.set()
        large.join(60)
    assert held.released_in_time, "/health waited for the large prompt's tokenizer"
    assert answers["health"].json() == {"status": "ok"}
    assert answers["small"].json()["tokens"]
    assert answers["large"].status_code in (200, 400), answers["large"].text


def test_more_prompts_than_the_queue_takes_are_refused_before_any_is_tokenized(
        client, monkeypatch):
    """A million one-character prompts: the full queue's 503 before a single one is tokenized or
    queued; the next ordinary request is answered."""
    held = HeldTokenizer(monkeypatch)
    refused = client.post("/completion", json={"prompt": ["a"] * 1_000_000, "n_predict": 1})
    assert (refused.status_code, refused.json()) == (503, BUSY)
    assert held.calls == 0
    after = client.post("/completion", json={"prompt": ["a", "b", "c"], "n_predict": 1})
    assert after.status_code == 200 and len(after.json()) == 3


def test_the_bound_counts_each_prompts_n_cmpl_children(client):
    """Two slots and a queue of one: three sequences fit, two prompts times n_cmpl 2 do not."""
    refused = client.post("/completion", json={"prompt": ["a", "b"], "n_cmpl": 2,
                                               "n_predict": 1})
    assert (refused.status_code, refused.json()) == (503, BUSY)
    answered = client.post("/completion", json={"prompt": ["a"], "n_cmpl": 2, "n_predict": 1})
    assert answered.status_code == 200 and len(answered.json()) == 2
