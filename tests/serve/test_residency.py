"""The residency of a replica's model without Ray: an unloading model reports its new status
only once its memory is freed (the router's and the tests' reading of "sleeping")."""

from __future__ import annotations

import asyncio
import threading

from deployments.serve.residency import Residency


class SlowToStop:
    """An engine whose stop takes a while, as a loaded one's join and collection do."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.release = threading.Event()

    def stop(self) -> None:
        self.stopping.set()
        self.release.wait(5)

    def metrics_snapshot(self) -> dict:
        return {}


def test_the_status_changes_once_the_engine_is_stopped():
    engine = SlowToStop()

    async def scenario() -> list[str]:
        residency = Residency(lambda: engine, on_demand=True, sleep_idle_s=1, forget=lambda: None)
        await residency.load()
        unloading = asyncio.ensure_future(residency.unload("sleeping"))
        await asyncio.to_thread(engine.stopping.wait, 5)
        during = residency.state()["status"]
        engine.release.set()
        await unloading
        return [during, residency.state()["status"]]

    assert asyncio.run(scenario()) == ["loaded", "sleeping"]
