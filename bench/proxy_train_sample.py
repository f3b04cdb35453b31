"""The CPU proxies' training draw (bench/dflash_slot1_probe.sh, bench/dflash_rank_probe.sh):
600 code + 200 math responses of a device run's train.regen.jsonl, seed 0, skipping the first 40
of each kind (the probes' training-distribution evaluation sets).

    python bench/proxy_train_sample.py WORK/train.regen.jsonl OUT_DIR/train_sub.jsonl
"""

from __future__ import annotations

import json
import random
import sys


def main(src: str, dst: str) -> None:
    rows = [json.loads(line) for line in open(src, encoding="utf-8")]
    math = [r for r in rows if r["id"].startswith("gsm8k-symbolic")]
    code = [r for r in rows if not r["id"].startswith("gsm8k-symbolic")]
    random.seed(0)
    sub = random.sample(code[40:], 600) + random.sample(math[40:], 200)
    random.shuffle(sub)
    with open(dst, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in sub)


if __name__ == "__main__":
    main(*sys.argv[1:3])
