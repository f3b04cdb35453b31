"""The trained DFlash drafter the repository ships (models/smollm2-135m-dflash/), from a drafter
trained by experiments/smollm2_pipeline.py.

    python experiments/ship_drafter.py --work WORK [--drafter dflash_base] --out models/smollm2-135m-dflash

reads WORK/<drafter>/drafter/ (the z-lab layout: config.json + model.safetensors, as training
wrote it), casts the weights to bf16 (every tensor checked finite first), and writes into --out:

    config.json          the drafter's config, torch_dtype bfloat16
    model.safetensors    the backbone in bf16, native names (no head: a Domino head is grafted on it)
    training.json        what made it: the training summary (WORK/training_<drafter>.json), the data
                         summary (WORK/data.json), the target's identity (from the run's manifest),
                         hardware, versions, git sha, the command, and the weights' sha256

The model card (README.md in the same folder) is written by hand from these and the committed
results; `--check DIR` recomputes the sha256 recorded in DIR/training.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def ship(work: Path, drafter: str, out: Path, command: str) -> dict:
    import torch
    from safetensors.torch import load_file

    from domino_graft.artifacts.files import atomic_dir, atomic_write_json
    from domino_graft.artifacts.provenance import git_sha, hardware, versions
    from domino_graft.artifacts.tensors import check_finite, save_tensors

    src = work / drafter / "drafter"
    cfg = json.loads((src / "config.json").read_text())
    tensors = load_file(str(src / "model.safetensors"))
    check_finite(tensors, source=str(src / "model.safetensors"))
    bf16 = {k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}
    cfg["torch_dtype"] = "bfloat16"

    def read(name: str, key: str | None = None):
        path = work / name
        got = json.loads(path.read_text()) if path.is_file() else None
        return got.get(key) if key and got else got

    with atomic_dir(out, overwrite=False) as tmp:
        atomic_write_json(tmp / "config.json", cfg)
        save_tensors(tmp / "model.safetensors", bf16, metadata={"format": "pt", "what": "DFlash drafter backbone"})
        record = {
            "what": "a DFlash drafter for SmolLM2-135M-Instruct trained by experiments/smollm2_pipeline.py "
                    "(backbone only: CE of the base drafter, no Domino head)",
            "model_sha256": sha256(tmp / "model.safetensors"),
            "parameters": sum(v.numel() for v in bf16.values()),
            "bytes": (tmp / "model.safetensors").stat().st_size,
            "training": read(f"training_{drafter}.json"),
            "data": read("data.json"),
            "target": read(f"{drafter}/manifest.json", "target"),
            "hardware": hardware(),
            "versions": versions(),
            "git_sha": git_sha(),
            "command": command,
        }
        atomic_write_json(tmp / "training.json", record)
    return record


def check(folder: Path) -> int:
    rec = json.loads((folder / "training.json").read_text())
    got = sha256(folder / "model.safetensors")
    if got != rec["model_sha256"]:
        print(f"{folder}/model.safetensors: sha256 {got} != recorded {rec['model_sha256']}", file=sys.stderr)
        return 1
    print(f"{folder}/model.safetensors: sha256 {got} matches training.json")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, help="the pipeline's work folder")
    p.add_argument("--drafter", default="dflash_base", help="the trained drafter's name in WORK")
    p.add_argument("--out", type=Path, help="the folder to write (must not exist)")
    p.add_argument("--check", type=Path, default=None, help="verify a shipped folder's sha256 instead")
    args = p.parse_args()
    if args.check is not None:
        return check(args.check)
    if args.work is None or args.out is None:
        p.error("--work and --out are required (or --check DIR)")
    rec = ship(args.work, args.drafter, args.out, " ".join(sys.argv))
    print(f"wrote {args.out}: {rec['parameters']:,} parameters, {rec['bytes'] / 1e6:.1f} MB, sha256 {rec['model_sha256']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
