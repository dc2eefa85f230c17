"""Long work on the event loop in slices: the loop, and the other threads, get their turn between
them; a slice ends once it has lasted its time, and the time held counts the slices only."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest
import uvloop

from bridge.core.slices import GAP_S, Slices


def test_a_slice_ends_once_it_has_lasted_its_time_and_held_counts_only_the_slices() -> None:
    now = [0.0]
    pauses = []

    def clock() -> float:
        return now[0]

    async def pause() -> None:
        pauses.append(now[0])
        now[0] += 10.0  # the loop away for 10 s: not held

    gave: list[bool] = []

    async def work() -> float:
        slices = Slices(pause, clock, slice_s=0.0015)
        for _ in range(10):
            now[0] += 0.001  # a piece of 1 ms
            gave.append(await slices.after_piece())
        return slices.held

    held = asyncio.run(work())
    assert len(pauses) == 5  # every second piece ends a slice
    assert gave == [False, True] * 5, "after_piece says when it gave the loop away"
    assert held == pytest.approx(0.010)


def test_the_default_pause_waits_rather_than_only_turning_the_loop() -> None:
    async def one_pause() -> float:
        slices = Slices(slice_s=0.0)
        started = time.perf_counter()
        await slices.after_piece()
        return time.perf_counter() - started

    assert asyncio.run(one_pause()) >= GAP_S * 0.9


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_other_threads_get_the_interpreter_between_the_slices(run: object) -> None:
    """An executor call (how the consumer takes records from Kafka) made during 0.3 s of work in
    slices returns before the work ends. Between slices that only turned the loop
    (``sleep(0)``), the executor's thread got the interpreter's lock only once the work ended."""

    async def race() -> list[str]:
        order: list[str] = []
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, time.sleep, 0)  # (its thread started beforehand)

        async def work() -> None:
            slices = Slices()
            end = time.perf_counter() + 0.3
            while time.perf_counter() < end:
                sum(itertools.repeat(1, 200))  # a piece of pure Python
                await slices.after_piece()
            order.append("work")

        working = asyncio.create_task(work())
        await asyncio.sleep(0)  # (the work's first slice)
        await loop.run_in_executor(None, time.sleep, 0.001)
        order.append("executor")
        await working
        return order

    assert run(race()) == ["executor", "work"]  # type: ignore[operator]
