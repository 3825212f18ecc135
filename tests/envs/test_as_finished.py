"""as_finished: bounded, weighted concurrency over a lazy stream of work."""

import asyncio

from tracegym.envs.evaluate import as_finished


def tracked():
    state = {"now": 0, "most": 0}

    async def run(item: list[int]) -> list[int]:
        state["now"] += len(item)
        state["most"] = max(state["most"], state["now"])
        await asyncio.sleep(0.01)
        state["now"] -= len(item)
        return item

    return state, run


async def test_sized_items_never_take_more_than_the_concurrency_together():
    state, run = tracked()
    groups = [[i] * (1 + i % 3) for i in range(12)]
    results = [r async for r in as_finished(iter(groups), run, concurrency=4, size=len)]
    assert sorted(map(tuple, results)) == sorted(map(tuple, groups))
    assert state["most"] <= 4


async def test_an_item_bigger_than_the_concurrency_still_runs_alone():
    state, run = tracked()
    results = [r async for r in as_finished(iter([[1] * 5, [2]]), run, concurrency=2, size=len)]
    assert sorted(map(len, results)) == [1, 5]
    assert state["most"] == 5


async def test_stopping_early_cancels_what_is_still_running():
    started: list[int] = []
    cancelled: list[int] = []

    async def run(n: int) -> int:
        started.append(n)
        try:
            await asyncio.sleep(0 if n == 0 else 10)
        except asyncio.CancelledError:
            cancelled.append(n)
            raise
        return n

    stream = as_finished(iter(range(3)), run, concurrency=3)
    assert await anext(stream) == 0
    await stream.aclose()
    await asyncio.sleep(0)
    assert sorted(cancelled) == [1, 2] and sorted(started) == [0, 1, 2]
