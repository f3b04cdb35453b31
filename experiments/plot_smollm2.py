"""Plots of bench/results/smollm2_h200.json (or any report of experiments/smollm2_pipeline.py, e.g.
bench/results/gemma3_h200.json): per drafter family, tau per eval set (greedy and
temperature 1) and greedy acceptance by slot, base vs Domino vs head-only.

    python experiments/plot_smollm2.py bench/results/smollm2_h200.json bench/results/smollm2_h200.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

VARIANTS = (("base", "base"), ("domino", "+ Domino (same budget)"), ("headonly", "base + head-only Domino"),
            # DSpark's second graft mode (its "domino" is the head on top of the Markov correction)
            ("domino-inplace", "+ Domino in place of the Markov head (same budget)"))
SETS = ("humaneval", "gsm8k")


def main(src: str, out: str) -> None:
    rep = json.load(open(src))
    fams = [f for f in ("dflash", "medusa", "pard", "dspark", "peagle") if f in rep]
    fig, axes = plt.subplots(len(fams), 1 + len(SETS), figsize=(13, 3.6 * len(fams)), squeeze=False)
    width = 0.8 / len(VARIANTS)
    for row, fam in zip(axes, fams):
        r = rep[fam]
        t1_sets = [s for s in SETS if "t1" in r[s]]  # a run cut short may have no T = 1 records at all
        labels = [f"{s}\ngreedy ({r[s]['num_prompts_greedy']})" for s in SETS] + \
                 [f"{s}\nT=1 ({r[s]['t1']['num_prompts']})" for s in t1_sets]  # prompt counts: T=1 may be partial
        # a variant the run never finished training is absent from its report (its "not_trained")
        variants = [(v, label) for v, label in VARIANTS if f"tau_{v}" in r[SETS[0]]]
        for i, (v, label) in enumerate(variants):
            taus = [r[s][f"tau_{v}"] for s in SETS] + [r[s]["t1"][f"tau_{v}"] for s in t1_sets]
            row[0].bar([x + i * width for x in range(len(labels))], taus, width, label=label)
        row[0].set_xticks([x + width * (len(variants) - 1) / 2 for x in range(len(labels))], labels, fontsize=8)
        row[0].set_ylabel("tau (tokens per target forward)")
        untrained = [n.removeprefix(f"{fam}_") for n in r.get("not_trained", {})]
        row[0].set_title(f"{fam}: tau" + (f" (not trained: {', '.join(untrained)})" if untrained else ""), fontsize=10)
        row[0].set_ylim(0, 1.75 * max(bar.get_height() for bar in row[0].patches))  # room for the legend above
        row[0].legend(fontsize=7, loc="upper left")
        for ax, s in zip(row[1:], SETS):
            for v, label in variants:
                acc = r[s]["per_slot_acceptance"][v]
                ax.plot(range(1, len(acc) + 1), [float("nan") if a is None else a for a in acc], marker="o", label=label)
            ax.set_xticks(range(1, len(acc) + 1))
            ax.set_ylim(0, 1.02)
            ax.set_xlabel("slot j (given slots < j accepted)")
            ax.set_title(f"{fam}, {s}: greedy acceptance by slot ({r[s]['num_prompts_greedy']} prompts)", fontsize=9)
            ax.grid(alpha=0.3)
    target = rep.get("what", "SmolLM2-135M-Instruct target").split(" (")[0]  # e.g. "Gemma-3-270M base target"
    title = f"{target} (H200): drafters trained from scratch, chain verification"
    if "combined_from" in rep:  # the README table: each family's rows from its own run
        def name(src):  # one source, or seed repeats (their mean is plotted)
            files = [s["file"].split("/")[-1] for s in ([src] if isinstance(src, dict) else src)]
            return files[0] if len(files) == 1 else "mean of " + " + ".join(files)
        parts = [f"{f}: {name(src)}" for f, src in rep["combined_from"].items()]
        title += "".join(("\n" if i % 3 == 0 else "; ") + p for i, p in enumerate(parts))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
