"""Where a model runs: Metal on a Mac, CUDA where MLX's CUDA backend is installed, else the CPU
(engine/device.py then gives the engine its stream there).

The choice is the graph's ``device`` (auto | gpu | gpu:N | cpu), made when the replica loads its
model; llama-server's ``-dev/--device`` maps onto it (``none``: the CPU; a GPU's name: that GPU).
Asking for a GPU that this MLX cannot run on is an error at start that says so. The backend
itself is chosen at install time (``make install MLX_BACKEND=cuda``). Nothing here imports MLX
until a device is resolved, so the command line can check ``-dev`` without it.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("mlxray.device")

DEVICE_PATTERN = r"^(auto|cpu|gpu(:\d+)?)$"
_GPU_NAME = re.compile(r"(?i)(?:cuda|mtl|metal|gpu)(\d*)")
INSTALL_HINT = ("the MLX backend is chosen at install: `make install MLX_BACKEND=cuda` installs "
                "MLX's CUDA backend on Linux; Metal comes with MLX on a Mac")


class DeviceError(RuntimeError):
    """A device this process's MLX cannot run the model on."""


class InvalidDeviceName(argparse.ArgumentTypeError, ValueError):
    """A ``-dev`` value that names no device (argparse prints the message as it is)."""


def from_flag(value: str) -> str:
    """llama-server's ``-dev`` value as the graph's ``device``: ``none`` is the CPU, a GPU's
    name (``CUDA0``, ``CUDA1``, ``MTL0``, ``Metal``) that GPU. A list of several devices is
    refused: a replica runs on one device (scale out with replicas)."""
    names = [name.strip() for name in value.split(",")]
    if names == ["none"]:
        return "cpu"
    if len(names) > 1:
        raise InvalidDeviceName(f"one device per model, not {value}: a replica runs on one "
                                "device (scale out with replicas)")
    match = _GPU_NAME.fullmatch(names[0])
    if match is None:
        raise InvalidDeviceName(f"invalid device: {names[0]} (mlxray takes none, or a GPU: "
                                "CUDA0, CUDA1, ..., MTL0)")
    index = int(match.group(1) or 0)
    return "gpu" if index == 0 else f"gpu:{index}"


@dataclass(frozen=True)
class Backends:
    """What MLX can run on in this process (tests pass a stand-in)."""

    gpu: str | None  # "Metal", "CUDA" or None
    n_gpus: int = 0
    gpu_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class Choice:
    kind: str  # "gpu" or "cpu"
    index: int
    label: str  # for the log: "gpu 0 (Metal, Apple M2)", "cpu"


def installed() -> Backends:
    import mlx.core as mx

    gpu = "Metal" if mx.metal.is_available() else "CUDA" if mx.cuda.is_available() else None
    if gpu is None:
        return Backends(None)
    count = max(1, mx.device_count(mx.gpu))
    names = tuple(str(mx.device_info(mx.Device(mx.gpu, i)).get("device_name", ""))
                  for i in range(count))
    return Backends(gpu, count, names)


def resolve(spec: str, backends: Backends) -> Choice:
    """The device ``spec`` names on these backends; ``auto`` is the GPU where there is one."""
    if not re.match(DEVICE_PATTERN, spec):
        raise DeviceError(f"device '{spec}': expected auto, gpu, gpu:N or cpu")
    if spec == "cpu" or (spec == "auto" and backends.gpu is None):
        return Choice("cpu", 0, "cpu" + (" (asked for)" if spec == "cpu" else ""))
    index = int(spec.partition(":")[2] or 0)
    if backends.gpu is None:
        raise DeviceError(f"device '{spec}' asked for, but MLX here has no GPU backend (only "
                          "its CPU one is installed); run on the CPU with `device: cpu` "
                          f"(-dev none), or install a GPU backend: {INSTALL_HINT}")
    if index >= backends.n_gpus:
        raise DeviceError(f"device '{spec}' asked for, but MLX sees {backends.n_gpus} "
                          f"{backends.gpu} GPU(s) (gpu:0 to gpu:{backends.n_gpus - 1})")
    name = backends.gpu_names[index] if index < len(backends.gpu_names) else ""
    detail = f"{backends.gpu}, {name}" if name else backends.gpu
    return Choice("gpu", index, f"gpu {index} ({detail})")


def check(spec: str) -> Choice:
    """Resolve ``spec`` on this process's MLX without changing anything (fails fast)."""
    return resolve(spec, installed())


def refusal_here(spec: str) -> str | None:
    """Why this machine's MLX cannot run ``spec`` (None: it can, or the model will run on a
    cluster named by RAY_ADDRESS, which the replica checks when it starts)."""
    if spec in ("auto", "cpu") or os.environ.get("RAY_ADDRESS"):
        return None
    try:
        check(spec)
    except DeviceError as exc:
        return str(exc)
    return None


def choose(spec: str) -> Any:
    """Make ``spec``'s device MLX's default and log it; returns the ``mx.Device``."""
    import mlx.core as mx

    choice = check(spec)
    device = mx.Device(mx.gpu if choice.kind == "gpu" else mx.cpu, choice.index)
    mx.set_default_device(device)
    log.info("mlxray: the model runs on %s [device: %s]", choice.label, spec)
    return device
