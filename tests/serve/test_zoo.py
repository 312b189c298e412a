"""The model zoo over real HTTP: every family of tests/zoo.py (llama, qwen3, gemma3_text with a
window smaller than prompt + answer, gpt_oss with sinks and a window, qwen3_next, mamba2, and 4-
and 8-bit conversions) served by ONE application (``args.models``: a replica deployment per
model), each checked against mlx-lm's own greedy generation: plain and streamed, the prompt cache
on a repeat and on the next turn (timings and /slots agreeing), n_cmpl, concurrent requests, slot
save/restore, and a chat rendered with a template in the family's style, sent with the OpenAI
SDK (think tags, tool calls and results where the family has them)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..conftest import MODEL
from ..reliability import dedicated_app, sse_data
from ..zoo import BY_NAME, FAMILIES, reference_ids

APP = "zoo"
NAMES = [f.name for f in FAMILIES]
N = 6  # tokens per answer
CHAT = [
    {"role": "system", "content": "You write small Python helpers."},
    {"role": "user", "content": "Add two numbers."},
    {"role": "assistant", "content": "", "reasoning_content": "A helper call will do.",
     "tool_calls": [{"id": "c1", "type": "function",
                     "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
    {"role": "tool", "tool_call_id": "c1", "name": "add", "content": "3"},
    {"role": "user", "content": "Now print it."},
]
PLAIN_CHAT = [CHAT[0], CHAT[1], {"role": "assistant", "content": "def add(a, b): return a + b"},
              {"role": "user", "content": "Now print it."}]


@pytest.fixture(scope="module")
def served(serve_instance: int, zoo: dict[str, Path],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    args = {"n_parallel": 2, "n_ctx": 512, "n_batch": 16,
            "slot_save_path": str(tmp_path_factory.mktemp("zoo-slots")),
            "models": [{"model": str(zoo[name]), "alias": name} for name in NAMES]}
    replicas = {"ray_actor_options": {"num_cpus": 0.1}}
    with dedicated_app(serve_instance, APP, args, replicas) as base:
        with httpx.Client(base_url=base, timeout=120) as client:
            yield client


@pytest.fixture(scope="module")
def vocab():
    """The zoo's tokenizer is the embedded model's."""
    from engine.model import load_model

    return load_model(MODEL).vocab


def prompt_of(vocab, name: str, text: str) -> list[int]:
    return vocab.tokenize(f"# {name}\n{text}", add_special=True)


def complete(client: httpx.Client, name: str, prompt: list[int], **fields) -> dict:
    body = {"model": name, "prompt": prompt, "n_predict": N, "temperature": 0,
            "return_tokens": True, **fields}
    r = client.post("/completion", json=body)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("name", NAMES)
def test_greedy_plain_and_streamed_equal_mlx_lm(served, zoo, vocab, name):
    prompt = prompt_of(vocab, name, "def greet(who):\n    return 'hello ' + who\n")
    reference = reference_ids(zoo[name], prompt, N)
    assert complete(served, name, prompt, cache_prompt=False)["tokens"] == reference
    with served.stream("POST", "/completion", json={
            "model": name, "prompt": prompt, "n_predict": N, "temperature": 0, "stream": True,
            "return_tokens": True, "cache_prompt": False}) as r:
        frames = [f for line in r.iter_lines() if (f := sse_data(line)) is not None]
    assert [t for f in frames for t in f["tokens"]] == reference
    assert frames[-1]["stop"] is True and frames[-1]["tokens_predicted"] == N


@pytest.mark.parametrize("name", NAMES)
def test_prompt_cache_on_a_repeat_and_the_next_turn(served, zoo, vocab, name):
    """A repeat reuses all but the last prompt token, the next turn (prompt, answer, more)
    reuses prompt and answer; /slots reports the same counts as the timings."""
    prompt = prompt_of(vocab, name, "class Point:\n    def __init__(self, x, y):\n")
    first = complete(served, name, prompt)
    again = complete(served, name, prompt)
    assert again["tokens"] == first["tokens"] == reference_ids(zoo[name], prompt, N)
    assert (again["timings"]["cache_n"], again["timings"]["prompt_n"]) == (len(prompt) - 1, 1)
    slot = next(s for s in served.get("/slots", params={"model": name}).json()
                if s["id"] == again["id_slot"])
    assert (slot["n_prompt_tokens_cache"], slot["n_prompt_tokens_processed"]) == (
        len(prompt) - 1, 1)
    turn = prompt + first["tokens"] + vocab.tokenize("\n        self.x = x\n", add_special=False)
    answer = complete(served, name, turn)
    assert answer["timings"]["cache_n"] == len(prompt) + N
    assert answer["tokens"] == reference_ids(zoo[name], turn, N)


@pytest.mark.parametrize("name", NAMES)
def test_n_cmpl_and_concurrent_requests(served, zoo, vocab, name):
    prompt = prompt_of(vocab, name, "import sys\n\nfor arg in sys.argv:\n")
    children = complete(served, name, prompt, n_cmpl=2, cache_prompt=False)
    reference = reference_ids(zoo[name], prompt, N)
    assert [c["tokens"] for c in children] == [reference, reference]
    assert children[0]["timings"]["prompt_n"] == children[1]["timings"]["prompt_n"] == len(prompt)
    prompts = [prompt_of(vocab, name, f"def task_{i}(n):\n    return n * {i}\n") for i in range(3)]
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda p: complete(served, name, p, cache_prompt=False), prompts))
    assert [a["tokens"] for a in answers] == [reference_ids(zoo[name], p, N) for p in prompts]


@pytest.mark.parametrize("name", NAMES)
def test_slot_save_and_restore(served, zoo, vocab, name):
    """A slot saved to a file, erased and restored into another slot: the next turn reuses what
    the file holds, with mlx-lm's own answer."""
    prompt = prompt_of(vocab, name, "def restored(path):\n    with open(path) as f:\n")
    first = complete(served, name, prompt, id_slot=0)
    file = {"model": name, "filename": f"{name}.bin"}
    saved = served.post("/slots/0?action=save", json=file).json()
    assert saved["n_saved"] == len(prompt) + N and saved["n_written"] > 0
    erased = served.post("/slots/0", params={"action": "erase", "model": name}).json()
    assert erased["n_erased"] == saved["n_saved"]
    restored = served.post("/slots/1?action=restore", json=file).json()
    assert restored["n_restored"] == saved["n_saved"]
    more = vocab.tokenize("\n        return f.read()\n", add_special=False)
    turn = prompt + first["tokens"] + more
    answer = complete(served, name, turn, id_slot=1)
    assert answer["timings"]["cache_n"] == saved["n_saved"]
    assert answer["tokens"] == reference_ids(zoo[name], turn, N)


@pytest.mark.parametrize("name", NAMES)
def test_chat_in_the_familys_template(served, zoo, vocab, name):
    """The family's template renders the conversation (think tags, tool calls and results where
    it has them); the SDK's answer is mlx-lm's on that prompt, and regenerating it reuses all but
    the last prompt token."""
    family = BY_NAME[name]
    messages = CHAT if family.tools else PLAIN_CHAT
    kwargs = {"enable_thinking": False} if family.thinks else {}
    # chat templates are rendered as transformers and llama.cpp's minja render them
    rendered = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(
        family.template).render(messages=messages, add_generation_prompt=True, **kwargs)
    applied = served.post("/apply-template", json={
        "model": name, "messages": messages, "chat_template_kwargs": kwargs}).json()
    assert applied["prompt"] == rendered
    if family.thinks:
        assert rendered.count("<think>") == 2 or "<|channel|>analysis" in rendered
    if family.tools:
        assert '{"a": 1, "b": 2}' in rendered
    prompt = vocab.tokenize(rendered, add_special=True)
    expected = vocab.detokenize(reference_ids(zoo[name], prompt, N))
    with openai.OpenAI(base_url=str(served.base_url).rstrip("/") + "/v1", api_key="unused",
                       max_retries=0) as sdk:
        answers = [sdk.chat.completions.create(
            model=name, messages=messages, max_tokens=N, temperature=0,
            extra_body={"chat_template_kwargs": kwargs, "reasoning_format": "none"})
            for _ in range(2)]
    assert [a.choices[0].message.content for a in answers] == [expected, expected]
    assert answers[0].usage.prompt_tokens == len(prompt)
    assert answers[1].usage.prompt_tokens_details.cached_tokens == len(prompt) - 1


def test_every_family_is_one_model_of_one_application(served):
    assert [m["id"] for m in served.get("/v1/models").json()["data"]] == NAMES
    ftypes = {name: served.get("/props", params={"model": name}).json()["model_ftype"]
              for name in NAMES}
    assert ftypes == {**dict.fromkeys(NAMES, "all F32"), "qwen3-4bit": "mostly Q4",
                      "gemma3_text-8bit": "mostly Q8"}
    meta = {m["id"]: m["meta"] for m in served.get("/v1/models").json()["data"]}
    # a conversion has its model's parameters, in fewer bytes
    for model, converted in (("qwen3", "qwen3-4bit"), ("gemma3_text", "gemma3_text-8bit")):
        assert meta[converted]["n_params"] == meta[model]["n_params"]
        assert meta[converted]["size"] < meta[model]["size"] / 2
