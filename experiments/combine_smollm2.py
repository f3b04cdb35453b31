"""bench/results/smollm2_h200.json, the results table (docs/results.md): each drafter family's
section copied from the run that measured it at its table configuration, with that run's
provenance beside it.

    python experiments/combine_smollm2.py            # the table's three sources (TABLE below)
    python experiments/combine_smollm2.py --check    # exit 1 if the committed file differs from a rebuild

Each source is itself rebuilt from its committed per-prompt records by `smollm2_pipeline.py
--stages report` (its "command" key). Combining is allowed only when every source trained on the
same responses (data sha256) for the same target (config hash, asset payload): the rows then differ
only in the drafter family and its own settings (the source's scale), never in what they learned
from or what they drafted for. A family with one source has its numbers copied, never recomputed.

A family with several sources (TABLE lists files) is a set of seed repeats: the same scale with
only the `*.seed` overrides changed (checked). Its rows are the mean over the seeds: tau, speedups
and per-slot acceptance averaged, tau_ratio_domino_over_base the ratio of the mean taus,
identical_to_target true only if it is true in every seed; each seed's own numbers stay beside them
under `per_seed`.

BESIDE lists results shown next to a family's table rows without being them, under "beside"
(the same checks, the same averaging): DFlash's rows are its longest equal-budget training
(3,000 steps, scale gpu-block16-long2), and the two 1,500-step seeds (gpu-block16,
gpu-block16-seed1) stay beside them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"

# family -> the result file its rows come from (a list: seed repeats, averaged). DFlash at DESIGN's drafter shape (block 16, 4 layers:
# scale gpu-block16); Medusa and PARD have no block size and use gpu-puzzles' settings, which
# gpu-block16 shares for them exactly. All three trained on the same 12,000 responses.
TABLE = {
    # gpu-block16 at 3,000 steps instead of 1,500 (scale gpu-block16-long2)
    "dflash": "smollm2_h200_gpu_block16_long2.json",
    "medusa": "smollm2_h200_gpu_puzzles.json",
    "pard": "smollm2_h200_pard.json",
}
# family -> (what it is, its sources): shown beside the family's rows, never instead of them
BESIDE = {
    "dflash": ("gpu-block16 (1,500 steps), the mean of seeds 0 and 1",
               ["smollm2_h200_gpu_block16.json", "smollm2_h200_gpu_block16_seed1.json"]),
}
# what must be identical across sources for their rows to share one table
SHARED = (("data", "sha256"), ("target", "config_hash"), ("target", "asset_payload_sha256"), ("eval",))
# Families whose source trained on another greedy regeneration of the table's prompts by the same
# target: bench/results/shipped_drafter_h200/ (the responses the shipped DFlash drafter trained on, made
# on the fast engine; the table's own, e5ea62..., were not committed). Their rows carry that "data"
# block, and beside them the DFlash drafter trained on the same regeneration at the same budget (the
# shipped one) with its head-only graft, from DFLASH_SAME_DATA.
# Issue #29's rows (DSpark, P-EAGLE: bench/results/smollm2_h200_families/, measured 2026-12-02)
OTHER_REGEN: dict[str, str] = {"dspark": "smollm2_h200_families.json", "peagle": "smollm2_h200_families.json"}
# what such a regeneration must share with the table's data: the prompts, the target, the length cap
SAME_PROMPTS = (("data", "sequences"), ("data", "by_source"), ("data", "code_sources"), ("data", "target"),
                ("data", "regen_max_new_tokens"))
SHIPPED_DATA = "shipped_drafter_h200/data.json"
DFLASH_SAME_DATA = "end_to_end_h200.json"


def _get(d: dict, path: tuple):
    for k in path:
        d = d[k]
    return d


def _mean(values: list):
    """Mean of numbers; None where every value is None (a slot no seed reached), else over the rest."""
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _mean_rates(rows: list[list]) -> list:
    """Element-wise mean of per-slot acceptance lists (None: the slot was never reached)."""
    return [_mean(list(col)) for col in zip(*rows)]


def source_files(entry) -> list[str]:
    """A TABLE entry as a list of result files (one source, or seed repeats)."""
    return [entry] if isinstance(entry, str) else list(entry)


def _is_seed(override: str) -> bool:
    return override.split("=")[0].endswith(".seed")


def _same_count(counts: list):
    """A per-seed prompt count: the count when every seed has it, else the list (a cut-short seed)."""
    return counts[0] if len(set(counts)) == 1 else counts


def _without_seeds(overrides: list[str]) -> list[str]:
    """The overrides minus `*.seed=N` (seed 0, the recipes' own, needs no override), with the run's
    work folder (the folder of train.data.path) written as <WORK>: runs in different folders pass
    paths into their own (their data's identity is checked by sha256, SHARED)."""
    data = [o.split("=", 1)[1] for o in overrides if o.startswith("train.data.path=")]
    work = str(Path(data[0]).parent) + "/" if data else None
    return sorted(o.replace(work, "<WORK>/") if work else o for o in overrides if not _is_seed(o))


def _check_seed_repeats(fam: str, sources: list[tuple[str, dict]]) -> None:
    """Seed repeats must be one configuration: the same variants and sets, the same prompts, and
    training overrides that differ only in `*.seed` values."""
    name0, rep0 = sources[0]
    sec0 = rep0[fam]
    seen: dict[tuple, str] = {}
    for name, rep in sources:  # a repeat must be another draw: its own seeds
        seeds = tuple(sorted(o for b in rep[fam]["training_budget"].values() for o in b["overrides"] if _is_seed(o)))
        if seeds in seen:
            raise ValueError(f"{fam}: {name} and {seen[seeds]} trained with the same seeds "
                             f"({', '.join(seeds) or 'no *.seed overrides'}): not two draws")
        seen[seeds] = name
    for name, rep in sources[1:]:
        sec = rep[fam]
        if sorted(sec) != sorted(sec0):
            raise ValueError(f"{fam}: {name} has sections {sorted(sec)}, {name0} has {sorted(sec0)}: not seed repeats")
        for variant, budget in sec0["training_budget"].items():
            other = sec["training_budget"].get(variant)
            if other is None or other["steps"] != budget["steps"] or \
                    _without_seeds(other["overrides"]) != _without_seeds(budget["overrides"]):
                raise ValueError(f"{fam}: {name}'s {variant} training differs from {name0}'s in more than its "
                                 "*.seed overrides (or in steps): not seed repeats of one configuration")
        if rep["recipes"][fam] != rep0["recipes"][fam]:
            raise ValueError(f"{fam}: {name} uses recipe {rep['recipes'][fam]}, {name0} {rep0['recipes'][fam]}")
        for s in (k for k in sec0 if k != "training_budget"):
            if sec[s]["num_prompts_greedy"] != sec0[s]["num_prompts_greedy"]:
                raise ValueError(f"{fam}: {name} decoded {sec[s]['num_prompts_greedy']} {s} prompts, "
                                 f"{name0} {sec0[s]['num_prompts_greedy']}: the means would mix prompt sets")


def _average_seeds(fam: str, sources: list[tuple[str, dict]]) -> dict:
    _check_seed_repeats(fam, sources)
    secs = [rep[fam] for _, rep in sources]
    files = [name for name, _ in sources]
    sets = [k for k in secs[0] if k != "training_budget"]
    variants = [v for v in ("base", "domino", "headonly") if f"tau_{v}" in secs[0][sets[0]]]
    out: dict = {"averaged_over": files}
    for s in sets:
        rows = [sec[s] for sec in secs]
        row: dict = {f"tau_{v}": _mean([r[f"tau_{v}"] for r in rows]) for v in variants}
        row["tau_ratio_domino_over_base"] = row["tau_domino"] / row["tau_base"]
        row["identical_to_target"] = all(r["identical_to_target"] for r in rows)
        row["num_prompts_greedy"] = rows[0]["num_prompts_greedy"]
        row["per_slot_acceptance"] = {v: _mean_rates([r["per_slot_acceptance"][v] for r in rows]) for v in variants}
        for v in variants:
            row[f"speedup_{v}"] = _mean([r.get(f"speedup_{v}") for r in rows])
        # prompt counts are per seed (every seed decodes the same prompts); num_seeds says how many
        row["num_seeds"] = len(rows)
        row["num_prompts_timing"] = _same_count([r.get("num_prompts_timing") for r in rows])
        if all("t1" in r for r in rows):
            row["t1"] = {**{f"tau_{v}": _mean([r["t1"][f"tau_{v}"] for r in rows]) for v in variants},
                         "num_prompts": _same_count([r["t1"]["num_prompts"] for r in rows]),
                         "per_slot_acceptance": {v: _mean_rates([r["t1"]["per_slot_acceptance"][v] for r in rows])
                                                 for v in variants}}
        row["per_seed"] = [
            {"file": f, **{k: r.get(k) for k in ("tau_base", "tau_domino", "tau_headonly", "tau_ratio_domino_over_base",
                                                  "speedup_base", "speedup_domino", "speedup_headonly",
                                                  "identical_to_target", "target_tokens_per_s")}}
            for f, r in zip(files, rows)]
        out[s] = row
    out["training_budget"] = {
        variant: {"steps": budget["steps"],
                  "per_seed": [{"file": f, "step_seconds": sec["training_budget"][variant]["step_seconds"],
                                "overrides": sec["training_budget"][variant]["overrides"]}
                               for f, sec in zip(files, secs)]}
        for variant, budget in secs[0]["training_budget"].items()}
    return out


def _display(path: Path) -> str:
    """A source's path as the table records it: relative to the repository when inside it."""
    path = path.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _provenance(name: str, rep: dict, fam: str) -> dict:
    return {"file": name, "git_sha": rep["git_sha"], "command": rep["command"],
            "recipe": rep["recipes"][fam], "rollout": rep["rollout"], "hardware": rep["hardware"],
            "versions": rep["versions"]}


def _read_sources(fam: str, names, results: Path) -> list[tuple[str, dict]]:
    reps = []
    for name in source_files(names):
        path = results / name
        if not path.is_file():
            raise FileNotFoundError(f"{fam}: source {path} does not exist (valid: a report written by "
                                    "experiments/smollm2_pipeline.py --stages report)")
        rep = json.loads(path.read_text())
        if fam not in rep:
            have = sorted(k for k in rep if k in ("dflash", "medusa", "pard", "dspark", "peagle"))
            raise ValueError(f"{fam}: {name} has no '{fam}' section (it has: {', '.join(have) or 'none'})")
        reps.append((_display(path), rep))
    return reps


def _section(fam: str, reps: list[tuple[str, dict]]) -> dict:
    """One source's section copied, or the mean of seed repeats."""
    return reps[0][1][fam] if len(reps) == 1 else _average_seeds(fam, reps)


def _dflash_same_data(results: Path) -> dict:
    """The shipped DFlash drafter's tau (base, and with its head-only Domino graft) on both sets,
    from the end-to-end run (bf16 engine)."""
    path = results / DFLASH_SAME_DATA
    e2e = json.loads(path.read_text())
    rows = e2e["dtypes"]["bf16"]["dflash"]
    return {"what": "the shipped DFlash drafter (gpu-block16, 1,500 steps, trained on this regeneration) and "
                    "its head-only Domino graft (500 steps), greedy on the fast bf16 engine",
            "file": _display(path), "git_sha": e2e["git_sha"],
            **{s: {"tau_base": rows[s]["tau_base"], "tau_headonly": rows[s]["tau_domino"],
                   "identical_to_target": rows[s]["identical_to_target"]} for s in ("gsm8k", "humaneval")}}


def _other_regen_section(fam: str, name: str, rep: dict, first: dict, first_name: str, results: Path,
                         dflash_same_data: dict) -> dict:
    """A family trained on another regeneration of the table's prompts (OTHER_REGEN): the same
    target, eval and prompts as the table, and exactly the shipped drafter's responses."""
    for key in tuple(k for k in SHARED if k[0] != "data") + SAME_PROMPTS:
        if _get(rep, key) != _get(first, key):
            raise ValueError(f"{fam}: {name} differs from {first_name} in {'.'.join(key)}: not a regeneration "
                             "of the table's prompts by its target, evaluated the same way")
    shipped = json.loads((results / SHIPPED_DATA).read_text())["sha256"]
    if rep["data"]["sha256"] != shipped:
        raise ValueError(f"{fam}: {name} trained on data {rep['data']['sha256'][:12]}..., not the shipped "
                         f"drafter's ({shipped[:12]}..., {SHIPPED_DATA}): its DFlash comparison would not hold")
    return {**rep[fam], "data": rep["data"],
            "data_note": f"another greedy regeneration of the table's prompts by the same target ({SHIPPED_DATA}, "
                         "the shipped DFlash drafter's data); the table's other rows trained on data "
                         f"{first['data']['sha256'][:12]}...",
            "dflash_same_data": dflash_same_data}


def combine(table: dict = TABLE, results: Path = RESULTS, beside: dict | None = None,
            other_regen: dict | None = None) -> dict:
    """The table from `table`'s sources, plus `beside`'s (family -> (what, sources)) next to it and
    `other_regen`'s families (trained on another regeneration). The committed file is
    combine(TABLE, RESULTS, BESIDE, OTHER_REGEN)."""
    beside = beside or {}
    other = {fam: _read_sources(fam, name, results)[0] for fam, name in (other_regen or {}).items()}
    same_data = _dflash_same_data(results) if other else None
    sources = {fam: _read_sources(fam, names, results) for fam, names in table.items()}
    extra = {fam: (what, _read_sources(fam, names, results)) for fam, (what, names) in beside.items()}
    first_fam, ((first_name, first), *_) = next(iter(sources.items()))
    for fam, reps in [*sources.items(), *((f, r) for f, (_, r) in extra.items())]:
        for name, rep in reps:
            for key in SHARED:
                if _get(rep, key) != _get(first, key):
                    raise ValueError(f"{fam}: {name} differs from {first_name} ({first_fam}) in {'.'.join(key)}: "
                                     "rows trained or evaluated differently cannot share one table")
    out = {
        "what": first["what"],
        "combined_from": {
            fam: (_provenance(*reps[0], fam) if len(reps) == 1 else [_provenance(n, r, fam) for n, r in reps])
            for fam, reps in sources.items()
        } | {fam: _provenance(name, rep, fam) for fam, (name, rep) in other.items()},
        **{fam: _section(fam, reps) for fam, reps in sources.items()},
        **{fam: _other_regen_section(fam, name, rep, first, first_name, results, same_data)
           for fam, (name, rep) in other.items()},
        **({"beside": {fam: {"what": what, "combined_from": [_provenance(n, r, fam) for n, r in reps],
                             **_section(fam, reps)} for fam, (what, reps) in extra.items()}} if extra else {}),
        "data": first["data"],
        "eval": first["eval"],
        "target": first["target"],
        "command": "python experiments/combine_smollm2.py",
    }
    return out


def _family_files(p: argparse.ArgumentParser, flag: str, item: str):
    """FAMILY=FILE[,FILE...] -> (family, one file or seed repeats)."""
    fam, _, files = item.partition("=")
    if fam not in ("dflash", "medusa", "pard") or not files:
        p.error(f"{flag} {item!r}: valid: FAMILY=FILE[,FILE...] with FAMILY one of dflash, medusa, pard")
    names = files.split(",")
    return fam, names[0] if len(names) == 1 else names


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(RESULTS / "smollm2_h200.json"))
    p.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    p.add_argument("--results", type=Path, default=RESULTS, help="the folder the sources are read from")
    p.add_argument("--source", action="append", default=[], metavar="FAMILY=FILE[,FILE...]",
                   help="replace TABLE's sources for a family (several files: seed repeats, averaged); "
                        "with any --source, only the families given are combined")
    p.add_argument("--beside", action="append", default=[], metavar="FAMILY=FILE[,FILE...]",
                   help="with --source: the results shown beside a family's rows (BESIDE's families only)")
    args = p.parse_args(argv)
    table, beside, other = TABLE, BESIDE, OTHER_REGEN
    if args.source:
        other = {}
        table = dict(_family_files(p, "--source", item) for item in args.source)
        beside = {}
        for item in args.beside:
            fam, names = _family_files(p, "--beside", item)
            if fam not in BESIDE:
                p.error(f"--beside {item!r}: valid families: {', '.join(BESIDE)}")
            beside[fam] = (BESIDE[fam][0], names)
    elif args.beside:
        p.error("--beside goes with --source (without --source, TABLE and BESIDE are used)")
    report = combine(table, args.results, beside, other)
    text = json.dumps(report, indent=2) + "\n"
    out = Path(args.out)
    if args.check:
        same = out.is_file() and json.loads(out.read_text()) == report
        names = [n for v in [*table.values(), *(f for _, f in beside.values()), *set(other.values())]
                 for n in source_files(v)]
        print(f"{out}: {'matches' if same else 'DIFFERS from'} a rebuild from {', '.join(names)}")
        return 0 if same else 1
    from domino_graft.artifacts.files import atomic_write_text

    atomic_write_text(out, text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
