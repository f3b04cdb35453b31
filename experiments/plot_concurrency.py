"""Plot of a bench/concurrency.py report: speedup over the target alone against batch size, for
the base drafter and + Domino (tokens/s of the same batch size's target-alone decode), with the
target alone's own tokens/s beside it.

    python experiments/plot_concurrency.py concurrency_h200.json concurrency_h200.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def speedups(rep: dict) -> list[tuple[int, float, float, float]]:
    """(batch size, base speedup, Domino speedup, target tokens/s) of each numeric row ("1_batched",
    the batched path at B = 1, is left out: the curve is the engine's default path)."""
    out = []
    for key, row in rep["rows"].items():
        if not key.isdigit() or not row.get("target_tokens_per_s"):
            continue
        t = row["target_tokens_per_s"]
        out.append((int(key), row["base_tokens_per_s"] / t, row["domino_tokens_per_s"] / t, t))
    return sorted(out)


def main(src: str, out: str) -> None:
    rep = json.load(open(src))
    pts = speedups(rep)
    if not pts:
        raise SystemExit(f"{src}: no measured batch size in rows")
    bs = [p[0] for p in pts]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    ax.plot(bs, [p[1] for p in pts], "o-", label="base drafter")
    ax.plot(bs, [p[2] for p in pts], "s-", label="+ Domino")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xticks(bs, [str(b) for b in bs])
    ax.set_xlabel("batch size")
    ax.set_ylabel("speedup over the target alone (same batch size)")
    ax.legend()
    ax2.plot(bs, [p[3] for p in pts], "o-", color="black")
    ax2.set_xscale("log", base=2)
    ax2.set_xticks(bs, [str(b) for b in bs])
    ax2.set_xlabel("batch size")
    ax2.set_ylabel("target alone, total tokens/s")
    fig.suptitle(f"{rep.get('device', '?')}, {rep.get('dtype', '?')}, {rep.get('num_prompts', '?')} prompts, "
                 f"git {rep.get('git_sha') or '?'}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])
