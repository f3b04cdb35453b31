"""Plots of a smollm2_pipeline.py eval result: tau per eval set and acceptance by slot,
base vs Domino vs head-only.

    python bench/plot_smollm2.py bench/results/smollm2_dflash_eval_cpu.json bench/results/smollm2_dflash.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MODES = (("base", "base DFlash"), ("domino", "DFlash + Domino"), ("headonly", "base + head-only Domino"))


def main(src: str, out: str) -> None:
    rep = json.load(open(src))["dflash"]
    sets = list(rep)
    fig, axes = plt.subplots(1, 1 + len(sets), figsize=(4.2 * (1 + len(sets)), 3.6))
    width = 0.8 / len(MODES)
    for i, (mode, label) in enumerate(MODES):
        taus = [rep[s]["detail"][mode]["tau"] for s in sets]
        axes[0].bar([x + i * width for x in range(len(sets))], taus, width, label=label)
    axes[0].set_xticks([x + width for x in range(len(sets))], sets)
    axes[0].set_ylabel("tau (tokens per target forward)")
    axes[0].set_title("tau, greedy")
    axes[0].legend(fontsize=7)
    for ax, s in zip(axes[1:], sets):
        for mode, label in MODES:
            acc = rep[s]["detail"][mode]["per_slot_acceptance"]
            ax.plot(range(1, len(acc) + 1), [float("nan") if a is None else a for a in acc], marker="o", label=label)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("slot j (given slots < j accepted)")
        ax.set_title(f"{s}: acceptance by slot ({rep[s]['num_prompts']} prompts)")
        ax.grid(alpha=0.3)
    fig.suptitle("SmolLM2-135M-Instruct target, DFlash drafters (block 8)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
