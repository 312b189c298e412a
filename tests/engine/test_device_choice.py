"""The device a model runs on (engine/device_choice.py): the choice on stand-in backends (Metal,
CUDA, none), the graph's ``device`` key, llama-server's ``-dev`` on the command line, and a GPU
asked for where MLX has none failing the start with a message that says so."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from deployments.api.config import GraphArgs
from deployments.cli import command as cli
from engine import device_choice as device
from engine.device_choice import Backends, DeviceError, resolve

from ..gguf_files import REFERENCE_GGUF

METAL = Backends("Metal", 1, ("Apple M3 Max",))
CUDA = Backends("CUDA", 2, ("NVIDIA H200", "NVIDIA H200"))
CPU_ONLY = Backends(None)


@pytest.mark.parametrize("spec, backends, kind, index", [
    ("auto", METAL, "gpu", 0), ("auto", CUDA, "gpu", 0), ("auto", CPU_ONLY, "cpu", 0),
    ("cpu", METAL, "cpu", 0), ("cpu", CUDA, "cpu", 0), ("gpu", METAL, "gpu", 0),
    ("gpu:1", CUDA, "gpu", 1),
])
def test_the_choice(spec, backends, kind, index):
    choice = resolve(spec, backends)
    assert (choice.kind, choice.index) == (kind, index)


def test_the_choice_is_named_in_the_log_line():
    assert resolve("auto", CUDA).label == "gpu 0 (CUDA, NVIDIA H200)"
    assert resolve("auto", CPU_ONLY).label == "cpu"


@pytest.mark.parametrize("spec, backends, message", [
    ("gpu", CPU_ONLY, "device 'gpu' asked for, but MLX here has no GPU backend"),
    ("gpu:1", CPU_ONLY, "install a GPU backend: .*make install MLX_BACKEND=cuda"),
    ("gpu:2", CUDA, r"MLX sees 2 CUDA GPU\(s\) \(gpu:0 to gpu:1\)"),
    ("gpu:1", METAL, r"MLX sees 1 Metal GPU\(s\)"),
])
def test_a_gpu_that_is_not_there_is_refused_saying_so(spec, backends, message):
    with pytest.raises(DeviceError, match=message):
        resolve(spec, backends)


HERE = device.installed()
NEEDS_GPU = pytest.mark.skipif(HERE.gpu is None, reason="this MLX has no GPU backend "
                               "(Metal or CUDA): the check runs where one is installed")


@pytest.fixture
def cpu_only(monkeypatch):
    """This process's MLX as a CPU-only install, whatever the machine has."""
    monkeypatch.setattr(device, "installed", lambda: CPU_ONLY)


@pytest.mark.parametrize("backends", [METAL, CUDA, CPU_ONLY], ids=["metal", "cuda", "cpu"])
def test_check_resolves_on_what_mlx_reports(monkeypatch, backends):
    monkeypatch.setattr(device, "installed", lambda: backends)
    assert device.check("auto").kind == ("cpu" if backends.gpu is None else "gpu")
    assert device.check("cpu").kind == "cpu"


def test_this_machines_backends_are_well_formed():
    """What this MLX reports, whatever it is: auto takes its GPU when it has one."""
    assert HERE.gpu in (None, "Metal", "CUDA")
    assert device.check("auto").kind == ("cpu" if HERE.gpu is None else "gpu")
    if HERE.gpu is not None:
        assert HERE.n_gpus >= 1 and len(HERE.gpu_names) == HERE.n_gpus


@NEEDS_GPU
def test_the_gpu_here_is_chosen_and_made_the_default():
    import mlx.core as mx

    before = mx.default_device()
    try:
        assert device.choose("gpu") == mx.Device(mx.gpu, 0) == mx.default_device()
    finally:
        mx.set_default_device(before)


def test_the_graph_key_takes_auto_gpu_and_cpu_only():
    assert GraphArgs().device == "auto"
    for spec in ("cpu", "gpu", "gpu:3"):
        assert GraphArgs(device=spec).device == spec
    for bad in ("cuda", "gpu:", "GPU", "metal"):
        with pytest.raises(ValidationError, match="device"):
            GraphArgs(device=bad)


@pytest.mark.parametrize("value, spec", [
    ("none", "cpu"), ("CUDA0", "gpu"), ("CUDA1", "gpu:1"), ("MTL0", "gpu"), ("Metal", "gpu"),
    ("cuda2", "gpu:2"),
])
def test_dev_names_map_onto_the_key(value, spec):
    assert device.from_flag(value) == spec


@pytest.mark.parametrize("value, message", [
    ("CPU", "invalid device: CPU"), ("Vulkan0", "invalid device: Vulkan0"),
    ("CUDA0,CUDA1", "one device per model"), ("none,CUDA0", "one device per model"),
])
def test_dev_names_that_are_no_device_are_refused(value, message):
    with pytest.raises(ValueError, match=message):
        device.from_flag(value)


def test_dev_on_the_command_line(capsys, cpu_only):
    """-dev none and LLAMA_ARG_DEVICE reach the config; a GPU this machine's MLX cannot run
    on stops the command before anything starts, with llama-server's wording first."""
    config = cli.serve_config(cli.parse(["-m", str(REFERENCE_GGUF), "-dev", "none"], {}))
    assert config["applications"][0]["args"]["device"] == "cpu"
    assert cli.parse([], {"LLAMA_ARG_DEVICE": "none"}).device == "cpu"
    assert "device" not in cli.serve_config(cli.parse([], {}))["applications"][0]["args"]
    with pytest.raises(cli.Refused, match='"-dev": device .gpu. asked for, but MLX here has no'):
        cli.parse(["-dev", "CUDA0"], {})
    with pytest.raises(SystemExit):
        cli.parse(["--device", "CUDA0,CUDA1"], {})
    assert "one device per model" in capsys.readouterr().err


def test_a_replica_asked_for_a_missing_gpu_fails_at_start(cpu_only):
    """The replica checks the device in its constructor, so Serve reports the deployment
    failed with this message rather than a replica that never becomes ready."""
    from deployments.serve.replica import ModelReplica

    with pytest.raises(DeviceError, match="no GPU backend"):
        ModelReplica.func_or_class(GraphArgs(device="gpu"))
