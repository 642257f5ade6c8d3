"""FreshRead: concurrent callers share reads, but never one that began before they asked.

The fake read returns its own sequence number (1 for the first read begun, 2 for the next...) and
waits on a gate the test opens, so each test decides exactly what is in flight when a caller arrives.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from device_plugin.kubelet.fresh_read import FreshRead
from tests.device_plugin.harness import run


class Reads:
    """A read returning how many reads had begun when it began; each waits for its gate unless ``gated`` is off."""

    def __init__(self, *, gated: bool = True) -> None:
        self.begun = 0
        self.gated = gated
        self.gates: list[asyncio.Event] = []
        self.fail: dict[int, Exception] = {}  # read number -> what it raises
        self.cancel: set[int] = set()  # read numbers cancelled under the reader

    async def __call__(self) -> int:
        self.begun += 1
        number = self.begun
        gate = asyncio.Event()
        self.gates.append(gate)
        if self.gated:
            await gate.wait()
        if number in self.cancel:
            raise asyncio.CancelledError
        if number in self.fail:
            raise self.fail[number]
        return number

    async def begin(self, number: int) -> None:
        """Let the loop run until read ``number`` has begun."""
        while self.begun < number:
            await asyncio.sleep(0)

    def open(self, number: int) -> None:
        self.gates[number - 1].set()

    async def release(self, number: int) -> None:
        """Let read ``number`` begin, then end."""
        await self.begin(number)
        self.open(number)


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


Tasks = list[asyncio.Task[int]]


async def in_flight(fresh: FreshRead[int], reads: Reads, sharing: int, waiting: int) -> tuple[Tasks, Tasks]:
    """``sharing`` callers who start read 1, then ``waiting`` callers arriving once it is in flight."""
    first = [asyncio.create_task(fresh.get()) for _ in range(sharing)]
    await reads.begin(1)
    later = [asyncio.create_task(fresh.get()) for _ in range(waiting)]
    await settle()
    return first, later


def test_callers_arriving_during_a_read_share_the_next_never_that_one() -> None:
    async def scenario() -> None:
        reads = Reads()
        fresh = FreshRead(reads)
        first, later = await in_flight(fresh, reads, sharing=10, waiting=40)
        assert reads.begun == 1  # the 40 wait for read 1 to end rather than start their own
        reads.open(1)
        assert await asyncio.gather(*first) == [1] * 10
        await reads.begin(2)
        await settle()
        assert not any(t.done() for t in later)  # read 1 began before they asked: not theirs
        reads.open(2)
        assert await asyncio.gather(*later) == [2] * 40
        assert reads.begun == 2  # 50 callers, two reads
        idle = asyncio.create_task(fresh.get())  # nothing in flight: a new read at once
        await reads.release(3)
        assert await idle == 3

    run(scenario())


def test_every_caller_gets_the_first_read_begun_after_it_asked() -> None:
    # Callers and reads of random timing: the result is always (reads begun when it asked) + 1,
    # so never a read that began before it, and never more than the one in flight plus the next.
    async def scenario() -> None:
        rng = random.Random(7)
        reads = Reads(gated=False)

        async def slow() -> int:
            number = await reads()
            await asyncio.sleep(rng.uniform(0, 0.002))
            return number

        fresh = FreshRead(slow)

        async def caller() -> tuple[int, int]:
            await asyncio.sleep(rng.uniform(0, 0.05))
            begun = reads.begun
            return begun, await fresh.get()

        outcomes = await asyncio.gather(*(caller() for _ in range(200)))
        assert all(got == begun + 1 for begun, got in outcomes)
        assert reads.begun < 200

    run(scenario())


def test_a_failed_read_fails_every_caller_sharing_it_and_no_other() -> None:
    async def scenario() -> None:
        reads = Reads()
        reads.fail[1] = RuntimeError("API down")
        fresh = FreshRead(reads)
        sharing, (waiting,) = await in_flight(fresh, reads, sharing=5, waiting=1)
        reads.open(1)
        for task in sharing:
            with pytest.raises(RuntimeError, match="API down"):
                await task
        await reads.release(2)
        assert await waiting == 2

    run(scenario())


def test_a_cancelled_caller_leaves_the_read_and_the_others_alone() -> None:
    async def scenario() -> None:
        reads = Reads()
        fresh = FreshRead(reads)
        (starter, other), waiting = await in_flight(fresh, reads, sharing=2, waiting=3)
        starter.cancel()  # the caller that started read 1 gives up
        waiting[0].cancel()  # and one of those waiting for read 2
        reads.open(1)
        assert await other == 1
        await reads.release(2)
        assert await asyncio.gather(*waiting[1:]) == [2, 2]
        assert starter.cancelled() and waiting[0].cancelled()
        assert reads.begun == 2

    run(scenario())


def test_a_cancelled_read_cancels_its_callers_and_the_next_get_starts_afresh() -> None:
    # What the loop closing under a read in flight looks like: nobody is left waiting forever.
    async def scenario() -> None:
        reads = Reads()
        reads.cancel.add(1)
        fresh = FreshRead(reads)
        (sharing,), (waiting,) = await in_flight(fresh, reads, sharing=1, waiting=1)
        reads.open(1)
        await settle()
        assert sharing.cancelled() and waiting.cancelled()
        again = asyncio.create_task(fresh.get())
        await reads.release(2)
        assert await again == 2

    run(scenario())
