"""engine/sampler_fields.py: one row per numeric sampler setting, and everything derived from it
(the request schema, both dataclasses, the server-default keys, the command's options, the
generation_settings order), so adding a setting is one row and none of them can miss it."""

from __future__ import annotations

from dataclasses import fields

from deployments.api.defaults import SAMPLING_KEYS, server_defaults
from deployments.api.json_values import f32
from deployments.api.schema import FIELDS, CompletionParams
from deployments.api.shapes import generation_settings
from deployments.cli import command
from deployments.cli import sampling as cli_sampling
from engine.sampler_fields import BREAKERS_SETTING, SAMPLER_FIELDS
from engine.types import SamplingParams

ROWS = {f.name: f for f in SAMPLER_FIELDS}


def test_every_row_reaches_every_place():
    schema = {f.name: f for f in FIELDS}
    engine = {f.name: f.default for f in fields(SamplingParams)}
    api = {f.name: f.default for f in fields(CompletionParams)}
    options = {o.dest: o for o in cli_sampling.options(command.Option)}
    settings = list(generation_settings(CompletionParams()))
    for row in SAMPLER_FIELDS:
        spec = schema[row.name]
        assert (spec.kind, spec.soft, spec.hard) == (row.kind, row.soft, row.hard), row.name
        assert engine[row.name] == row.default, row.name
        assert api[row.name] == (f32(row.default) if row.kind == "float" else row.default)
        assert row.name in settings, row.name
        if row.flags:
            assert row.name in SAMPLING_KEYS
            option = options[row.option_dest]
            assert (option.flags, option.env) == (row.flags, row.env)
            assert str(row.default) in option.help
            assert cli_sampling.FIELDS[row.option_dest] == row.name


def test_the_orders_are_the_references():
    """The schema keeps the reference's field order; generation_settings its key order, with
    dry_sequence_breakers where task_params::to_json puts it."""
    names = [f.name for f in FIELDS]
    block = names[names.index("top_k"):names.index("top_k") + len(SAMPLER_FIELDS)]
    assert block == list(ROWS)
    settings = list(generation_settings(CompletionParams()))
    placed = sorted(SAMPLER_FIELDS, key=lambda f: f.settings)
    before = [f.name for f in placed if f.settings < BREAKERS_SETTING]
    after = [f.name for f in placed if f.settings > BREAKERS_SETTING]
    assert settings[:len(before) + len(after) + 2] == ["seed", *before, "dry_sequence_breakers",
                                                      *after]
    assert "dry_sequence_breakers" not in generation_settings(CompletionParams(), True)


def test_an_option_lands_on_its_row():
    """--top-k 7 is the server default of top_k, as a request's own top_k would be."""
    ns = command.parse(["--top-k", "7", "--mirostat-lr", "0.2"], {})
    sampling = cli_sampling.sampling_fields(ns, ns.argv)
    assert sampling == {"top_k": 7, "mirostat_eta": 0.2}
    params = server_defaults(sampling, 0.8, 0, -1)
    assert (params.top_k, params.mirostat_eta) == (7, f32(0.2))
    refused = cli_sampling.options(command.Option)
    check = next(o.check for o in refused if o.dest == "repeat_penalty")
    assert check(0.0) == "error: repeat-penalty must be finite and greater than 0"
