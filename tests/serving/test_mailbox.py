"""The worker's events to the event loop (serving/mailbox.py) and the merged deltas of a stream
(serving/app.py `_merged_deltas`): every event arrives, in order, in fewer wake-ups than events."""

import asyncio
import threading

from domino_graft.serving.app import _merged_deltas
from domino_graft.serving.mailbox import mailbox_for, sender


def test_events_from_a_thread_arrive_in_order_in_bursts():
    async def main():
        loop = asyncio.get_running_loop()
        queues = [asyncio.Queue() for _ in range(8)]
        sends = [sender(loop, q) for q in queues]

        def worker():
            for step in range(50):
                for r, send in enumerate(sends):
                    send(("delta", f"{r}:{step}"))
            for send in sends:
                send(("done", "length"))

        thread = threading.Thread(target=worker)
        thread.start()
        got = []
        for q in queues:
            events = []
            while not events or events[-1][0] != "done":
                events.append(await q.get())
            got.append(events)
        thread.join()
        return got, mailbox_for(loop).deliveries

    got, deliveries = asyncio.run(main())
    for r, events in enumerate(got):
        assert events == [("delta", f"{r}:{s}") for s in range(50)] + [("done", "length")]
    assert deliveries >= 1  # they came through the mailbox


def test_events_posted_while_the_loop_is_busy_arrive_in_one_delivery():
    async def main():
        loop = asyncio.get_running_loop()
        queues = [asyncio.Queue() for _ in range(4)]
        sends = [sender(loop, q) for q in queues]
        # the loop cannot run callbacks while this coroutine blocks on the join: every event waits for one delivery
        thread = threading.Thread(target=lambda: [send(("delta", str(i))) for i in range(10) for send in sends])
        thread.start()
        thread.join()
        got = [[await q.get() for _ in range(10)] for q in queues]
        return got, mailbox_for(loop).deliveries

    got, deliveries = asyncio.run(main())
    assert got == [[("delta", str(i)) for i in range(10)]] * 4
    assert deliveries == 1


def test_a_closed_loop_drops_events_without_raising():
    loop = asyncio.new_event_loop()
    q = asyncio.Queue()
    send = sender(loop, q)
    loop.close()
    send(("delta", "x"))  # nobody listens: dropped
    send(("done", "stop"))
    assert mailbox_for(loop)._pending == []


def test_queued_deltas_merge_up_to_the_next_other_event():
    async def main():
        q = asyncio.Queue()
        for ev in [("delta", "b"), ("delta", "c"), ("done", "stop"), ("delta", "late")]:
            q.put_nowait(ev)
        first = _merged_deltas("a", q)
        q2 = asyncio.Queue()
        q2.put_nowait(("delta", " d"))
        return first, [q.get_nowait() for _ in range(q.qsize())], _merged_deltas("c", q2), q2.empty()

    (text, nxt), rest, (text2, nxt2), empty = asyncio.run(main())
    assert (text, nxt) == ("abc", ("done", "stop"))
    assert rest == [("delta", "late")]  # what follows the other event stays queued, in order
    assert (text2, nxt2, empty) == ("c d", None, True)


def test_the_switch_hands_each_event_over_by_itself(monkeypatch):
    monkeypatch.setenv("DOMINO_GRAFT_SERVE_MAILBOX", "0")

    async def main():
        loop = asyncio.get_running_loop()
        q = asyncio.Queue()
        send = sender(loop, q)
        thread = threading.Thread(target=lambda: [send(("delta", str(i))) for i in range(20)] + [send(("done", "x"))])
        thread.start()
        got = [await q.get() for _ in range(21)]
        thread.join()
        return got, mailbox_for(loop).deliveries

    got, deliveries = asyncio.run(main())
    assert got == [("delta", str(i)) for i in range(20)] + [("done", "x")]
    assert deliveries == 0  # not through the mailbox
