"""bench/results/smollm2_h200.json, the README table: each drafter family's section copied from the
run that measured it at its table configuration, with that run's provenance beside it.

    python bench/combine_smollm2.py            # the table's three sources (TABLE below)
    python bench/combine_smollm2.py --check    # exit 1 if the committed file differs from a rebuild

Each source is itself rebuilt from its committed per-prompt records by `smollm2_pipeline.py
--stages report` (its "command" key). Combining is allowed only when every source trained on the
same responses (data sha256) for the same target (config hash, asset payload): the rows then differ
only in the drafter family and its own settings (the source's scale), never in what they learned
from or what they drafted for. Numbers are copied, never recomputed or averaged.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"

# family -> the result file its rows come from. DFlash at DESIGN's drafter shape (block 16, 4 layers:
# scale gpu-block16); Medusa and PARD have no block size and use gpu-puzzles' settings, which
# gpu-block16 shares for them exactly. All three trained on the same 12,000 responses.
TABLE = {
    "dflash": "smollm2_h200_gpu_block16.json",
    "medusa": "smollm2_h200_gpu_puzzles.json",
    "pard": "smollm2_h200_pard.json",
}
# what must be identical across sources for their rows to share one table
SHARED = (("data", "sha256"), ("target", "config_hash"), ("target", "asset_payload_sha256"), ("eval",))


def _get(d: dict, path: tuple):
    for k in path:
        d = d[k]
    return d


def combine(table: dict[str, str] = TABLE, results: Path = RESULTS) -> dict:
    sources = {}
    for fam, name in table.items():
        path = results / name
        if not path.is_file():
            raise FileNotFoundError(f"{fam}: source {path} does not exist (valid: a report written by "
                                    "bench/smollm2_pipeline.py --stages report)")
        rep = json.loads(path.read_text())
        if fam not in rep:
            have = sorted(k for k in rep if k in ("dflash", "medusa", "pard"))
            raise ValueError(f"{fam}: {name} has no '{fam}' section (it has: {', '.join(have) or 'none'})")
        sources[fam] = (name, rep)
    first_fam, (first_name, first) = next(iter(sources.items()))
    for fam, (name, rep) in sources.items():
        for key in SHARED:
            if _get(rep, key) != _get(first, key):
                raise ValueError(f"{fam}: {name} differs from {first_name} ({first_fam}) in {'.'.join(key)}: "
                                 "rows trained or evaluated differently cannot share one table")
    out = {
        "what": first["what"],
        "combined_from": {
            fam: {"file": f"bench/results/{name}", "git_sha": rep["git_sha"], "command": rep["command"],
                  "recipe": rep["recipes"][fam], "rollout": rep["rollout"], "hardware": rep["hardware"],
                  "versions": rep["versions"]}
            for fam, (name, rep) in sources.items()
        },
        **{fam: rep[fam] for fam, (_, rep) in sources.items()},
        "data": first["data"],
        "eval": first["eval"],
        "target": first["target"],
        "command": "python bench/combine_smollm2.py",
    }
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(RESULTS / "smollm2_h200.json"))
    p.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = p.parse_args(argv)
    report = combine()
    text = json.dumps(report, indent=2) + "\n"
    out = Path(args.out)
    if args.check:
        same = out.is_file() and json.loads(out.read_text()) == report
        print(f"{out}: {'matches' if same else 'DIFFERS from'} a rebuild from {', '.join(TABLE.values())}")
        return 0 if same else 1
    from domino_graft.checkpoint import atomic_write_text

    atomic_write_text(out, text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
