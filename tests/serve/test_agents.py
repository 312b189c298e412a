"""Real agents against a served graph: Claude Code and Codex CLI, the versions pinned in
tests/fixtures/agents/package.json (and its lock), installed with ``npm ci`` once per test session
into a temporary folder, each run for one non-interactive turn against configs/agents.yaml's
settings (one 65,536-token slot, n_predict, the tool-calling template) on real Ray Serve.

Each agent sends its whole tool list (Claude Code about 20 tools, Codex its shell and patch
tools) with tool choice ``auto``; the served model is tests/agent_model.py's, built at test time,
which answers ANSWER and ends its turn, so a pass shows the protocol working end to end: exit 0,
the answer printed, and every request on the agent's route answered 200 (seen by a recording
proxy between agent and graph). The agents' environment is built from nothing (a temporary HOME,
no key or setting of this machine's). The tools each agent sent are compared with the recorded
requests in tests/fixtures/agents (which the tool-schema tests build grammars from);
MLXRAY_RECORD_AGENTS=1 rewrites those from this run.

Skipped, with the reason, only when npm is missing; an npm install that fails is a failure."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from ..agent_model import ANSWER, build_agent_model
from ..recording_proxy import RecordingProxy
from ..reliability import dedicated_app

REPO = Path(__file__).resolve().parents[2]
AGENTS = REPO / "tests" / "fixtures" / "agents"
CONFIG = REPO / "configs" / "agents.yaml"
PROMPT = "Say hello."
TURN_TIMEOUT = 300


@pytest.fixture(scope="session")
def agent_bin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The pinned agents' executables: ``npm ci`` into a temporary folder, removed afterwards
    (the two native builds take about 800 MB)."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed: the agent tests install Claude Code and Codex CLI "
                    "with it (apt-get install npm)")
    folder = tmp_path_factory.mktemp("agents-npm")
    for name in ("package.json", "package-lock.json"):
        shutil.copy(AGENTS / name, folder / name)
    subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=folder,
                   check=True, timeout=600, stdin=subprocess.DEVNULL)
    yield folder / "node_modules" / ".bin"
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def agent_graph(serve_instance, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """configs/agents.yaml's graph arguments, with the test model in place of the embedded one."""
    args = yaml.safe_load(CONFIG.read_text())["applications"][0]["args"]
    model = build_agent_model(tmp_path_factory.mktemp("agent-model"))
    with dedicated_app(serve_instance, "agents", {**args, "model": str(model)}) as base:
        yield base


@pytest.fixture()
def proxy(agent_graph: str) -> Iterator[RecordingProxy]:
    with RecordingProxy(agent_graph) as recording:
        yield recording


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """Nothing of this machine's environment but where node is; the agent's home is ``home``."""
    node = shutil.which("node")
    folders = [str(Path(node).parent)] if node else []
    return {"PATH": os.pathsep.join([*folders, "/usr/bin", "/bin"]), "HOME": str(home),
            "LANG": "C.UTF-8", **extra}


def run_turn(command: list[str], env: dict[str, str], workdir: Path) -> subprocess.CompletedProcess:
    workdir.mkdir(exist_ok=True)
    return subprocess.run(command, env=env, cwd=workdir, capture_output=True, text=True,
                          timeout=TURN_TIMEOUT, stdin=subprocess.DEVNULL)


def check_turn(done: subprocess.CompletedProcess, proxy: RecordingProxy, route: str) -> None:
    report = f"exit {done.returncode}\nstdout: {done.stdout[-2000:]}\nstderr: {done.stderr[-2000:]}"
    assert done.returncode == 0, report
    assert ANSWER in done.stdout, report
    statuses = proxy.statuses("POST", route)
    assert statuses and set(statuses) == {200}, [(e.path, e.status) for e in proxy.exchanges]


def check_recorded(proxy: RecordingProxy, route: str, fixture: str, agent: str) -> None:
    """The agent's first request on ``route`` declares the tools its fixture has."""
    sent = next(e.json() for e in proxy.exchanges if e.path == route)
    path = AGENTS / fixture
    if os.environ.get("MLXRAY_RECORD_AGENTS") == "1":
        recorded = {"agent": agent, "method": "POST", "path": route, "body": sent}
        path.write_text(json.dumps(recorded, indent=1, ensure_ascii=False) + "\n")
    fixture_body = json.loads(path.read_text())["body"]
    assert tool_names(sent) == tool_names(fixture_body)


def tool_names(body: dict) -> list[str]:
    return sorted(t.get("name") or t.get("type") for t in body.get("tools", []))


def pinned(name: str) -> str:
    return f"{name} {json.loads((AGENTS / 'package.json').read_text())['dependencies'][name]}"


# Claude Code sends its whole tool list with ENABLE_TOOL_SEARCH=false, else a few tools, the
# rest deferred behind its ToolSearch tool: each way is one turn, with its own recorded request
@pytest.mark.parametrize(("tool_search", "fixture"), [
    ("false", "claude-code.json"), (None, "claude-code-tool-search.json")])
def test_claude_code_turn(agent_bin: Path, proxy: RecordingProxy, tmp_path: Path,
                          tool_search: str | None, fixture: str):
    env = clean_env(tmp_path, ANTHROPIC_BASE_URL=proxy.url, ANTHROPIC_API_KEY="sk-local",
                    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_TELEMETRY="1",
                    DISABLE_AUTOUPDATER="1", DISABLE_ERROR_REPORTING="1")
    if tool_search is not None:
        env["ENABLE_TOOL_SEARCH"] = tool_search
    done = run_turn([str(agent_bin / "claude"), "-p", PROMPT, "--model", "tiny-python"], env,
                    tmp_path / "project")
    check_turn(done, proxy, "/v1/messages")
    check_recorded(proxy, "/v1/messages", fixture, pinned("@anthropic-ai/claude-code"))


def test_codex_turn(agent_bin: Path, proxy: RecordingProxy, tmp_path: Path):
    env = clean_env(tmp_path, CODEX_HOME=str(tmp_path / "codex"))
    (tmp_path / "codex").mkdir()
    provider = f'{{name="mlxray", base_url="{proxy.url}/v1", wire_api="responses"}}'
    settings = ["analytics.enabled=false", "model_provider=mlxray",
                f"model_providers.mlxray={provider}"]
    done = run_turn([str(agent_bin / "codex"), "exec", "--skip-git-repo-check", "-m",
                     "tiny-python", *(part for s in settings for part in ("-c", s)), PROMPT],
                    env, tmp_path / "project")
    check_turn(done, proxy, "/v1/responses")
    check_recorded(proxy, "/v1/responses", "codex.json", pinned("@openai/codex"))
