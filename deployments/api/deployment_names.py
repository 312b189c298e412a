"""The names of a graph's deployments, as data: the CLI writes them into serve configs before
Ray is imported (importing Ray first would fix its auth mode for the launcher's process)."""

from __future__ import annotations


def replica_deployment(model_name: str, named: bool) -> str:
    """A model's replica deployment name: ``ModelReplica``, or ``ModelReplica:<model>`` in an
    application of several models (as Ray Serve LLM names its ``LLMServer:<model>``): a path's
    slashes and dots made readable, Serve's replica-id delimiter ``#`` removed."""
    if not named:
        return "ModelReplica"
    return "ModelReplica:" + model_name.replace("/", "--").replace(".", "_").replace("#", "_")
