"""Temperature-1 τ per drafter, with paired per-prompt differences, from smollm2_pipeline eval records.

    python bench/t1_paired.py bench/results/smollm2_h200_gpu_block16 [MORE_RECORD_DIRS] --family dflash \
        --out result.json

The pooled τ (Σ tokens per step / Σ steps, as the report computes it) of a few dozen sampled prompts
moves by several hundredths between drafters by chance alone. Every drafter decodes the same prompts
with the same seed per prompt, so the per-prompt differences (τ_a − τ_b on one prompt) cancel
the prompt's own difficulty; their mean ± standard error says whether a gap is more than noise.
Several record folders (e.g. the GPU's and a CPU re-run's) are pooled as independent prompts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PAIRS = (("domino", "base"), ("headonly", "base"), ("domino", "headonly"))


def records_of_kind(folder: Path, kind: str) -> list[dict]:
    """The eval records of one kind (greedy, t1, timing) in a record folder, read by the report's
    own reader; a clear error when the folder holds none."""
    from smollm2_pipeline import _read_records

    if not any((folder / "eval").glob(f"{kind}_*.jsonl")):
        raise FileNotFoundError(f"{folder}: no eval/{kind}_*.jsonl records (valid: a work or records folder "
                                f"of bench/smollm2_pipeline.py after `--stages eval --kind {kind}`)")
    return [r for r in _read_records(folder) if r.get("kind") == kind]


def prompt_counts(folder: Path, kind: str, family: str) -> dict:
    """{set: {variant: {prompt idx: (accepted tokens, target forwards)}}} of one family's records of
    one kind in a record folder, in record order."""
    out: dict = {}
    for r in records_of_kind(folder, kind):
        if r["mode"].startswith(family + "_"):
            variant = r["mode"][len(family) + 1:]
            out.setdefault(r["set"], {}).setdefault(variant, {})[r["idx"]] = (r["step_tokens"], r["decode_steps"])
    return out


def load(dirs: list[Path], family: str) -> dict:
    """{set: {variant: {(folder, prompt idx): (step_tokens, steps)}}} over every t1 record of the family."""
    out: dict = {}
    for d in dirs:
        for eval_set, by_variant in prompt_counts(d, "t1", family).items():
            for variant, counts in by_variant.items():
                out.setdefault(eval_set, {}).setdefault(variant, {}).update({(str(d), i): c for i, c in counts.items()})
    if not out:
        raise ValueError(f"no t1 records of family {family!r} in {', '.join(map(str, dirs))}")
    return out


def _mean_se(xs: list[float]) -> dict:
    n = len(xs)
    mean = sum(xs) / n
    se = (sum((x - mean) ** 2 for x in xs) / (n - 1) / n) ** 0.5 if n > 1 else None
    return {"mean": mean, "stderr": se, "n": n}


def summarize(recs: dict) -> dict:
    report = {}
    for eval_set, by_variant in sorted(recs.items()):
        tau = {v: sum(t for t, _ in p.values()) / sum(s for _, s in p.values()) for v, p in by_variant.items()}
        paired = {}
        for a, b in PAIRS:
            if a in by_variant and b in by_variant:
                common = sorted(set(by_variant[a]) & set(by_variant[b]))
                diffs = [by_variant[a][k][0] / by_variant[a][k][1] - by_variant[b][k][0] / by_variant[b][k][1]
                         for k in common]
                if diffs:
                    paired[f"{a}_minus_{b}"] = _mean_se(diffs)
        report[eval_set] = {"prompts": {v: len(p) for v, p in by_variant.items()}, "tau_pooled": tau,
                            "per_prompt_tau_difference": paired}
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dirs", nargs="+", type=Path, help="folders holding eval/t1_*.jsonl")
    p.add_argument("--family", default="dflash", choices=("dflash", "medusa", "pard"))
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    report = {"what": "temperature-1 tau per drafter and paired per-prompt differences",
              "family": args.family, "records": [str(d) for d in args.dirs],
              "command": "python bench/t1_paired.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "sets": summarize(load(args.dirs, args.family))}
    write_report(report, args.out)
    return 0


def shown_path(d: Path) -> str:
    """A folder as a report names it: relative to the repository when inside it."""
    repo = Path(__file__).resolve().parents[1]
    d = d.resolve()
    return str(d.relative_to(repo)) if d.is_relative_to(repo) else str(d)


def write_report(report: dict, out: Path | None) -> None:
    """Print the report as JSON, and write it to `out` (atomically) when given."""
    text = json.dumps(report, indent=2) + "\n"
    if out:
        from domino_graft.checkpoint import atomic_write_text

        atomic_write_text(out, text)
    print(text, end="")


if __name__ == "__main__":
    sys.exit(main())
