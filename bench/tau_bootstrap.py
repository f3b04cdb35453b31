"""How far the greedy τ ratio (+ Domino / base) of a table row could move with other prompts:
a paired bootstrap over the eval prompts, from smollm2_pipeline eval records.

    python bench/tau_bootstrap.py bench/results/smollm2_h200_gpu_block16 \
        bench/results/smollm2_h200_gpu_block16_seed1 --family dflash --out result.json
    python bench/tau_bootstrap.py --table --out bench/results/tau_bootstrap_smollm2_h200.json

`--table`: every family of the README table, each from the record folders of its source runs, and
the results shown beside its rows (bench/combine_smollm2.py's TABLE and BESIDE: a report X.json
has its records in the folder X/).

Every drafter decodes the same prompts, so one resample draws prompt indices with replacement and
recomputes, for each record folder (a seed), the pooled τ (Σ accepted tokens / Σ target forwards,
as the report computes it) of both drafters on that draw, then the ratio the table reports: the
mean over folders of τ + Domino over the mean over folders of τ base. The spread of that ratio
over resamples is the prompt-sampling uncertainty of the row; the folders' own differences are
the seed part, which two seeds measure only roughly. `share_at_or_above` is the fraction of
resamples whose ratio reaches each threshold: a description of the spread, not a test.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from t1_paired import prompt_counts, shown_path, write_report

THRESHOLDS = (1.10, 1.15)


def load(dirs: list[Path], family: str, num: str, den: str) -> dict:
    """{set: (tokens [folders, prompts, 2], steps [folders, prompts, 2])}, drafters (den, num), prompts
    in index order; every folder must hold both drafters' greedy records of the same prompts."""
    per: dict = {}
    for d in dirs:
        for eval_set, by_variant in prompt_counts(d, "greedy", family).items():
            if den in by_variant or num in by_variant:
                per.setdefault(eval_set, {})[str(d)] = by_variant
    if not per:
        raise ValueError(f"no greedy records of {family}_{den} / {family}_{num} in {', '.join(map(str, dirs))}")
    out = {}
    for eval_set, by_dir in sorted(per.items()):
        if len(by_dir) != len(dirs):
            raise ValueError(f"{eval_set}: greedy records in {len(by_dir)} of the {len(dirs)} folders")
        idx_sets = [sorted(set(by_variant.get(den, {})) | set(by_variant.get(num, {}))) for by_variant in by_dir.values()]
        if any(s != idx_sets[0] for s in idx_sets):
            raise ValueError(f"{eval_set}: the folders decoded different prompts; a paired resample needs the same")
        idx = idx_sets[0]
        tok = np.zeros((len(dirs), len(idx), 2))
        steps = np.zeros_like(tok)
        for f, d in enumerate(map(str, dirs)):
            for p, i in enumerate(idx):
                for c, variant in enumerate((den, num)):
                    if i not in by_dir[d].get(variant, {}):
                        raise ValueError(f"{eval_set}: {d} has no {family}_{variant} record of prompt {i}")
                    tok[f, p, c], steps[f, p, c] = by_dir[d][variant][i]
        out[eval_set] = (tok, steps)
    return out


def ratio_of_means(tok: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """tok/steps [..., folders, prompts, 2] -> the table's ratio [...]: mean τ num / mean τ den over folders."""
    tau = tok.sum(-2) / steps.sum(-2)  # pooled per folder: [..., folders, 2]
    mean = tau.mean(-2)
    return mean[..., 1] / mean[..., 0]


def bootstrap(tok: np.ndarray, steps: np.ndarray, resamples: int, seed: int, chunk: int = 500) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = tok.shape[1]
    out = []
    for start in range(0, resamples, chunk):
        draw = rng.integers(0, n, size=(min(chunk, resamples - start), n))
        out.append(ratio_of_means(tok[:, draw].transpose(1, 0, 2, 3), steps[:, draw].transpose(1, 0, 2, 3)))
    return np.concatenate(out)


def summarize(data: dict, dirs: list, resamples: int, seed: int) -> dict:
    report = {}
    for eval_set, (tok, steps) in data.items():
        boots = bootstrap(tok, steps, resamples, seed)
        lo, hi = np.percentile(boots, [2.5, 97.5])
        report[eval_set] = {
            "prompts": tok.shape[1],
            "ratio": float(ratio_of_means(tok, steps)),
            "ratio_per_folder": {str(d): float(ratio_of_means(tok[f:f + 1], steps[f:f + 1])) for f, d in enumerate(dirs)},
            "bootstrap_ratio_95": [float(lo), float(hi)],
            "bootstrap_ratio_stderr": float(boots.std(ddof=1)),
            "share_at_or_above": {f"{t:.2f}": float((boots >= t).mean()) for t in THRESHOLDS},
        }
    return report


def table_dirs() -> tuple[dict[str, list[Path]], dict[str, list[Path]]]:
    """(family -> the record folders of the README table's source runs, the same for the results
    shown beside its rows: combine_smollm2's TABLE and BESIDE)."""
    from combine_smollm2 import BESIDE, RESULTS, TABLE, source_files

    def folders(entry) -> list[Path]:
        return [RESULTS / Path(n).stem for n in source_files(entry)]

    return ({fam: folders(entry) for fam, entry in TABLE.items()},
            {fam: folders(entry) for fam, (_, entry) in BESIDE.items()})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dirs", nargs="*", type=Path, help="record folders (one per seed) holding eval/greedy_*.jsonl")
    p.add_argument("--table", action="store_true", help="every family of the README table, from its sources' records")
    p.add_argument("--family", default="dflash", choices=("dflash", "medusa", "pard"))
    p.add_argument("--num", default="domino", choices=("domino", "headonly"))
    p.add_argument("--den", default="base", choices=("base", "headonly"))
    p.add_argument("--resamples", type=int, default=20000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.resamples < 100:
        p.error(f"--resamples {args.resamples}: valid: >= 100")
    if args.table == bool(args.dirs):
        p.error("give record folders or --table (not both)")
    command = "python bench/tau_bootstrap.py " + " ".join(sys.argv[1:] if argv is None else argv)
    runs, beside = table_dirs() if args.table else ({args.family: args.dirs}, {})

    def boot(fam: str, dirs: list[Path]) -> dict:
        shown = [shown_path(d) for d in dirs]
        return {"records": shown, "sets": summarize(load(dirs, fam, args.num, args.den), shown, args.resamples, args.seed)}

    report = {"what": f"paired prompt bootstrap of the greedy tau ratio {args.num} / {args.den}",
              "resamples": args.resamples, "seed": args.seed, "command": command,
              "families": {fam: boot(fam, dirs) for fam, dirs in runs.items()},
              **({"beside": {fam: boot(fam, dirs) for fam, dirs in beside.items()}} if beside else {})}
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # domino_graft from a plain checkout
    sys.exit(main())
