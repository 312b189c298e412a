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

from deployments.api.build_info import BUILD_INFO
from deployments.api.errors import ApiError, invalid
from deployments.api.model_entries import oai_entry, router_entry
from deployments.api.prometheus import (  # noqa: F401 - METRIC_HELP is read from here too
    METRIC_HELP,
    combined_values,
    disk_metric_values,
    exposition,
    labelled_exposition,
    metric_values,
)
from deployments.api.shapes import generation_settings
from deployments.serve import replicas
from deployments.serve.app import error_response, json_response, read_object
from deployments.serve.endpoint import IngressBase, ModelEndpoint
from deployments.serve.routes import router_mode
from deployments.serve.status import COUNTERS, sum_counters
from engine.gguf import is_gguf

NO_REPLICA = "no replica of the model answered"
MEDIA_MARKER = "<__media_" + "".join(
    secrets.choice(string.ascii_letters + string.digits) for _ in range(32)) + "__>"


# ---- props ---------------------------------------------------------------------------------
async def props(ingress: IngressBase, request: Request) -> Response:
    await ingress.guard(request)
    if ingress.router is not None and not request.query_params.get("model"):
        return router_mode.props(ingress)
    model = await ingress.model_of(None, request)
    info = await model.model_info()
    args = model.args
    # a fresh task_params, as the reference builds it: reasoning_format is "none" there
    defaults = replace(model.defaults, reasoning_format="none")
    return json_response({
        "default_generation_settings": {
            "params": generation_settings(defaults, only_metrics=True),
            "n_ctx": args.n_ctx,
        },
        "total_slots": args.n_parallel * await replicas.replica_count(model, ingress.board),
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
        "is_sleeping": await _sleeping(model),
        "cors_proxy_enabled": False,
    })


async def _sleeping(model: ModelEndpoint) -> bool:
    """Whether the model is asleep (--sleep-idle-seconds): asked only where it can sleep."""
    if model.args.sleep_idle_seconds <= 0:
        return False
    return (await model.replica.state.remote())["status"] == "sleeping"


PROPS_OFF = ("This server does not support changing global properties. Start it with "
             "`--props`")


async def set_props(ingress: IngressBase, request: Request) -> Response:
    await ingress.guard(request)
    if not any(m.args.props for m in ingress.models):
        raise ApiError(PROPS_OFF, "not_supported_error")
    body = await read_object(request, ingress.args.max_body_bytes)
    if not (await ingress.model_of(body, request)).args.props:
        raise ApiError(PROPS_OFF, "not_supported_error")
    return json_response({"success": True})  # as the reference: accepted, nothing changes


# ---- models --------------------------------------------------------------------------------
async def models(ingress: IngressBase, request: Request) -> Response:
    """The single-model body of the reference, with one entry per model in both lists, in the
    application's order (the default first), each followed by its LoRA adapters (a request's
    ``model`` may name one)."""
    await ingress.guard(request)
    created = int(time.time())
    if ingress.router is not None:  # the reference's router: every model with its status
        states = ingress.router.states
        return json_response({"data": [router_entry(m.args, states[m.name], created)
                                       for m in ingress.models], "object": "list"})
    infos = [await model.model_info() for model in ingress.models]
    named = [(model, info, name) for model, info in zip(ingress.models, infos)
             for name in (model.name, *(a.name for a in model.adapters.adapters))]
    data = [oai_entry(model.args, info, created, name) for model, info, name in named]
    return json_response({
        "models": [_ollama_entry(name, model) for model, _, name in named],
        "object": "list",
        "data": data,
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


# ---- slots ---------------------------------------------------------------------------------
def _slot_json(state: dict, global_id: int) -> dict:
    out = {"id": global_id, "n_ctx": state["n_ctx"], "speculative": state.get("speculative", False),
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
    """Every replica's slots, by global id (deployments/serve/replicas.py); with several
    replicas each also names its ``replica`` and ``node``."""
    await ingress.guard(request)
    model = await ingress.model_of(None, request)
    if not model.args.slots:
        raise ApiError("This server does not support slots endpoint. Start it with `--slots`",
                       "not_supported_error")
    answers = await replicas.ask_each(model, ingress.board, "slot_states")
    if not answers:
        raise ApiError(NO_REPLICA, "unavailable_error")
    several = len(answers) > 1 or answers[0].place > 0
    out = []
    for answer in answers:
        for state in answer.answer:
            slot = _slot_json(state, answer.place * model.args.n_parallel + state["id"])
            if several:
                slot.update(replica=answer.replica, node=answer.node)
            out.append(slot)
    if request.query_params.get("fail_on_no_slot") and all(s["is_processing"] for s in out):
        raise ApiError("no slot available", "unavailable_error")
    return json_response(out)


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
    model = await ingress.model_of(body, request)
    if not model.args.slot_save_path:
        raise ApiError(SLOT_ACTIONS_OFF, "not_supported_error")
    path, filename = (None, "") if body is None else _slot_file(model, body)
    answer = await _owner_does(ingress, model, slot_id, action, path, filename)
    if "error" in answer:
        err = answer["error"]
        return error_response(ApiError(err["message"], err["type"], err["code"]))
    return json_response({**answer["result"], "id_slot": slot_id})


async def _owner_does(ingress: IngressBase, model: ModelEndpoint, slot_id: int, action: str,
                      path: str | None, filename: str) -> dict:
    """The action done by the replica holding global slot ``slot_id``, on its local slot; the
    file is that replica's node's (docs/deploy.md: a shared folder across nodes)."""
    targets = await replicas.live(model.name, ingress.board)
    if not targets:  # one replica, no board: its own slot ids
        call = model.replica.ask.remote("slot_action", slot_id, action, path, filename)
        return (await call)["answer"]
    found = replicas.owner(targets, slot_id, model.args.n_parallel)
    if found is None:
        raise invalid("Invalid slot ID")
    target, local = found
    answer = await model.replica.ask.remote("slot_action", local, action, path, filename,
                                            replica=target["replica"])
    return answer["answer"]


# ---- metrics -------------------------------------------------------------------------------
async def metrics(ingress: IngressBase, request: Request) -> Response:
    """The model's metrics summed over its replicas (deployments/api/prometheus.py says how);
    ``?per_replica=1``: one sample per live replica, labelled with its replica, node and rank."""
    await ingress.guard(request)
    model = await ingress.model_of(None, request)
    if not model.args.metrics:
        raise ApiError("This server does not support metrics endpoint. Start it with "
                       "`--metrics`", "not_supported_error")
    answers = await replicas.ask_each(model, ingress.board, "metrics")
    if not answers:
        raise ApiError(NO_REPLICA, "unavailable_error")
    fresh = {a.replica: {k: a.answer[k] for k in COUNTERS} for a in answers}
    totals = (await ingress.board.count.remote(model.name, fresh)  # remembered, gone ones too
              if ingress.board is not None else sum_counters(fresh.values()))
    if request.query_params.get("per_replica"):
        text = labelled_exposition([
            ({"replica": a.replica, "node": a.node, "rank": str(a.rank)}, metric_values(a.answer))
            for a in answers])
    else:
        text = exposition(combined_values(totals, [a.answer for a in answers]),
                          disk_metric_values(totals, model.args.cache_disk))
    return Response(text, media_type="text/plain; version=0.0.4",
                    headers={"Process-Start-Time-Unix": str(int(ingress.started))})
