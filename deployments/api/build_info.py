"""The server's build, as /props build_info and the OpenAI system_fingerprint give it."""

from __future__ import annotations

import importlib.metadata

REFERENCE_BUILD = 10621  # the llama-server release whose API mlxray serves


def build_info() -> str:
    """/props build_info and the OpenAI system_fingerprint: the reference's shape, ``b<build>-``
    and then what the reference has its commit in, so ``b(\\d+)`` reads the build whose API is
    served and what follows names mlxray and its version: ``b10621-mlxray-0.1.0``."""
    try:
        version = importlib.metadata.version("mlxray")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return f"b{REFERENCE_BUILD}-mlxray-{version}"


BUILD_INFO = build_info()
