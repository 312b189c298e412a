"""The OpenAI-compatible routes through the real graph: the openai SDK against /v1, the shapes
of answers and chunks, the chat template, and the request fields mapped onto the native schema."""

from __future__ import annotations

import importlib.metadata
import json

import openai
import pytest

from .test_http import sse_events

GREEDY = {"temperature": 0, "cache_prompt": False}
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture()
def sdk(base_url):
    with openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def native_content(client, prompt: str, n: int) -> str:
    r = client.post("/completion", json={"prompt": prompt, "n_predict": n, **GREEDY})
    return r.json()["content"]


def test_sdk_completion_equals_native(sdk, client):
    out = sdk.completions.create(model="tiny-python", prompt="def main():\n", max_tokens=8,
                                 temperature=0, extra_body={"cache_prompt": False})
    assert out.object == "text_completion"
    assert out.choices[0].text == native_content(client, "def main():\n", 8)
    assert out.choices[0].finish_reason == "length"
    assert out.usage.completion_tokens == 8 and out.usage.prompt_tokens == 6
    assert out.usage.total_tokens == 14
    assert out.id.startswith("chatcmpl-")
    assert out.system_fingerprint == f"b10621-mlxray-{importlib.metadata.version('mlxray')}"


def test_sdk_chat_renders_the_models_template(sdk, client):
    prompt = client.post("/apply-template", json={"messages": HELLO}).json()["prompt"]
    assert prompt == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    out = sdk.chat.completions.create(model="tiny-python", messages=HELLO, max_tokens=6,
                                      temperature=0, extra_body={"cache_prompt": False})
    assert out.object == "chat.completion"
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == native_content(client, prompt, 6)
    assert out.usage.prompt_tokens == 33  # as the reference's oai_chat capture
    counted = client.post("/v1/chat/completions/input_tokens", json={"messages": HELLO}).json()
    assert counted == {"input_tokens": 33}


def test_sdk_chat_stream_with_usage(sdk, client):
    chunks = list(sdk.chat.completions.create(
        model="tiny-python", messages=HELLO, max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"cache_prompt": False}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    prompt = client.post("/apply-template", json={"messages": HELLO}).json()["prompt"]
    assert text == native_content(client, prompt, 6)
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finals] == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)


def test_sdk_completion_stream(sdk, client):
    chunks = list(sdk.completions.create(model="tiny-python", prompt="import os\n",
                                         max_tokens=5, temperature=0, stream=True,
                                         extra_body={"cache_prompt": False}))
    assert "".join(c.choices[0].text for c in chunks) == native_content(client, "import os\n", 5)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 5


def test_stream_ends_with_done(client):
    for path, body in (("/v1/completions", {"prompt": "x = 1\n"}),
                       ("/chat/completions", {"messages": HELLO})):
        r = client.post(path, json={**body, "max_tokens": 3, "stream": True, **GREEDY})
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.text.endswith("data: [DONE]\n\n")
        assert "data: [DONE]" not in r.text[:-len("data: [DONE]\n\n")]


def test_sdk_models_list(sdk):
    models = sdk.models.list()
    assert [m.id for m in models.data] == ["tiny-python"]


def test_chat_logprobs_parse_in_the_sdk(sdk):
    out = sdk.chat.completions.create(model="tiny-python", messages=HELLO, max_tokens=3,
                                      temperature=0, logprobs=True, top_logprobs=2,
                                      extra_body={"cache_prompt": False})
    content = out.choices[0].logprobs.content
    assert len(content) == 3
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)
    assert content[0].token == content[0].top_logprobs[0].token  # greedy: the top candidate


def test_completion_logprobs(client):
    body = {"prompt": "def main():\n", "max_tokens": 2, "logprobs": 3, **GREEDY}
    choice = client.post("/v1/completions", json=body).json()["choices"][0]
    assert len(choice["logprobs"]["content"]) == 2
    assert len(choice["logprobs"]["content"][0]["top_logprobs"]) == 3


def test_n_choices(sdk):
    out = sdk.chat.completions.create(model="tiny-python", messages=HELLO, max_tokens=4,
                                      temperature=0, n=2, extra_body={"cache_prompt": False})
    assert [c.index for c in out.choices] == [0, 1]
    assert out.choices[0].message.content == out.choices[1].message.content
    assert out.usage.completion_tokens == 8


def test_assistant_prefill_and_parts(client):
    messages = [{"role": "system", "content": [{"type": "text", "text": "a"},
                                               {"type": "text", "text": "b"}]},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "def"}]
    prompt = client.post("/apply-template", json={"messages": messages}).json()["prompt"]
    assert prompt == ("<|im_start|>system\na\nb<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                      "<|im_start|>assistant\ndef")


@pytest.mark.parametrize(("path", "body", "message"), [
    ("/v1/chat/completions", {"max_tokens": 2},
     "[json.exception.out_of_range.403] key 'messages' not found"),
    ("/v1/chat/completions", {"messages": "hi"}, "Expected 'messages' to be an array, got string"),
    ("/v1/chat/completions", {"messages": HELLO, "top_logprobs": 2},
     "top_logprobs requires logprobs to be set to true"),
    ("/v1/chat/completions", {"messages": HELLO, "max_tokens": -2},
     "Field 'max_tokens': Value must be between -1 <= value <= 2147483647, but got -2"),
    ("/v1/chat/completions", {"messages": HELLO, "n": 9},
     "Field 'n': Value must be between 1 <= value <= 4, but got 9"),
    ("/v1/completions", {"prompt": "x", "best_of": 2}, "Unsupported param: best_of"),
    ("/v1/completions", {"max_tokens": 2},
     "[json.exception.out_of_range.403] key 'prompt' not found"),
])
def test_request_errors(client, path, body, message):
    r = client.post(path, json=body)
    assert r.status_code == 400
    assert r.json() == {"error": {"code": 400, "message": message,
                                  "type": "invalid_request_error"}}


@pytest.mark.parametrize("path", ["/chat/completions", "/chat/completions/input_tokens"])
def test_unprefixed_routes_are_the_v1_routes(client, path):
    """The reference mounts each chat route twice; both answer the same (ids and times aside)."""
    body = {"messages": HELLO, "max_tokens": 4, **GREEDY}
    answers = [client.post(p, json=body).json() for p in (path, "/v1" + path)]
    for answer in answers:
        for key in ("id", "created"):
            answer.pop(key, None)
        answer.get("timings", {}).clear()
    assert answers[0] == answers[1]
    if path.endswith("input_tokens"):
        assert answers[0] == {"input_tokens": 33}
    else:
        assert answers[0]["choices"][0]["message"]["content"] == native_content(
            client, client.post("/apply-template", json={"messages": HELLO}).json()["prompt"], 4)


def test_tools_on_a_template_without_tool_calls_are_plain_content(client):
    """The model's own ChatML template renders no tools: as the reference, the tools are
    ignored (even required is not enforced) and the output is content (spec §5)."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    body = {"messages": HELLO, "max_tokens": 4, **GREEDY}
    plain = client.post("/v1/chat/completions", json=body).json()
    r = client.post("/v1/chat/completions", json={**body, "tools": tools,
                                                  "tool_choice": "required"})
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"] == plain["choices"][0]["message"]


def test_verbose_and_timings_per_token(client):
    body = {"messages": HELLO, "max_tokens": 2, "verbose": True, **GREEDY}
    out = client.post("/v1/chat/completions", json=body).json()
    assert out["__verbose"]["tokens_predicted"] == 2
    body = {**body, "verbose": False, "stream": True, "timings_per_token": True}
    raw = client.post("/v1/chat/completions", json=body).text
    events = sse_events(raw.removesuffix("data: [DONE]\n\n"))
    content = [e for e in events if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert content and all("timings" in e for e in content)


def test_native_routes_keep_their_shape(client):
    body = {"prompt": "def main():\n", "n_predict": 2, **GREEDY}
    assert "choices" not in client.post("/completion", json=body).json()
    raw = client.post("/completions", json={**body, "stream": True}).text
    assert "[DONE]" not in raw and json.loads(raw.split("data: ")[1])["index"] == 0


def test_reasoning_budget_fields_on_the_openai_routes(sdk):
    """The model's template has no thinking tags, so the reference passes the body's budget fields
    through to the sampler on both routes, as on /completion (tests/serve/test_fields.py)."""
    budget = {"cache_prompt": False, "reasoning_budget_tokens": 0,
              "reasoning_budget_start_tag": "import", "reasoning_budget_end_tags": ["\n"],
              "reasoning_budget_message": " os"}
    # greedily "\nimport sys\nimport sys...": each "import" opens the budget, forcing " os\n"
    chat = sdk.chat.completions.create(model="tiny-python", messages=HELLO, max_tokens=7,
                                       temperature=0, extra_body=budget)
    assert chat.choices[0].message.content == "\nimport os\nimport os\n"
    text = sdk.completions.create(model="tiny-python", prompt="def main():\n", max_tokens=7,
                                  temperature=0, extra_body={
                                      **budget, "reasoning_budget_start_tag": " return",
                                      "reasoning_budget_tokens": 3, "reasoning_budget_message":
                                      " None"})
    assert text.choices[0].text == "    return codecs None\n"
