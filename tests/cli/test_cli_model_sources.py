"""Where ``-hf`` and ``-mu`` find a model: a pre-filled hub cache, offline, and a local HTTP server
standing in for a download, into $LLAMA_CACHE and never outside it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from deployments.cli import command as cli
from deployments.cli import url as cli_url
from tests.conftest import MODEL, REPO

from .test_cli_invocations import GGUF, dump_config


# ---- -hf from a pre-filled hub cache, offline ------------------------------------------------
def fill_hub_cache(cache: Path) -> None:
    """Two repositories as the hub cache holds them: an mlx-community folder, a GGUF one."""
    def repo(name: str, files: dict[str, Path]) -> None:
        root = cache / f"models--{name.replace('/', '--')}"
        commit = "0" * 40
        (root / "refs").mkdir(parents=True)
        (root / "refs" / "main").write_text(commit)
        snapshot = root / "snapshots" / commit
        snapshot.mkdir(parents=True)
        for file_name, source in files.items():
            (snapshot / file_name).symlink_to(source)

    repo("mlx-community/tiny-python", {p.name: p for p in Path(MODEL).iterdir() if p.is_file()})
    repo("ggml-org/tiny-GGUF", {"tiny-Q8_0.gguf": GGUF, "tiny-Q4_K_M.gguf": GGUF,
                                "mmproj-tiny-f16.gguf": GGUF})


def test_hf_repo_from_the_hub_cache(tmp_path, monkeypatch, capsys):
    """-hf names a cached repository: a GGUF one gives the quant's file (Q4_K_M by default,
    case-insensitive), an mlx-community one its id, which mlx-lm then loads from the cache
    with the hub unreachable (HF_HUB_OFFLINE=1); nothing cached and a quant asked: refused."""
    cache = tmp_path / "hub"
    fill_hub_cache(cache)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def model(spec: str) -> str:
        return dump_config(f"-hf {spec} -c 64", capsys)["applications"][0]["args"]["model"]

    assert Path(model("ggml-org/tiny-GGUF:q8_0")).name == "tiny-Q8_0.gguf"
    assert Path(model("ggml-org/tiny-GGUF")).name == "tiny-Q4_K_M.gguf"
    assert Path(model("ggml-org/tiny-GGUF")).is_file()
    assert Path(model("ggml-org/tiny-GGUF:Q4_K_M -hff tiny-Q8_0.gguf")).name == "tiny-Q8_0.gguf"
    assert model("mlx-community/tiny-python") == "mlx-community/tiny-python"
    with pytest.raises(ValueError, match="no GGUF file in ggml-org/absent in the local hub"):
        cli.graph_args(cli.parse(["-hf", "ggml-org/absent:Q4_0"], {}))
    monkeypatch.delenv("HF_HUB_OFFLINE")  # --offline alone keeps the hub out of it
    with pytest.raises(ValueError, match="no GGUF file in ggml-org/absent in the local hub"):
        cli.graph_args(cli.parse(["-hf", "ggml-org/absent:Q4_0", "--offline"], {}))
    assert cli.graph_args(cli.parse(["-hf", "ggml-org/tiny-GGUF", "--offline"], {})).model.endswith(
        "tiny-Q4_K_M.gguf")
    with pytest.raises(ValueError, match="expected <user>/<model>"):
        cli.graph_args(cli.parse(["-hf", "tiny"], {}))
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    loaded = subprocess.run(
        [sys.executable, "-c", "from engine.model import load_model; "
         "print(load_model('mlx-community/tiny-python', None, 'cpu').n_params)"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert int(loaded.stdout.split()[-1]) > 0


# ---- -mu from a local HTTP server ------------------------------------------------------------
URL_PORT = 8460


@pytest.fixture
def gguf_server() -> Iterator[tuple[str, list[str]]]:
    """tests/fixtures served over HTTP from a thread: its base URL and the methods it was
    asked, in order."""
    asked: list[str] = []

    class Handler(SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(GGUF.parent), **kwargs)

        def send_head(self):
            asked.append(self.command)
            return super().send_head()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", URL_PORT), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{URL_PORT}", asked
    server.shutdown()
    server.server_close()


def test_model_url_downloads_once_into_llama_cache(gguf_server, tmp_path, monkeypatch, capsys):
    """-mu fetches the GGUF file into $LLAMA_CACHE before deploying (-m names where instead);
    the same size already there is reused; --dump-config shows the path, fetching nothing."""
    base, asked = gguf_server
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "cache"))
    landed = tmp_path / "cache" / "model.gguf"
    shown = dump_config(f"-mu {base}/model.gguf -c 64", capsys)["applications"][0]["args"]
    assert shown["model"] == str(landed) and not landed.exists() and asked == []

    def model(*argv: str) -> str:
        return cli.graph_args(cli.parse(list(argv), dict(os.environ))).model

    assert model("-mu", f"{base}/model.gguf") == str(landed)
    assert landed.read_bytes() == GGUF.read_bytes() and asked == ["HEAD", "GET"]
    landed.touch()
    before = landed.stat().st_mtime_ns
    assert model("--model-url", f"{base}/model.gguf") == str(landed)
    assert landed.stat().st_mtime_ns == before and asked == ["HEAD", "GET", "HEAD"]
    landed.write_bytes(b"truncated")  # another size: fetched again
    monkeypatch.setenv("LLAMA_ARG_MODEL_URL", f"{base}/model.gguf")
    assert model() == str(landed) and landed.read_bytes() == GGUF.read_bytes()
    monkeypatch.delenv("LLAMA_ARG_MODEL_URL")
    chosen = tmp_path / "mine.gguf"
    assert model("-mu", f"{base}/model.gguf", "-m", str(chosen)) == str(chosen)
    assert chosen.read_bytes() == GGUF.read_bytes()
    with pytest.raises(ValueError, match="download failed: HTTP Error 404"):
        model("-mu", f"{base}/absent.gguf")
    with pytest.raises(ValueError, match="expected an http"):
        model("-mu", "ftp://example.com/model.gguf")
    assert cli_url.cache_dir({}) == Path.home() / ".cache" / "mlxray"


@pytest.mark.parametrize("tail", ["..%2F..%2F..%2Ftmp%2Fx.gguf", "..%2Fx.gguf",
                                  "a%2F..%2F..%2Fx.gguf", "..%5Cx.gguf", "%2E%2E"])
def test_model_url_refuses_a_file_name_that_leaves_the_cache(tmp_path, tail):
    """A percent-encoded separator decodes after the split: refused before anything is fetched
    (download=True: a fetch would fail on the unreachable host, with another message)."""
    env = {"LLAMA_CACHE": str(tmp_path / "cache")}
    with pytest.raises(ValueError, match="leaves the cache folder|names no file"):
        cli_url.model(f"http://127.0.0.1:9/m/{tail}", None, True, env)
    assert cli_url.local_path("http://h/m/x%20y.gguf", None, env) == \
        (tmp_path / "cache" / "x y.gguf").resolve()
