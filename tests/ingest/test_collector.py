"""The collector's young generation: large while the process is under ingest load, Python's again
once it is idle, on a real event loop's timers."""

from __future__ import annotations

import asyncio
import gc

import pytest

from ingest import collector


@pytest.fixture(autouse=True)
def thresholds(monkeypatch):
    before = gc.get_threshold()
    monkeypatch.setattr(collector, "IDLE_AFTER_S", 0.2)
    yield
    gc.set_threshold(*before)


def test_a_busy_process_gets_the_large_young_generation_and_python_s_back_once_idle():
    young = collector.YoungGeneration()

    async def scenario() -> list[int]:
        seen = [gc.get_threshold()[0]]
        young.busy()
        seen.append(gc.get_threshold()[0])
        await asyncio.sleep(0.35)
        seen.append(gc.get_threshold()[0])
        return seen

    assert asyncio.run(scenario()) == [collector.IDLE_YOUNG, collector.LOADED_YOUNG, collector.IDLE_YOUNG]
    assert not young.loaded


def test_each_large_group_keeps_it_loaded_for_another_idle_period(monkeypatch):
    monkeypatch.setattr(collector, "IDLE_AFTER_S", 0.6)  # 0.5 s of slack for a loaded machine's timers
    young = collector.YoungGeneration()

    async def scenario() -> list[int]:
        seen = []
        young.busy()
        for _ in range(10):  # 1 s in all, past the idle period, busy every 0.1 s
            await asyncio.sleep(0.1)
            seen.append(gc.get_threshold()[0])
            young.busy()
        await asyncio.sleep(1.0)
        seen.append(gc.get_threshold()[0])
        return seen

    assert asyncio.run(scenario()) == [collector.LOADED_YOUNG] * 10 + [collector.IDLE_YOUNG]
