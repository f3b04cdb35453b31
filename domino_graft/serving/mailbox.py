"""The worker's events to the event loop, one wake-up per burst.

A batched step pushes one text delta per row (serving/scheduler.py `Job.push`). Handing each to the
event loop with its own `loop.call_soon_threadsafe` wakes the loop once per row and step: a write to the
loop's self-pipe in the worker and a turn of the loop per event. A stand-in of the worker with 0.9 ms
steps (`bench/serve_events.py`, bench/results/serve_events_cpu.json, a 2-core CPU) ran 1.35 / 2.30 ms a step
at B = 32 / 64 that way, 1.11 / 1.08 with the events of a step delivered together (B = 1 and 8: the same,
1.04 and 1.17-1.18). So events are posted here and delivered in order by one callback: the first event after a
delivery schedules it, and every event posted before it runs goes with it. DOMINO_GRAFT_SERVE_MAILBOX=0 hands
each event over by itself, as before (an A/B switch: experiments/serve_handover_check.sh).
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref

_BY_LOOP: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Mailbox]" = weakref.WeakKeyDictionary()
_BY_LOOP_LOCK = threading.Lock()


class Mailbox:
    """Events for queues of one event loop, posted from any thread (`post`), delivered on the loop in the
    order they were posted. After the loop has closed, events are dropped: nobody listens."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._lock = threading.Lock()
        self._pending: list[tuple[asyncio.Queue, tuple]] = []
        self._scheduled = False
        self.deliveries = 0  # callbacks run (tests: a burst of events is one delivery)

    def post(self, queue: asyncio.Queue, event: tuple) -> None:
        with self._lock:
            self._pending.append((queue, event))
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:  # the event loop is closed
            with self._lock:
                self._pending.clear()
                self._scheduled = False

    def _deliver(self) -> None:
        with self._lock:
            burst, self._pending = self._pending, []
            self._scheduled = False
        self.deliveries += 1
        for queue, event in burst:
            queue.put_nowait(event)


def mailbox_for(loop: asyncio.AbstractEventLoop) -> Mailbox:
    """The loop's one mailbox (made on first use)."""
    with _BY_LOOP_LOCK:
        box = _BY_LOOP.get(loop)
        if box is None:
            box = _BY_LOOP[loop] = Mailbox(loop)
        return box


def direct_sender(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue):
    """A `send` that hands each event over by itself (one `call_soon_threadsafe` an event: the hand-over before
    the mailbox, kept as its A/B switch and bench/serve_events.py's baseline)."""

    def send(event: tuple) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, event)
        except RuntimeError:  # the event loop is closed: nobody listens
            pass

    return send


def sender(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue):
    """A job's `send`: its events into `queue` through the loop's mailbox (module docstring: the switch)."""
    if os.environ.get("DOMINO_GRAFT_SERVE_MAILBOX", "1") == "0":
        return direct_sender(loop, queue)
    box = mailbox_for(loop)

    def send(event: tuple) -> None:
        box.post(queue, event)

    return send
