"""Lazy grammars (grammar_lazy, grammar_triggers, preserved_tokens) as llama-server b10621 runs
them: sampling is free until a trigger fires in the generated text, then the grammar constrains
everything from the trigger on. Greedy decoding of the embedded model makes the point exact: the
text before the trigger is the free run's, the text after it is the grammar's."""

from __future__ import annotations

import re

import pytest

from deployments.api.errors import ApiError
from deployments.api.schema import CompletionParams, ParseContext, parse_completion
from engine.triggers import TriggerScanner, compile_pattern
from engine.types import (
    TRIGGER_PATTERN,
    TRIGGER_PATTERN_FULL,
    TRIGGER_TOKEN,
    TRIGGER_WORD,
    FinalEvent,
    GenerationRequest,
    GrammarTrigger,
    SamplingParams,
)
from engine.vocab import load_vocab

from ..conftest import MODEL, batch_sizes, run_engine, running_engine
from ..serve.test_grammar import complete_all

# "def main():\n" greedily continues "    return codecs.CodecInfo(\n ...": " code" "c" "s" "."
GREEDY = {"prompt": "def main():\n", "n_predict": 32, "temperature": 0, "cache_prompt": False}
SELF = 278  # "self", one token; "    def __init__(" greedily continues with it


def lazy(grammar: str, *triggers: dict, **extra) -> dict:
    return {**GREEDY, "grammar": grammar, "grammar_lazy": True,
            "grammar_triggers": list(triggers), **extra}


def content(result: dict | list) -> str:
    if isinstance(result, list):  # the stream's partials carry the text
        return "".join(e["content"] for e in result)
    return result["content"]


@pytest.fixture(scope="module")
def free(base_url) -> str:
    [(status, result)] = complete_all(base_url, [GREEDY])
    assert status == 200 and result["content"].startswith("    return codecs.CodecInfo(")
    return result["content"]


CASES = {
    # the word starts inside the token " code": the grammar gets "codecs" on
    "word": (lazy('root ::= "codecs = 42"', {"type": TRIGGER_WORD, "value": "codecs"}),
             "codecs", "codecs = 42"),
    # fires on "return codecs.", the grammar starts at the first capture group
    "pattern": (lazy('root ::= [a-z]+ ".Lookup()"',
                     {"type": TRIGGER_PATTERN, "value": r"return (\w+)\."}),
                "codecs.", "codecs.Lookup()"),
    # anchored to the whole text: fires at the first token that makes all of it match
    "pattern_full": (lazy('root ::= "return 0\\n"',
                          {"type": TRIGGER_PATTERN_FULL, "value": r"[\s\S]*?(return)[\s\S]*"}),
                     "return", "return 0\n"),
}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("name", list(CASES))
def test_trigger_switches_the_grammar_on_exactly_there(base_url, free, name, stream):
    body, trigger_text, constrained = CASES[name]
    [(status, result)] = complete_all(base_url, [{**body, "stream": stream}])
    assert status == 200
    before = free[: free.index(trigger_text)]  # free up to the trigger, the grammar's after it
    assert content(result) == before + constrained
    final = result[-1] if stream else result
    assert final["stop_type"] == "eos"
    if not stream:
        settings = final["generation_settings"]
        assert settings["grammar_lazy"] is True
        assert settings["grammar_triggers"] == body["grammar_triggers"]


def test_no_trigger_no_grammar(base_url, free):
    """A trigger that never shows up, or a lazy grammar without triggers, leaves sampling free;
    a grammar that is not lazy constrains from the first token whatever the triggers say."""
    word = {"type": TRIGGER_WORD, "value": "never seen"}
    bodies = [lazy('root ::= "x"', word), {**GREEDY, "grammar": 'root ::= "x"',
                                           "grammar_lazy": True},
              {**GREEDY, "grammar": 'root ::= "x"', "grammar_triggers": [word]}]
    results = complete_all(base_url, bodies)
    assert [(s, r["content"]) for s, r in results] == [(200, free), (200, free), (200, "x")]


def test_token_trigger_needs_a_preserved_token(client):
    """A trigger word that is one token becomes a token trigger, which only a preserved token
    may be; it fires on that token id and the grammar starts with it."""
    body = lazy('root ::= "self):\\n"', {"type": TRIGGER_WORD, "value": "self"},
                prompt="    def __init__(", n_predict=16)
    r = client.post("/completion", json=body)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == ("Field 'grammar_triggers': Grammar trigger word "
                                            "should be marked as preserved token: self")
    free = client.post("/completion", json={**GREEDY, "prompt": body["prompt"],
                                            "n_predict": 16}).json()["content"]
    assert free.startswith("self, master")
    result = client.post("/completion", json={**body, "preserved_tokens": ["self", "a b c"]}).json()
    assert result["content"] == "self):\n"
    settings = result["generation_settings"]
    assert settings["preserved_tokens"] == [SELF]  # "a b c" is several tokens: dropped
    assert settings["grammar_triggers"] == [{"type": TRIGGER_TOKEN, "value": "self",
                                             "token": SELF}]


@pytest.mark.parametrize("stream", [False, True])
def test_preserved_token_is_rendered_as_text(base_url, stream):
    """A preserved special token is part of the text (llama.cpp renders it with special=true):
    here the end-of-sequence token the grammar ends on."""
    body = {**GREEDY, "grammar": 'root ::= "yes"', "stream": stream}
    results = complete_all(base_url, [body, {**body, "preserved_tokens": ["</s>"]}])
    assert [(s, content(r)) for s, r in results] == [(200, "yes"), (200, "yes</s>")]


@pytest.mark.parametrize("stream", [False, True])
def test_trigger_pattern_that_does_not_compile_is_refused(client, stream):
    body = lazy('root ::= "yes"', {"type": TRIGGER_PATTERN, "value": "(unclosed"},
                stream=stream)
    r = client.post("/completion", json=body)
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]["message"].startswith(
        "Failed to initialize samplers: invalid grammar trigger pattern '(unclosed': ")
    # not lazy, the triggers are not compiled (as in the reference)
    assert client.post("/completion", json={**body, "grammar_lazy": False}).status_code == 200


# ---- the request schema ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def ctx() -> ParseContext:
    vocab = load_vocab(MODEL)
    return ParseContext(tokenize=lambda text: vocab.tokenize(text, False, True))


@pytest.mark.parametrize("body, message", [
    ({"grammar_lazy": True, "grammar_triggers": []},
     "Field 'grammar_triggers': Error: no triggers set for lazy grammar!"),
    ({"grammar_triggers": [{"type": 7, "value": "x"}]},
     "Field 'grammar_triggers': Unknown grammar trigger type"),
    ({"grammar_triggers": ["x"]},
     "Field 'grammar_triggers': [json.exception.type_error.304] cannot use at() with string"),
    ({"grammar_triggers": [{"type": TRIGGER_WORD}]},
     "Field 'grammar_triggers': [json.exception.out_of_range.403] key 'value' not found"),
    ({"grammar_triggers": [{"type": TRIGGER_TOKEN, "value": "x"}]},
     "Field 'grammar_triggers': [json.exception.out_of_range.403] key 'token' not found"),
    ({"grammar_triggers": [{"type": "1", "value": "x"}]},
     "Field 'grammar_triggers': [json.exception.type_error.302] type must be number, but is "
     "string"),
    ({"preserved_tokens": [5]},
     "Field 'preserved_tokens': [json.exception.type_error.302] type must be string, but is "
     "number"),
])
def test_trigger_errors(ctx, body, message):
    with pytest.raises(ApiError) as info:
        parse_completion(body, ctx, CompletionParams())
    assert info.value.message == message


def test_trigger_parsing(ctx):
    """Entries read as nlohmann iterates them (a lone string is one entry); a word of several
    tokens stays a word; preserved ids come out ascending, once each."""
    params = parse_completion({"preserved_tokens": "self", "grammar_triggers": [
        {"type": TRIGGER_WORD, "value": "codecs"}, {"type": 1.9, "value": "self"},
        {"type": TRIGGER_TOKEN, "value": "", "token": 9}]}, ctx, CompletionParams())
    assert params.preserved_tokens == [SELF]
    assert params.grammar_triggers == [{"type": TRIGGER_WORD, "value": "codecs"},
                                       {"type": TRIGGER_TOKEN, "value": "self", "token": SELF},
                                       {"type": TRIGGER_TOKEN, "value": "", "token": 9}]
    assert not params.grammar_lazy
    twice = parse_completion({"preserved_tokens": ["self", "</s>", "self"]}, ctx,
                             CompletionParams())
    assert twice.preserved_tokens == [1, SELF]


# ---- the scanner ------------------------------------------------------------------------------
PIECES = {1: b"x = ", 2: b"<tool", 3: b"_call>", 4: b" {", 5: b"}\n", 6: b"done"}


def scan(triggers: list[GrammarTrigger], tokens: list[int]) -> tuple[int, bytes, list[int]]:
    """(tokens fed when it fired, head, whole tokens) or (-1, ...) when nothing fired."""
    scanner = TriggerScanner(triggers, PIECES.__getitem__)
    for n, token in enumerate(tokens, 1):
        fired = scanner.feed(token)
        if fired is not None:
            return n, fired.head, fired.tokens
    return -1, b"", []


def test_scanner_fires_where_llama_cpp_does():
    word = GrammarTrigger(TRIGGER_WORD, "tool_call")
    assert scan([word], [1, 2, 3, 4]) == (3, b"tool", [3])  # across tokens, from inside one
    assert scan([GrammarTrigger(TRIGGER_TOKEN, "", 4)], [1, 2, 4, 5]) == (3, b"", [4])
    group = GrammarTrigger(TRIGGER_PATTERN, r"<tool_call>\s*(\{)")
    assert scan([group], [1, 2, 3, 4, 5]) == (4, b"{", [])
    full = GrammarTrigger(TRIGGER_PATTERN_FULL, r"x = <tool_call>[\s\S]*")
    assert scan([full], [2, 1, 2, 3]) == (-1, b"", [])  # anchored at the start of the text
    assert scan([full], [1, 2, 3, 4]) == (3, b"", [1, 2, 3])  # no group: the whole match
    # "$" is the end of the text only, as in ECMAScript (Python's would match before a "\n")
    end = GrammarTrigger(TRIGGER_PATTERN, r"\}$")
    assert scan([end], [1, 5, 6]) == (-1, b"", [])
    # the first trigger in the request's order wins, not the leftmost match
    x, equals = GrammarTrigger(TRIGGER_WORD, "x"), GrammarTrigger(TRIGGER_WORD, "=")
    assert scan([equals, x], [1]) == (1, b"= ", [])
    assert scan([x, equals], [1]) == (1, b"", [1])

    # an ECMAScript \\uXXXX escape: ASCII anywhere, other characters as their UTF-8 bytes
    escaped = GrammarTrigger(TRIGGER_PATTERN, r"[\u0078-\u0079] \u003d|caf\u00e9+")
    assert scan([escaped], [1]) == (1, b"", [1])
    assert compile_pattern(r"caf\u00e9+").fullmatch("café".encode())
    with pytest.raises(re.error):
        compile_pattern(r"[\u00e9]")  # not in a class: refused before generation


# ---- a reasoning budget holds a lazy grammar off inside its tags (grammar_should_apply) ------
# "class Foo:\n" greedily opens a docstring, ' """Called by the class for the class ... class.',
# closes it with ' """', then goes on with "    def __init__(self, ...):\n        self.name"
DOCSTRING = {**GREEDY, "prompt": "class Foo:\n", "n_predict": 64}
TAGS = {"reasoning_budget_start_tag": ' """', "reasoning_budget_end_tags": [' """']}
DOTTED = {"type": TRIGGER_PATTERN, "value": r"(\w+)\."}


def test_reasoning_budget_holds_a_lazy_grammar_off_inside_its_tags(base_url):
    body = {**lazy('root ::= [a-z]+ ".x"', DOTTED), **DOCSTRING}
    results = complete_all(base_url, [DOCSTRING, body, {**body, **TAGS},
                                      {**body, **TAGS, "reasoning_budget_tokens": 40}])
    [free, untagged, tagged, budgeted] = [content(r) for _, r in results]
    assert all(status == 200 for status, _ in results)
    inside, after = free.index("class."), free.index("self.")
    assert free.index('"""') < inside < free.rindex('"""') < after
    # without tags the pattern fires in the docstring; with them (and no budget: an unlimited
    # one is made) the grammar is neither fed nor applied until the end tag
    assert untagged == free[:inside] + "class.x"
    assert tagged == budgeted == free[:after] + "self.x"


# ---- the engine: lazy and free sequences in one batch ------------------------------------------
@pytest.fixture(scope="module")
def engine():
    yield from running_engine(4)


def test_lazy_and_free_sequences_decode_together(engine):
    """Four sequences at once, two under lazy grammars (one fires, one never does): every step
    carries all four while they run, and until a trigger fires a lazy sequence decodes exactly
    as it does alone without a grammar."""
    prompt = engine.vocab.tokenize(GREEDY["prompt"], add_special=True)
    fires = [GrammarTrigger(TRIGGER_WORD, "codecs")]
    never = [GrammarTrigger(TRIGGER_PATTERN, "never (seen)")]

    def request(i: int, grammar: str = "", triggers: list | None = None) -> GenerationRequest:
        return GenerationRequest(prompt, SamplingParams(temperature=0.0), n_predict=24,
                                 grammar=grammar, grammar_lazy=triggers is not None,
                                 grammar_triggers=triggers or [], stream=True, index=i)

    alone = next(e for e in run_engine(engine, request(0)) if isinstance(e, FinalEvent))
    with batch_sizes(engine) as steps:
        events = run_engine(engine, request(0, 'root ::= "codecs = 42"', fires),
                            request(1, 'root ::= "x"', never), request(2), request(3))
    finals = {e.index: e for e in events if isinstance(e, FinalEvent)}
    assert max(steps) == 4
    assert finals[0].content == alone.content[: alone.content.index("codecs")] + "codecs = 42"
    assert finals[1].tokens == finals[2].tokens == finals[3].tokens == alone.tokens


def test_chat_route_keeps_the_template_values(client):
    """On /v1/chat/completions the reference overwrites the lazy fields with the chat template's
    (no tool-call grammar here): a client's grammar runs from the first token, preserved tokens
    stay special."""
    body = {"messages": [{"role": "user", "content": "Yes or no?"}], "grammar": 'root ::= "yes"',
            "grammar_lazy": True, "grammar_triggers": [{"type": TRIGGER_WORD, "value": "never"}],
            "preserved_tokens": ["</s>"], "temperature": 0, "max_tokens": 8}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"] == "yes"
