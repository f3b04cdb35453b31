"""Whether a replay of greedy decodes reproduces the device's: per drafter decode, the target
forwards and accepted tokens of two record folders compared, prompt by prompt.

    python bench/greedy_replay.py bench/results/smollm2_h200_gpu_block16_long2 \
        bench/results/greedy_cpu_block16_long2 --out bench/results/greedy_replay_dflash_block16_long2.json

The first folder holds the device run's records, the second a replay of some of its prompts
(`KIND=greedy bash bench/t1_cpu_recheck.sh`: the returned bf16 weights read back as fp32, on a
CPU). Greedy decoding is deterministic up to arithmetic: where the replay's fp32 sums round a
near-tie differently, one block accepts one token more or less, so the counts may differ by a
forward or two without anything being wrong. What must hold in both is `identical` (the output is
the target's own greedy output) on every decode.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from t1_paired import records_of_kind, shown_path, write_report


def decodes(folder: Path, family: str) -> dict:
    """{(set, variant, prompt idx): (accepted tokens, target forwards, identical)} of one family's
    greedy drafter records (the target's own decodes carry no `identical`)."""
    out = {}
    for r in records_of_kind(folder, "greedy"):
        if r["mode"].startswith(family + "_"):
            out[(r["set"], r["mode"][len(family) + 1:], r["idx"])] = (r["step_tokens"], r["decode_steps"],
                                                                         r.get("identical"))
    if not out:
        raise ValueError(f"{folder}: no greedy records of family {family!r}")
    return out


def compare(device: dict, replay: dict) -> dict:
    """Per eval set and variant: how many replayed decodes took the device's number of target
    forwards, the largest difference, and whether every decode of both was identical to the target."""
    missing = sorted(k for k in replay if k not in device)
    if missing:
        raise ValueError(f"the replay has decodes the device records lack: {missing[:5]} (valid: a replay of "
                         "prompts the device decoded, same family)")
    out: dict = {}
    for key in sorted(replay):
        eval_set, variant, idx = key
        (t_dev, s_dev, id_dev), (t_rep, s_rep, id_rep) = device[key], replay[key]
        row = out.setdefault(eval_set, {}).setdefault(variant, {
            "decodes": 0, "same_forwards": 0, "same_accepted_tokens": 0, "max_abs_forward_difference": 0,
            "identical_to_target_device": True, "identical_to_target_replay": True, "forwards": []})
        row["decodes"] += 1
        row["same_forwards"] += s_dev == s_rep
        row["same_accepted_tokens"] += t_dev == t_rep
        row["max_abs_forward_difference"] = max(row["max_abs_forward_difference"], abs(s_dev - s_rep))
        row["identical_to_target_device"] &= id_dev is True
        row["identical_to_target_replay"] &= id_rep is True
        row["forwards"].append({"idx": idx, "device": s_dev, "replay": s_rep})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("device", type=Path, help="the device run's record folder (eval/greedy_*.jsonl)")
    p.add_argument("replay", type=Path, help="the replay's record folder")
    p.add_argument("--family", default="dflash", choices=("dflash", "medusa", "pard"))
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    report = {"what": "greedy decodes replayed (target forwards per decode, device vs replay)",
              "family": args.family, "device": shown_path(args.device), "replay": shown_path(args.replay),
              "command": "python bench/greedy_replay.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "sets": compare(decodes(args.device, args.family), decodes(args.replay, args.family))}
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
