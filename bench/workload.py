"""The requests every system under test gets: the same prompts, greedy, ignore_eos, a fixed
number of tokens, built by the ingress's own parsing so the engine driven directly receives
exactly what the graph hands its replica."""

from __future__ import annotations

from dataclasses import dataclass

from deployments.api.engine_requests import to_requests
from deployments.api.schema import CompletionParams, ParseContext, parse_completion
from engine.types import GenerationRequest
from engine.vocab import Vocab

from . import REPO

SOURCES = sorted((REPO / "engine").glob("*.py")) + sorted((REPO / "deployments").glob("*.py"))


@dataclass(frozen=True)
class Workload:
    n_tokens: int
    prompts: list[list[int]]  # token ids without BOS: the HTTP body's "prompt"

    def body(self, i: int, stream: bool = True, cache_prompt: bool = False) -> dict:
        return completion_body(self.prompts[i % len(self.prompts)], self.n_tokens, stream,
                               cache_prompt)


def completion_body(prompt: list[int], n_tokens: int, stream: bool = True,
                    cache_prompt: bool = False) -> dict:
    return {"prompt": prompt, "n_predict": n_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": stream, "cache_prompt": cache_prompt}


def corpus_tokens(vocab: Vocab) -> list[int]:
    """The repository's own Python source, tokenized: text the embedded model was trained on."""
    text = "\n".join(p.read_text() for p in SOURCES)
    return vocab.tokenize(text, add_special=False)


def make_prompts(vocab: Vocab, count: int, length: int, stride: int = 97) -> list[list[int]]:
    """``count`` distinct windows of ``length`` tokens, starting ``stride`` tokens apart."""
    tokens = corpus_tokens(vocab)
    while len(tokens) < length + stride * count:
        tokens = tokens + tokens
    return [tokens[i * stride: i * stride + length] for i in range(count)]


def engine_requests(vocab: Vocab, body: dict, n_parallel: int) -> list[GenerationRequest]:
    """What the ingress and replica make of ``body``: tokenized, parsed, turned into requests."""
    context = ParseContext(n_parallel=n_parallel,
                           tokenize=lambda text: vocab.tokenize(text, add_special=False),
                           n_vocab=vocab.n_vocab, eog_ids=tuple(sorted(vocab.eog_ids)))
    params = parse_completion(body, context, CompletionParams())
    prompts = [vocab.tokenize_prompt(body["prompt"])]
    return to_requests(params, prompts)
