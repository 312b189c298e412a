"""Server information routes: /props, /models and /v1/models, /slots, /metrics.

/models lists every model of the application; /props, /slots and /metrics answer for one, the
``model`` query parameter's (POST: the body's ``model``), the first by default."""

from __future__ import annotations

import secrets
import string
import time
from dataclasses import replace
from pathlib import Path

from fastapi import Request
from fastapi.responses import Response

from deployments.api.config import BUILD_INFO
from deployments.api.errors import ApiError, invalid
from deployments.api.shapes import generation_settings
from deployments.serve.app import error_response, json_response, read_object
from deployments.serve.endpoint import IngressBase, ModelEndpoint
from engine.gguf import is_gguf

MEDIA_MARKER = "<__media_" + "".join(
    secrets.choice(string.ascii_letters + string.digits) for _ in range(32)) + "__>"


# ---- props ---------------------------------------------------------------------------------
async def props(ingress: IngressBase, request: Request) -> Response:
    await ingress.guard(request)
    model = ingress.model_of(None, request)
    info = await model.model_info()
    args = model.args
    # a fresh task_params, as the reference builds it: reasoning_format is "none" there
    defaults = replace(model.defaults, reasoning_format="none")
    return json_response({
        "default_generation_settings": {
            "params": generation_settings(defaults, only_metrics=True),
            "n_ctx": args.n_ctx,
        },
        "total_slots": args.n_parallel,
        "model_alias": args.model_name,
        "model_ftype": info["ftype"],
        "model_path": args.model_path,
        "modalities": {"vision": False, "video": False, "audio": False},
        "media_marker": MEDIA_MARKER,
        "endpoint_slots": args.slots,
        "endpoint_props": args.props,
        "endpoint_metrics": args.metrics,
        "ui": ingress.args.webui,
        "ui_settings": {},
        "chat_template": model.chat.source,
        "chat_template_caps": model.chat.caps(),
        "bos_token": info["bos_token"],
        "eos_token": info["eos_token"],
        "build_info": BUILD_INFO,
        "is_sleeping": False,
        "cors_proxy_enabled": False,
    })


PROPS_OFF = ("This server does not support changing global properties. Start it with "
             "`--props`")


async def set_props(ingress: IngressBase, request: Request) -> Response:
    await ingress.guard(request)
    if not any(m.args.props for m in ingress.models):
        raise ApiError(PROPS_OFF, "not_supported_error")
    body = await read_object(request, ingress.args.max_body_bytes)
    if not ingress.model_of(body, request).args.props:
        raise ApiError(PROPS_OFF, "not_supported_error")
    return json_response({"success": True})  # as the reference: accepted, nothing changes


# ---- models --------------------------------------------------------------------------------
async def models(ingress: IngressBase, request: Request) -> Response:
    """The single-model body of the reference, with one entry per model in both lists, in the
    application's order (the default first), each followed by its LoRA adapters (a request's
    ``model`` may name one)."""
    await ingress.guard(request)
    infos = [await model.model_info() for model in ingress.models]
    created = int(time.time())
    named = [(model, info, name) for model, info in zip(ingress.models, infos)
             for name in (model.name, *(a.name for a in model.adapters.adapters))]
    return json_response({
        "models": [_ollama_entry(name, model) for model, _, name in named],
        "object": "list",
        "data": [_oai_entry(model, info, created, name) for model, info, name in named],
    })


def _ollama_entry(name: str, model: ModelEndpoint) -> dict:
    file_format = "gguf" if is_gguf(model.args.model_path) else "mlx"
    return {
        "name": name, "model": name, "modified_at": "", "size": "", "digest": "",
        "type": "model", "description": "", "tags": [""], "capabilities": ["completion"],
        "parameters": "",
        "details": {"parent_model": "", "format": file_format, "family": "", "families": [""],
                    "parameter_size": "", "quantization_level": ""},
    }


def _oai_entry(model: ModelEndpoint, info: dict, created: int, name: str) -> dict:
    """A model's entry, or one of its adapters' (the model's figures, no aliases)."""
    args = model.args
    return {
        "id": name,
        "aliases": [args.alias] if args.alias and name == model.name else [],
        "tags": [],
        "object": "model",
        "created": created,
        "owned_by": "llamacpp",
        "meta": {
            "vocab_type": True,  # b10621 writes the vocabulary type as a boolean
            "n_vocab": info["n_vocab"],
            "n_ctx": args.n_ctx,
            "n_ctx_train": info["n_ctx_train"],
            "n_embd": info["n_embd"],
            "n_params": info["n_params"],
            "size": info["size"],
            "ftype": info["ftype"],
        },
    }


# ---- slots ---------------------------------------------------------------------------------
def _slot_json(state: dict) -> dict:
    out = {"id": state["id"], "n_ctx": state["n_ctx"], "speculative": False,
           "is_processing": state["is_processing"]}
    task = state["task"]
    if task is None:
        return out
    n_predict = task["n_predict"]
    params = task["tag"]
    out.update({
        "id_task": task["id"],
        "n_prompt_tokens": task["n_prompt"],
        "n_prompt_tokens_processed": task["n_prompt_processed"],
        "n_prompt_tokens_cache": task["n_cache"],
        "params": generation_settings(params, only_metrics=True) if params is not None else {},
        "next_token": [{
            "has_next_token": task["has_next_token"],
            "has_new_line": task["has_new_line"],
            "n_remain": n_predict - task["n_decoded"] if n_predict >= 0 else -1,
            "n_decoded": task["n_decoded"],
        }],
    })
    return out


async def slots(ingress: IngressBase, request: Request) -> Response:
    await ingress.guard(request)
    model = ingress.model_of(None, request)
    if not model.args.slots:
        raise ApiError("This server does not support slots endpoint. Start it with `--slots`",
                       "not_supported_error")
    states = await model.replica.slot_states.remote()
    if request.query_params.get("fail_on_no_slot") and all(s["is_processing"] for s in states):
        raise ApiError("no slot available", "unavailable_error")
    return json_response([_slot_json(s) for s in states])


def _slot_file(model: ModelEndpoint, body: dict) -> tuple[str, str]:
    filename = body.get("filename")
    if not isinstance(filename, str):
        raise invalid("Invalid filename")
    if not valid_filename(filename):
        raise invalid("Invalid filename")
    folder = Path(model.args.slot_save_path).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    path = (folder / filename).resolve()
    if path.parent != folder:  # a link or name that leaves the folder
        raise invalid("Invalid filename")
    return str(path), filename


def valid_filename(name: str) -> bool:
    """llama.cpp's fs_validate_filename, in short: one plain path component, no escapes."""
    if not name or len(name) > 255 or name in (".", "..") or name.startswith((".", " ")):
        return False
    if name.endswith((" ", ".")):
        return False
    return not any(c in name for c in '/\\:*?"<>|') and all(ord(c) >= 32 for c in name)


SLOT_ACTIONS_OFF = "This server does not support slots action. Start it with `--slot-save-path`"


async def slot_action(ingress: IngressBase, request: Request, id_slot: str) -> Response:
    """save and restore name their model in the body, erase (no body) in the query."""
    await ingress.guard(request)
    if not any(m.args.slot_save_path for m in ingress.models):
        raise ApiError(SLOT_ACTIONS_OFF, "not_supported_error")
    try:
        slot_id = int(id_slot)
    except ValueError:
        raise invalid("Invalid slot ID") from None
    action = request.query_params.get("action", "")
    if action not in ("save", "restore", "erase"):
        raise invalid("Invalid action")
    body = None if action == "erase" else await read_object(request, ingress.args.max_body_bytes)
    model = ingress.model_of(body, request)
    if not model.args.slot_save_path:
        raise ApiError(SLOT_ACTIONS_OFF, "not_supported_error")
    path, filename = (None, "") if body is None else _slot_file(model, body)
    answer = await model.replica.slot_action.remote(slot_id, action, path, filename)
    if "error" in answer:
        err = answer["error"]
        return error_response(ApiError(err["message"], err["type"], err["code"]))
    return json_response(answer["result"])


# ---- metrics -------------------------------------------------------------------------------
# the reference's metrics in its order (counters, then gauges) with its help texts
METRIC_HELP = {
    "prompt_tokens_total": ("counter", "Number of prompt tokens processed."),
    "prompt_tokens_cached_total": ("counter", "Number of prompt tokens taken from the cache."),
    "prompt_seconds_total": ("counter", "Prompt process time"),
    "tokens_predicted_total": ("counter", "Number of generation tokens processed."),
    "tokens_predicted_seconds_total": ("counter", "Predict process time"),
    "n_decode_total": ("counter", "Total number of llama_decode() calls"),
    "n_tokens_max": ("counter", "Largest observed n_tokens."),
    "spec_decode_num_draft_tokens_total": ("counter", "Number of speculative draft tokens."),
    "spec_decode_num_accepted_tokens_total": ("counter",
                                              "Number of accepted speculative draft tokens."),
    "spec_decode_num_drafts_total": ("counter", "Number of speculative drafts."),
    "prompt_tokens_seconds": ("gauge", "Average prompt throughput in tokens/s."),
    "predicted_tokens_seconds": ("gauge", "Average generation throughput in tokens/s."),
    "requests_processing": ("gauge", "Number of requests processing."),
    "requests_deferred": ("gauge", "Number of requests deferred."),
    "n_busy_slots_per_decode": ("gauge", "Average number of busy slots per llama_decode() call"),
}
# mlxray's own, after the reference's and only with --cache-disk: the default text stays its
DISK_METRIC_HELP = {
    "cache_disk_hits_total": ("counter", "Number of prompts whose cache was read from the disk "
                                         "tier (--cache-disk)."),
    "prompt_tokens_cache_disk_total": ("counter", "Number of prompt tokens read from the disk "
                                                  "tier (counted in prompt_tokens_cached_total "
                                                  "too)."),
}


def metric_values(m: dict) -> dict[str, float]:
    """The reference's values from the engine's snapshot; the throughput gauges cover the time
    since the previous scrape."""
    return {
        "prompt_tokens_total": m["prompt_tokens_total"],
        "prompt_tokens_cached_total": m["prompt_tokens_cached_total"],
        "prompt_seconds_total": m["prompt_seconds_total"],
        "tokens_predicted_total": m["tokens_predicted_total"],
        "tokens_predicted_seconds_total": m["tokens_predicted_seconds_total"],
        "n_decode_total": m["n_decode_total"],
        "n_tokens_max": m["n_tokens_max"],
        "spec_decode_num_draft_tokens_total": 0,
        "spec_decode_num_accepted_tokens_total": 0,
        "spec_decode_num_drafts_total": 0,
        "n_busy_slots_per_decode": m["n_busy_slots_total"] / max(1, m["n_decode_total"]),
        "prompt_tokens_seconds": (m["bucket_prompt_tokens"] / m["bucket_prompt_seconds"]
                                  if m["bucket_prompt_seconds"] > 0 else 0.0),
        "predicted_tokens_seconds": (m["bucket_predicted_tokens"] / m["bucket_predicted_seconds"]
                                     if m["bucket_predicted_seconds"] > 0 else 0.0),
        "requests_processing": m["n_processing"],
        "requests_deferred": m["n_deferred"],
    }


def exposition(values: dict[str, float], own: dict[str, float] | None = None) -> str:
    """Prometheus text as the reference writes it: HELP, TYPE and the sample of each metric,
    the value as C++'s ostream prints a double (%g: six significant digits); then mlxray's
    ``own`` metrics, prefixed ``mlxray:``."""
    lines = []
    for prefix, helps, vals in (("llamacpp", METRIC_HELP, values),
                                ("mlxray", DISK_METRIC_HELP, own or {})):
        for name, (kind, help_text) in helps.items():
            if name in vals:
                lines += [f"# HELP {prefix}:{name} {help_text}",
                          f"# TYPE {prefix}:{name} {kind}",
                          f"{prefix}:{name} {float(vals[name]):g}"]
    return "\n".join(lines) + "\n"


def disk_metric_values(m: dict, cache_disk: str | None) -> dict[str, float]:
    """The disk tier's counters, none without one."""
    return {name: m.get(name, 0) for name in DISK_METRIC_HELP} if cache_disk else {}


async def metrics(ingress: IngressBase, request: Request) -> Response:
    await ingress.guard(request)
    model = ingress.model_of(None, request)
    if not model.args.metrics:
        raise ApiError("This server does not support metrics endpoint. Start it with "
                       "`--metrics`", "not_supported_error")
    snapshot = await model.replica.metrics.remote()
    text = exposition(metric_values(snapshot),
                      disk_metric_values(snapshot, model.args.cache_disk))
    return Response(text, media_type="text/plain; version=0.0.4",
                    headers={"Process-Start-Time-Unix": str(int(ingress.started))})
