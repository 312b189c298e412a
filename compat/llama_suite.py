"""``python -m compat.llama_suite [--snapshot GIT_DIR] [FILE ...]``: llama.cpp's own server tests
(``tools/server/tests``, one llama-server per test, HTTP assertions) run against mlxray, as a
yardstick; not run by CI (each test starts a whole server: about 20 s here).

The suite comes from a llama.cpp snapshot (a git directory, e.g. the one ``fetch
github:ngxson/llama.cpp`` brings), copied to a temporary folder. It starts ``llama-server``; a
stand-in of that name (written beside it) maps the suite's hub models (``--hf-repo``/``--hf-file``)
to the embedded model's GGUF, drops ``--offline`` and ``--no-jinja`` and runs ``mlxray`` with the
rest, so every flag the suite passes reaches mlxray's command line as the suite wrote it. The
suite's session fixture that downloads its models is left out (nothing is downloaded). Each file's
counts and every failure's first line go to a Markdown table (``--out``, default stdout).

Needs the suite's own packages beside mlxray's: ``pip install wget aiohttp prometheus-client``.
"""

from __future__ import annotations

import argparse
import io
import os
import stat
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SNAPSHOT = "/work/.mirror/ngxson+llama.cpp/repo"
MODEL = REPO / "tests" / "fixtures" / "model.gguf"
# the files whose tests a text model can answer (the eleven)
FILES = ("test_basic.py", "test_completion.py", "test_chat_completion.py",
         "test_compat_anthropic.py", "test_compat_oai_responses.py", "test_security.py",
         "test_slot_save.py", "test_metrics.py", "test_stream.py", "test_ctx_shift.py",
         "test_ignore_eos.py")
NEEDED = ("pytest", "requests", "wget", "openai")
PRESET_DOWNLOAD = "ServerPreset.load_all()"

STAND_IN = '''#!{python}
"""llama-server for llama.cpp's server tests: mlxray on the embedded model (compat.llama_suite)."""
import ctypes, signal, socket, subprocess, sys, time

MODEL, MLXRAY = {model!r}, {mlxray!r}
DROPPED = {{"--offline", "--no-jinja"}}
HUB = {{"--hf-repo", "-hf", "-hfr", "--hf-file", "-hff"}}

args, out, hub, i = sys.argv[1:], [], False, 0
while i < len(args):
    if args[i] in DROPPED:
        i += 1
    elif args[i] in HUB:
        hub, i = True, i + 2
    else:
        out.append(args[i])
        i += 1
if hub and not {{"-m", "--model"}} & set(out):
    out = ["-m", MODEL, *out]
port = int(out[out.index("--port") + 1]) if "--port" in out else 8080
deadline = time.time() + 60  # the previous test's server may still be stopping
while time.time() < deadline:
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", port)) != 0:
            break
    time.sleep(0.5)
libc = ctypes.CDLL("libc.so.6")
# the suite kills this process 5 s after SIGTERM: mlxray then gets a SIGTERM of its own
# (PR_SET_PDEATHSIG) and still stops its cluster
child = subprocess.Popen([MLXRAY, *out], preexec_fn=lambda: libc.prctl(1, signal.SIGTERM))
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda number, _: child.send_signal(number))
sys.exit(child.wait())
'''


@dataclass
class FileResult:
    name: str
    passed: int = 0
    skipped: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)  # test, first line


def copy_suite(snapshot: str, into: Path) -> Path:
    """``tools/server/tests`` of the snapshot's HEAD, with its model download left out."""
    command = ["git", "--git-dir", snapshot, "archive", "HEAD", "tools/server/tests"]
    archive = subprocess.run(command, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    tests = into / "tools" / "server" / "tests"
    conftest = tests / "conftest.py"
    text = conftest.read_text()
    if PRESET_DOWNLOAD not in text:
        raise SystemExit(f"{conftest}: no {PRESET_DOWNLOAD} to leave out; the suite changed")
    conftest.write_text(text.replace(PRESET_DOWNLOAD, "pass  # compat.llama_suite: no download"))
    return tests


def write_stand_in(folder: Path) -> Path:
    path = folder / "llama-server"
    path.write_text(STAND_IN.format(python=sys.executable, model=str(MODEL),
                                    mlxray=str(Path(sys.executable).parent / "mlxray")))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def run_file(tests: Path, name: str, stand_in: Path, timeout: int) -> FileResult:
    report = tests / f"{name}.xml"
    env = {**os.environ, "LLAMA_SERVER_BIN_PATH": str(stand_in)}
    try:
        subprocess.run([sys.executable, "-m", "pytest", f"unit/{name}", "-q", "-p",
                        "no:cacheprovider", f"--junitxml={report}"], cwd=tests, env=env,
                       timeout=timeout, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pass  # what ran is in the report, if pytest wrote it
    result = FileResult(name)
    if not report.exists():
        result.failures.append(("(the file)", f"no report within {timeout} s"))
        return result
    for case in ET.parse(report).iter("testcase"):
        problem = case.find("failure")
        problem = case.find("error") if problem is None else problem
        if case.find("skipped") is not None:
            result.skipped += 1
        elif problem is not None:
            message = (problem.get("message") or problem.text or "").strip().splitlines()
            result.failures.append((case.get("name", "?"), message[0][:160] if message else ""))
        else:
            result.passed += 1
    return result


def table(results: list[FileResult]) -> str:
    lines = ["| file | passed | failed | skipped |", "|---|---|---|---|"]
    lines += [f"| {r.name} | {r.passed} | {len(r.failures)} | {r.skipped} |" for r in results]
    lines += ["", "| file | failed test | first line |", "|---|---|---|"]
    lines += [f"| {r.name} | `{test}` | {line.replace('|', '/')} |"
              for r in results for test, line in r.failures]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m compat.llama_suite", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", default=list(FILES),
                        help="files of tools/server/tests/unit (default: the eleven text ones)")
    parser.add_argument("--snapshot", default=SNAPSHOT, help="llama.cpp git directory")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per file")
    parser.add_argument("--out", help="write the table here (Markdown)")
    ns = parser.parse_args(argv)
    missing = [m for m in NEEDED if not _importable(m)]
    if missing:
        raise SystemExit(f"the suite needs {', '.join(missing)}: pip install {' '.join(missing)}")
    with tempfile.TemporaryDirectory(prefix="llama-suite-") as tmp:
        tests = copy_suite(ns.snapshot, Path(tmp))
        stand_in = write_stand_in(Path(tmp))
        results = []
        for name in ns.files:
            results.append(run_file(tests, name, stand_in, ns.timeout))
            r = results[-1]
            print(f"{name}: {r.passed} passed, {len(r.failures)} failed, {r.skipped} skipped",
                  file=sys.stderr)
    text = table(results)
    if ns.out:
        Path(ns.out).write_text(text)
    else:
        sys.stdout.write(text)


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


if __name__ == "__main__":
    main()
