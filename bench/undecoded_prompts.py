"""How much could the prompts a run never decoded move its greedy τ ratio (+ Domino / base)?

    python bench/undecoded_prompts.py bench/results/smollm2_h200_gpu_block16_long \
        --compare bench/results/smollm2_h200_gpu_block16 bench/results/smollm2_h200_gpu_block16_seed1 \
        --out bench/results/undecoded_prompts_dflash_long.json

A run cut short (its device time ran out) has decoded only part of an eval set. This reads its
greedy records (and those of comparison runs that decoded the whole set) and reports, per set:

- `undecoded`: the prompt indices the comparison runs decoded and this run did not;
- `ratio_decoded`: the run's ratio over the prompts it decoded (what its report says);
- `comparison_ratio_on_the_same_prompts`: each comparison run's ratio over exactly those prompts
  (and over all of its own), and the mean of the comparison runs' τ, as the table averages seeds —
  a like-for-like comparison;
- `per_prompt_extra_forwards`: over the decoded prompts, + Domino's target forwards minus base's
  on one prompt (min, max), and on the undecoded prompts in each comparison run;
- `extra_forwards_to_fall_below`: for each threshold, how many more target forwards + Domino would
  have to spend than base, summed over the undecoded prompts, for the ratio over the whole set to
  fall below it — for a range of base τ on those prompts, each undecoded prompt taken to hold the
  decoded prompts' mean accepted tokens (greedy decoding emits the same tokens under both
  drafters).

τ is pooled as the report pools it: Σ accepted tokens / Σ target forwards.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from t1_paired import prompt_counts, shown_path, write_report

THRESHOLDS = (1.15,)
BASE_TAUS = (1.5, 2.0, 2.5, 3.0)  # base τ on the undecoded prompts the thresholds are solved for


def per_prompt(folder: Path, family: str) -> dict:
    """{set: {idx: {variant: (accepted tokens, target forwards)}}} for base and + Domino, over the
    prompts both decoded."""
    out = {}
    for eval_set, by_variant in prompt_counts(folder, "greedy", family).items():
        base, domino = by_variant.get("base", {}), by_variant.get("domino", {})
        out[eval_set] = {i: {"base": base[i], "domino": domino[i]} for i in base if i in domino}
    return out


def pooled(rows: dict, idxs) -> dict:
    """Pooled τ of base and + Domino over `idxs`, and their ratio."""
    tau = {v: sum(rows[i][v][0] for i in idxs) / sum(rows[i][v][1] for i in idxs) for v in ("base", "domino")}
    return {"tau_base": tau["base"], "tau_domino": tau["domino"], "ratio": tau["domino"] / tau["base"],
            "prompts": len(idxs)}


def extra_forwards_to_fall_below(rows: dict, n_missing: int, threshold: float, base_tau: float) -> float:
    """Summed extra target forwards (+ Domino minus base) over `n_missing` undecoded prompts that
    puts the whole set's ratio exactly at `threshold`, each undecoded prompt holding the decoded
    prompts' mean accepted tokens and decoded by base at τ `base_tau`."""
    tok = {v: sum(d[v][0] for d in rows.values()) for v in ("base", "domino")}
    fwd = {v: sum(d[v][1] for d in rows.values()) for v in ("base", "domino")}
    per = (tok["base"] + tok["domino"]) / 2 / len(rows)
    add_tok = n_missing * per
    base_fwd = fwd["base"] + add_tok / base_tau
    tau_base = (tok["base"] + add_tok) / base_fwd
    # ratio = (tok_d + add) / (fwd_d + add / base_tau + x) / tau_base = threshold, solved for x
    return (tok["domino"] + add_tok) / (threshold * tau_base) - fwd["domino"] - add_tok / base_tau


def analyse(run: Path, compare: list[Path], family: str) -> dict:
    mine = per_prompt(run, family)
    others = {shown_path(c): per_prompt(c, family) for c in compare}
    sets = {}
    for s, rows in sorted(mine.items()):
        decoded = sorted(rows)
        everyone = sorted(set().union(*(set(o.get(s, {})) for o in others.values()))) if others else decoded
        undecoded = [i for i in everyone if i not in rows]
        missing = [c for c, o in others.items() if not set(decoded) <= set(o.get(s, {}))]
        if missing:
            raise ValueError(f"{s}: {', '.join(missing)} did not decode every prompt {shown_path(run)} decoded "
                             "(valid: comparison runs that decoded the whole set)")
        diffs = [rows[i]["domino"][1] - rows[i]["base"][1] for i in decoded]
        same = {c: {"on_the_same_prompts": pooled(o[s], decoded), "on_all_its_prompts": pooled(o[s], sorted(o[s]))}
                for c, o in others.items()}
        entry = {
            "decoded": len(decoded), "undecoded": undecoded, "ratio_decoded": pooled(rows, decoded),
            "comparison_ratio_on_the_same_prompts": same,
            "per_prompt_extra_forwards": {
                "decoded_min": min(diffs), "decoded_max": max(diffs),
                "undecoded_in_comparison_runs": {c: {i: o[s][i]["domino"][1] - o[s][i]["base"][1] for i in undecoded}
                                                 for c, o in others.items()}},
        }
        if len(others) > 1:  # the mean of the comparison runs' τ, as combine_smollm2 averages seed repeats
            taus = [x["on_the_same_prompts"] for x in same.values()]
            mean = {v: sum(t[f"tau_{v}"] for t in taus) / len(taus) for v in ("base", "domino")}
            entry["comparison_mean_on_the_same_prompts"] = {**{f"tau_{v}": mean[v] for v in mean},
                                                            "ratio": mean["domino"] / mean["base"]}
        if undecoded:
            entry["extra_forwards_to_fall_below"] = {
                f"{t:.2f}": {f"base_tau_{b}": extra_forwards_to_fall_below(rows, len(undecoded), t, b)
                             for b in BASE_TAUS} for t in THRESHOLDS}
        sets[s] = entry
    return {"run": shown_path(run), "compare": list(others), "family": family, "sets": sets}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="the record folder of the run cut short")
    p.add_argument("--compare", type=Path, nargs="*", default=[], help="record folders that decoded every prompt")
    p.add_argument("--family", default="dflash", choices=("dflash", "medusa", "pard"))
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    report = analyse(args.run, args.compare, args.family)
    report["command"] = "python bench/undecoded_prompts.py " + " ".join(sys.argv[1:] if argv is None else argv)
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # domino_graft from a plain checkout
    sys.exit(main())
