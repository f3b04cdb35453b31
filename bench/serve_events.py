"""What handing the worker's text deltas to the event loop costs `serve` per step (serving/mailbox.py).

A stand-in of the batched worker (serving/scheduler.py) runs --steps steps of B rows: each step holds the
GIL for --host-ms (the launches and the bookkeeping of a launch-bound loop), then waits --device-ms with
the GIL released (a device sync), then sends one delta per row. B asyncio tasks on the event loop consume
them as `serve`'s streamed responses do, encoding one OpenAI chunk (JSON) per chunk they send. Two modes:

    per_event  each event its own `loop.call_soon_threadsafe` and each delta its own chunk (before)
    mailbox    the loop's Mailbox (one wake-up per burst) and queued deltas merged into one chunk
               (serving/app.py `_merged_deltas`)

Reports ms per step against the stand-in's own (host + device) and the chunks a stream sent. No model,
no HTTP: it isolates the hand-over, which a CPU measures as well as the GPU machine's host does.

    python bench/serve_events.py --out bench/results/serve_events_cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import environment, write_json  # noqa: E402

from domino_graft.serving.app import _merged_deltas  # noqa: E402
from domino_graft.serving.mailbox import direct_sender, sender  # noqa: E402


def _chunk(text: str) -> str:  # the size of serve's completion chunk
    obj = {"id": "cmpl-0123456789abcdef01234567", "object": "text_completion", "created": 0, "model": "m",
           "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": None}]}
    return f"data: {json.dumps(obj)}\n\n"


async def _run(mode: str, rows: int, steps: int, host_ms: float, device_ms: float) -> tuple[float, float]:
    """(ms per step, chunks per stream) of one run."""
    loop = asyncio.get_running_loop()
    queues = [asyncio.Queue() for _ in range(rows)]
    sends = [(sender if mode == "mailbox" else direct_sender)(loop, q) for q in queues]

    def worker():
        for _ in range(steps):
            t = time.perf_counter()
            while time.perf_counter() - t < host_ms / 1e3:  # host work: holds the GIL
                pass
            time.sleep(device_ms / 1e3)  # a device sync: the GIL released
            for send in sends:
                send(("delta", " tok"))
        for send in sends:
            send(("done", "length"))

    async def stream(q: asyncio.Queue) -> int:
        chunks = 0
        while True:
            ev = await q.get()
            if ev[0] == "delta":
                text, ev = _merged_deltas(ev[1], q) if mode == "mailbox" else (ev[1], None)
                _chunk(text)
                chunks += 1
                if ev is None:
                    continue
            if ev[0] == "done":
                return chunks

    t0 = time.perf_counter()
    thread = threading.Thread(target=worker)
    thread.start()
    chunks = await asyncio.gather(*(stream(q) for q in queues))
    thread.join()
    return (time.perf_counter() - t0) * 1e3 / steps, statistics.mean(chunks)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,8,32,64", help="batch sizes B (comma-separated)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--host-ms", type=float, default=0.3)
    p.add_argument("--device-ms", type=float, default=0.6)
    p.add_argument("--repeats", type=int, default=5, help="runs per mode and B, the modes alternating; medians")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    step_ms = args.host_ms + args.device_ms
    command = " ".join(["bench/serve_events.py", *(sys.argv[1:] if argv is None else argv)])
    out = {"what": __doc__.splitlines()[0], **environment(command),
           "steps": args.steps, "host_ms": args.host_ms, "device_ms": args.device_ms, "repeats": args.repeats,
           "rows": {}}
    for b in [int(x) for x in args.rows.split(",")]:
        got = {"per_event": [], "mailbox": []}
        for _ in range(args.repeats):
            for mode in got:
                got[mode].append(asyncio.run(_run(mode, b, args.steps, args.host_ms, args.device_ms)))
        row = {}
        for mode, runs in got.items():
            ms = statistics.median(r[0] for r in runs)
            row[mode] = {"ms_per_step": round(ms, 4), "over_the_step_ms": round(ms - step_ms, 4),
                         "chunks_per_stream": round(statistics.median(r[1] for r in runs), 1)}
        out["rows"][str(b)] = row
        print(f"B = {b:3d}: per event {row['per_event']['ms_per_step']:.3f} ms/step "
              f"({row['per_event']['chunks_per_stream']:.0f} chunks), mailbox {row['mailbox']['ms_per_step']:.3f} "
              f"({row['mailbox']['chunks_per_stream']:.0f} chunks); the step itself {step_ms:.2f}")
    if args.out:
        write_json(args.out, out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
