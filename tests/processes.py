"""A command started in a session of its own, and every process it starts.

Other Ray clusters run on the same machine (other test sessions, other servers), so nothing here
looks processes up by name: what a command started is its process tree, sampled while it runs
(a Ray worker is the raylet's child, the raylet the command's; a process whose parent died stays
known once sampled). Only those processes are signalled or killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

from deployments.cli.launch import CLUSTER_ENV, LOOPBACK_CLUSTER_ENV

# what deployments/cli/launch.own_cluster_setup puts in the process's environment: a test that ran
# it in this process must not hand it on (a second node refuses to join with it)
OWN_CLUSTER_SETUP = (LOOPBACK_CLUSTER_ENV,)


def own_cluster_env() -> dict[str, str]:
    """The test's environment for a command that starts a Ray cluster of its own: no RAY_ADDRESS
    (the test session's cluster), no LLAMA_* variables, and none of the settings the command must
    set itself (deployments/launch.CLUSTER_ENV)."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("RAY_ADDRESS", "LLAMA_")) and k not in CLUSTER_ENV
            and k not in OWN_CLUSTER_SETUP}


def _default_signals() -> None:
    """The child starts as from a terminal: SIGINT and SIGQUIT not ignored (a shell's background
    job, which may run the tests, ignores them, and an ignored signal stays ignored across exec)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


class Launched:
    """``argv`` running as the leader of a new session (its process group id is its pid)."""

    def __init__(self, argv: Sequence[str], cwd: Path, env: dict[str, str], log: Path):
        self.log = log
        self.proc = subprocess.Popen(list(argv), cwd=cwd, env=env, stdout=open(log, "wb"),
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=_default_signals)
        self.seen: dict[tuple[int, float], psutil.Process] = {}
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample_until_stopped, daemon=True)
        self._sampler.start()

    # ---- what it started ---------------------------------------------------------------
    def sample(self) -> None:
        """Add the current descendants of every known process that still runs."""
        roots = [self.proc.pid] + [p.pid for p in self.alive()]
        for pid in roots:
            try:
                root = psutil.Process(pid)
                for p in [root, *root.children(recursive=True)]:
                    self.seen.setdefault((p.pid, p.create_time()), p)
            except psutil.Error:
                continue

    def _sample_until_stopped(self) -> None:
        while not self._stop.wait(0.5):
            self.sample()

    def alive(self) -> list[psutil.Process]:
        """Known processes still running (same pid and start time), zombies excepted."""
        out = []
        for p in list(self.seen.values()):
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.Error:
                continue
        return out

    # ---- signals -------------------------------------------------------------------------
    def signal(self, sig: int, group: bool) -> None:
        self.sample()
        if group:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)

    def wait(self, timeout: float) -> float | None:
        """Seconds until the command exited, or None if it is still running at ``timeout``."""
        start = time.monotonic()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return time.monotonic() - start

    def leftovers(self, grace: float) -> list[psutil.Process]:
        """The processes still running ``grace`` seconds from now (sampling goes on meanwhile)."""
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and self.alive():
            self.sample()
            time.sleep(0.2)
        return self.alive()

    def kill_all(self) -> None:
        """SIGKILL every known process still running (cleanup after a failed check)."""
        self._stop.set()
        for p in self.alive():
            try:
                p.kill()
            except psutil.Error:
                pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 5  # a SIGKILL takes effect soon, not at once (loaded box)
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.1)

    def close(self) -> None:
        self._stop.set()
        self._sampler.join(2)


def describe(processes: list[psutil.Process]) -> list[str]:
    out = []
    for p in processes:
        try:
            out.append(f"{p.pid} {' '.join(p.cmdline())[:100]}")
        except psutil.Error:
            out.append(f"{p.pid} (gone)")
    return out
