"""bertkit.serve.scheduler: the model thread gives the C heap's freed memory back to the OS, after
runs at most every TRIM_EVERY seconds and once more when it falls idle (no model is loaded: a use
that echoes its inputs stands in for one, and a recorder for glibc's malloc_trim)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from bertkit.serve import scheduler
from bertkit.serve.metrics import Metrics

WAIT = 20.0  # seconds: the bound on every wait here


def test_an_idle_model_thread_gives_freed_memory_back_once(monkeypatch):
    """Runs closer together than TRIM_EVERY are followed by no trim of their own (the trim is
    rate-limited); the last of them must still be given back once the queue stays empty, and only
    once: an idle thread that kept trimming would spend CPU for nothing."""
    trims: list[float] = []
    monkeypatch.setattr(scheduler, "_trimmer", lambda: lambda pad: trims.append(time.monotonic()))
    monkeypatch.setattr(scheduler, "TRIM_EVERY", 2.0)
    monkeypatch.setitem(scheduler.RUNNERS, "echo", lambda model, key, items: list(items))
    model = SimpleNamespace(name="echo", base=None)

    async def scenario() -> tuple[float, list[float], list[float]]:
        runs = scheduler.Scheduler(64, Metrics())
        try:
            for i in range(3):
                assert await runs.submit(model, "echo", (), [i], 1) == [i]
            answered = time.monotonic()
            deadline = answered + WAIT
            while not any(t > answered for t in trims) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            seen = list(trims)
            await asyncio.sleep(1.5 * scheduler.TRIM_EVERY)  # idle on: no further trim is due
            return answered, seen, list(trims)
        finally:
            await runs.stop()

    answered, seen, later = asyncio.run(scenario())
    assert any(t > answered for t in seen), f"no trim after the last run; trims at {seen}, answered at {answered}"
    assert later == seen, f"{len(later) - len(seen)} more trims while idle, after the one that gave the runs back"


def test_a_model_thread_gives_memory_back_once_it_has_grown(monkeypatch):
    """Under load the trim comes after the first run that leaves resident memory more than
    TRIM_GROWTH above what the last trim left, however soon (TRIM_EVERY is an hour here): runs
    that grow it less are followed by none. A fake resident memory grows by each input's value
    and falls back where it was when trimmed."""
    resident = {"bytes": 1000}
    trims: list[int] = []
    seen: list[list[int]] = []  # the trims made before each run started

    def trim(pad: int) -> None:
        trims.append(resident["bytes"])
        resident["bytes"] = 1000

    def grow(model, key, items):
        seen.append(list(trims))
        resident["bytes"] += sum(items)
        return list(items)

    monkeypatch.setattr(scheduler, "_trimmer", lambda: trim)
    monkeypatch.setattr(scheduler, "resident_bytes", lambda: resident["bytes"])
    monkeypatch.setattr(scheduler, "TRIM_EVERY", 3600.0)
    monkeypatch.setattr(scheduler, "TRIM_GROWTH", 0.1)
    monkeypatch.setitem(scheduler.RUNNERS, "grow", grow)
    model = SimpleNamespace(name="grow", base=None)

    async def scenario() -> list[int]:
        runs = scheduler.Scheduler(64, Metrics())
        try:
            for step in (50, 40, 20):  # 1050, 1090: within 10% of 1000; 1110: past it
                assert await runs.submit(model, "grow", (), [step], 1) == [step]
            deadline = time.monotonic() + WAIT
            while not trims and time.monotonic() < deadline:  # the trim follows the last answer
                await asyncio.sleep(0.02)
            return list(trims)
        finally:
            await runs.stop()

    after = asyncio.run(scenario())
    assert seen == [[], [], []], f"trims before each run: {seen}; none was due within TRIM_GROWTH"
    assert after == [1110], f"trims at {after} bytes; expected one, after the run that reached 1110"
