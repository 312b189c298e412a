"""The web page at ``/`` (on by default, as llama-server's UI; ``--no-webui`` or ``webui: false``
turns it off and ``/`` answers 404 as an unknown route) and mlxray's ``GET /mlxray/status``, which
gathers every model replica's state for the page's status view (deployments/serve/status.py).

With ``--path`` (``static_path``) the folder's files are served at / instead (index.html at /,
others by path, never outside the folder, 404 otherwise), as llama-server's static mount.

The page and its assets are public when an API key is set, as the reference keeps its UI assets
public; the page asks for the key and sends it with its API calls, so the status route is not."""

from __future__ import annotations

import asyncio
import html
from pathlib import Path

from fastapi import Request
from fastapi.responses import FileResponse, Response
from ray import serve
from starlette.exceptions import HTTPException

from deployments.api.deployment_names import replica_deployment
from deployments.serve.app import json_response
from deployments.serve.endpoint import IngressBase

WEBUI = Path(__file__).resolve().parent.parent / "webui"
ASSETS = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
NO_CACHE = {"cache-control": "no-cache"}


def _file(name: str) -> bytes:
    return (WEBUI / name).read_bytes()


async def page(ingress: IngressBase, request: Request) -> Response:
    if not ingress.args.webui:
        raise HTTPException(404)
    if ingress.args.static_path:
        return await static_file(ingress, request, "index.html")
    # the page's relative URLs resolve under the application's route prefix (--api-prefix)
    base = html.escape(request.scope.get("root_path", "").rstrip("/") + "/", quote=True)
    text = _file("index.html").replace(b"<!--base-->", f'<base href="{base}">'.encode())
    return Response(text, media_type="text/html; charset=utf-8", headers=NO_CACHE)


async def asset(ingress: IngressBase, request: Request, name: str) -> Response:
    if ingress.args.webui and ingress.args.static_path:
        return await static_file(ingress, request, f"webui/{name}")
    if not ingress.args.webui or name not in ASSETS:
        raise HTTPException(404)
    return Response(_file(name), media_type=ASSETS[name], headers=NO_CACHE)


async def static_file(ingress: IngressBase, request: Request, path: str) -> Response:
    """A file of the --path folder (a folder's index.html for a folder); any other path, or no
    --path, answers 404 as an unknown route."""
    folder = ingress.args.static_path
    if not ingress.args.webui or not folder:
        raise HTTPException(404)
    root = Path(folder).resolve()
    target = (root / path).resolve()
    if target.is_dir():
        target = target / "index.html"
    if not target.is_relative_to(root) or not target.is_file():
        raise HTTPException(404)
    return FileResponse(target, headers=NO_CACHE)


async def status(ingress: IngressBase, request: Request) -> Response:
    """Per model: its replica deployment as Ray Serve sees it, and each replica's own report
    (slots, queue, token totals) with tokens per second over the last minute."""
    ingress.check_key(request)
    deployments = await asyncio.to_thread(_deployment_states)
    reports = await ingress.board.snapshot.remote() if ingress.board is not None else {}
    named = len(ingress.models) > 1
    models = []
    for model in ingress.models:
        name = replica_deployment(model.name, named)
        deployment = deployments.get(name, {})
        report = reports.get(model.name, {})
        models.append({
            "name": model.name,
            "deployment": name,
            "deployment_status": deployment.get("status", "UNKNOWN"),
            "replica_states": deployment.get("replica_states", {}),
            "n_parallel": model.args.n_parallel,
            "replicas": report.get("replicas", []),
            "tokens_per_second": report.get("tokens_per_second", []),
        })
    return json_response({"models": models})


def _deployment_states() -> dict[str, dict]:
    """This application's deployments in ``serve.status()``: status and replica counts."""
    app_name = serve.get_replica_context().app_name
    app = serve.status().applications.get(app_name)
    if app is None:
        return {}
    return {name: {"status": str(d.status.value if hasattr(d.status, "value") else d.status),
                   "replica_states": {str(getattr(k, "value", k)): v
                                      for k, v in d.replica_states.items()}}
            for name, d in app.deployments.items()}
