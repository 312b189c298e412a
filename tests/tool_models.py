"""Test models for tool calling: the embedded model's weights with a tokenizer whose vocabulary
has the tool-call and reasoning markers of every format as special tokens (so triggers are
single tokens, markers are preserved tokens and their text is special-token text), and chat
templates in each family's style written for the tests (tests/fixtures/templates)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from .conftest import MODEL

TEMPLATES = Path(__file__).resolve().parent / "fixtures" / "templates"
MARKERS = (
    "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "</think>",
    "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[INST]", "[/INST]",
    "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜User｜>",
    "<｜Assistant｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<|channel|>",
    "<|message|>", "<|start|>", "<|end|>", "<|constrain|>", "<|call|>", "<|return|>",
    "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>",
    "[ARGS]", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
    "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<minimax:tool_call>",
    "</minimax:tool_call>",
)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get weather",
    "parameters": {"type": "object", "properties": {
        "location": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["location"]}}}


# the README's tool: the model picks the city and the unit
CITIES = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome", "Tokyo"]},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"]}}}


def forced(tool: dict, **values: str) -> dict:
    """``tool`` whose arguments can only be ``values`` (enums of one, all required), so a
    grammar-constrained call is fully determined."""
    function = tool["function"]
    props = {k: {"type": "string", "enum": [v]} for k, v in values.items()}
    params = {"type": "object", "properties": props, "required": list(values)}
    return {"type": "function", "function": {**function, "parameters": params}}


def build_marker_model(folder: Path) -> Path:
    """The embedded model's files with MARKERS as special tokens: each takes the id of a token
    no BPE merge builds on (its own merge dropped), so the vocabulary keeps its size."""
    folder.mkdir(parents=True, exist_ok=True)
    source = Path(MODEL)
    for name in ("config.json", "generation_config.json", "model.safetensors",
                 "special_tokens_map.json"):
        shutil.copy(source / name, folder / name)
    tokenizer = json.loads((source / "tokenizer.json").read_text())
    model = tokenizer["model"]
    parts = {p for merge in model["merges"] for p in merge}
    by_id = {i: s for s, i in model["vocab"].items()}
    free = [i for i in sorted(by_id, reverse=True) if by_id[i] not in parts]
    for marker, token_id in zip(MARKERS, free):
        old = by_id[token_id]
        del model["vocab"][old]
        model["vocab"][marker] = token_id
        model["merges"] = [m for m in model["merges"] if "".join(m) != old]
        tokenizer["added_tokens"].append({
            "id": token_id, "content": marker, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": False, "special": True})
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    config = json.loads((source / "tokenizer_config.json").read_text())
    for entry in tokenizer["added_tokens"]:
        config["added_tokens_decoder"][str(entry["id"])] = {
            k: entry[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word",
                                  "special")}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False))
    return folder


def template(name: str) -> str:
    return str(TEMPLATES / f"{name}.jinja")
