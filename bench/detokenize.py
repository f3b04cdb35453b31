"""What a request's text costs `serve`'s worker per push (serving/text.py): the window (two decodes a push)
against tokenizers' DecodeStream (one Rust step a token, the whole answer decoded once at its end).

Each way turns the same answers into text through `Job.push`, the worker's call for each row at each step, in
chunks of --chunks tokens (a speculative block emits one to K + 1), and reports µs per push (median of --repeats
passes, the two ways in turn) and whether every answer's deltas add up to its whole decode. The answers: GSM8K
test questions encoded by the tokenizer, one after another, cut into --answers pieces of --tokens. No model: the
tokenizer alone.

    python bench/detokenize.py --tokenizer ~/.cache/domino-graft/assets/smollm2-135m-instruct \
        --out bench/results/detokenize_cpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import environment, write_json  # noqa: E402

from domino_graft.sampling import Sampling  # noqa: E402
from domino_graft.serving.scheduler import Job  # noqa: E402
from domino_graft.serving.text import StreamText, WindowText  # noqa: E402


def run(tokenizer, answers: list[list[int]], chunk: int, way: str) -> tuple[float, bool]:
    """Every answer pushed `chunk` tokens at a time -> (seconds, every answer's text equal to its whole decode)."""
    exact, elapsed = True, 0.0
    for ids in answers:
        sent = []
        text = StreamText(tokenizer) if way == "stream" else WindowText(
            lambda t: tokenizer.decode(t, skip_special_tokens=True))
        job = Job([1], max_tokens=len(ids), sampling=Sampling(), stop=[], stop_ids=frozenset(),
                  send=sent.append, text=text)
        t0 = time.perf_counter()
        for at in range(0, len(ids), chunk):
            job.push(ids[at: at + chunk])
        elapsed += time.perf_counter() - t0
        exact &= "".join(e[1] for e in sent if e[0] == "delta") == tokenizer.decode(ids, skip_special_tokens=True)
    return elapsed, exact


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", required=True, help="a folder with a fast tokenizer (tokenizer.json)")
    p.add_argument("--prompts", type=Path, default=Path.home() / ".cache/domino-graft/assets/gsm8k/prompts.jsonl")
    p.add_argument("--answers", type=int, default=64)
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--chunks", default="1,2,4")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    lines = args.prompts.read_text().splitlines()[: 2 * args.answers]
    stream = tokenizer("\n\n".join(json.loads(line)["messages"][-1]["content"] for line in lines))["input_ids"]
    answers = [stream[i: i + args.tokens] for i in range(0, args.answers * args.tokens, args.tokens)]
    answers = [a for a in answers if len(a) == args.tokens]
    rows = []
    for chunk in [int(c) for c in args.chunks.split(",")]:
        row, runs = {"chunk": chunk}, {"window": [], "stream": []}
        for _ in range(args.repeats):  # the ways in turn: a drift in the machine's load meets both
            for way in runs:
                runs[way].append(run(tokenizer, answers, chunk, way))
        pushes = sum(-(-len(a) // chunk) for a in answers)
        for way, passes in runs.items():
            row[f"{way}_us_per_push"] = round(statistics.median(s for s, _ in passes) / pushes * 1e6, 2)
            row[f"{way}_exact"] = all(ok for _, ok in passes)
        row["saved_us_per_push"] = round(row["window_us_per_push"] - row["stream_us_per_push"], 2)
        rows.append(row)
        print(row, flush=True)
    command = " ".join(["bench/detokenize.py", *(sys.argv[1:] if argv is None else argv)])
    write_json(args.out, {"what": __doc__.splitlines()[0], "tokenizer": Path(args.tokenizer).name,
                          "answers": len(answers), "tokens": args.tokens, "repeats": args.repeats,
                          **environment(command), "by_chunk": rows})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
