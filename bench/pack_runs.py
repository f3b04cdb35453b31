"""Move trained run dirs between machines within a transfer limit (the GPU tool returns at most
8 files of 16 MiB, 64 MiB in all).

  pack   WORK OUT [RUNS]  weights of the run dirs WORK/<run> (comma-separated; default the DFlash
                          three of bench/smollm2_pipeline.py) as bf16 shards (<= 15 MiB each; a
                          larger tensor is split by rows) + a tar.gz of every small file (recipes,
                          manifests, metrics, training data)
  unpack SRC WORK         rebuild the run dirs (fp32 tensors from the bf16 shards)

bf16 is the precision bundles ship in (export.dtype), so the evaluated drafters are the
deployable ones. A `<family>_headonly` run's drafter is the frozen `<family>_base` drafter: stored
once. (Medusa's four LM-head copies, ~230 MB in bf16, do not fit the transfer limit.)
"""

from __future__ import annotations

import sys
import tarfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

RUNS = ("dflash_base", "dflash_domino", "dflash_headonly")
SHARD = 15 * 2**20
WEIGHTS = ("head.safetensors", "drafter/model.safetensors")


def _shares_base_drafter(run: str) -> bool:
    return run.endswith("headonly")


def _bulky(rel: Path) -> bool:
    """Files the weights do not need and the return limit cannot spare: checkpoints, feature
    caches, the eval records (returned in their own archive), the prompts and the per-shard
    regeneration parts (train.regen.jsonl, their merge, is kept)."""
    return bool({"checkpoints", "features", "eval"} & set(rel.parts)) or ".part-" in rel.name \
        or rel.name.startswith("train_prompts")


def _pieces(key: str, v: torch.Tensor, limit: int) -> dict:
    """A tensor over `limit` bytes split by rows into `key|i/n` pieces (W2 [V, r] at rank 256 is
    24 MiB in bf16: no shard could hold it whole)."""
    size = v.numel() * v.element_size()
    if size <= limit or v.dim() == 0:
        return {key: v}
    n = -(-size // limit)
    rows = -(-v.shape[0] // n)
    parts = v.split(rows)
    return {f"{key}|{i}/{len(parts)}": p.contiguous() for i, p in enumerate(parts)}


def pack(work: Path, out: Path, runs=RUNS, shard_bytes: int = SHARD) -> None:
    """Shards are numbered in order; with more than the transfer limit in all, return them over
    several calls (weights.0.. in one, the rest in the next) and unpack them together."""
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for run in runs:
        for f in WEIGHTS:
            p = work / run / f
            if p.exists() and not (_shares_base_drafter(run) and f.startswith("drafter")):
                for k, v in load_file(str(p)).items():
                    tensors.update(_pieces(f"{run}|{f}|{k}", v.to(torch.bfloat16).contiguous(), shard_bytes))
    shard, size, n = {}, 0, 0
    for k, v in tensors.items():
        b = v.numel() * v.element_size()
        if shard and size + b > shard_bytes:
            save_file(shard, str(out / f"weights.{n}.safetensors"))
            shard, size, n = {}, 0, n + 1
        shard[k], size = v, size + b
    if shard:
        save_file(shard, str(out / f"weights.{n}.safetensors"))
    with tarfile.open(out / "runs_meta.tar.gz", "w:gz") as tar:
        for p in sorted(work.rglob("*")):
            if p.is_file() and p.suffix in (".json", ".yaml", ".jsonl", ".log") and not _bulky(p.relative_to(work)):
                tar.add(p, arcname=str(p.relative_to(work)))


def unpack(src: Path, work: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    with tarfile.open(src / "runs_meta.tar.gz") as tar:
        tar.extractall(work, filter="data")
    files: dict[tuple[str, str], dict] = {}
    pieces: dict[tuple[str, str, str], dict] = {}
    for shard in sorted(src.glob("weights.*.safetensors")):
        for k, v in load_file(str(shard)).items():
            run, f, name, *piece = k.split("|")
            if piece:  # "i/n": one row block of a tensor split by `_pieces`
                i, n = (int(x) for x in piece[0].split("/"))
                pieces.setdefault((run, f, name), {"n": n})[i] = v.float()
            else:
                files.setdefault((run, f), {})[name] = v.float()
    for (run, f, name), got in pieces.items():
        n = got.pop("n")
        if sorted(got) != list(range(n)):
            raise SystemExit(f"unpack: {run}/{f} {name}: pieces {sorted(got)} of {n} found in {src}; "
                             "copy every weights.*.safetensors of the pack into one folder")
        files.setdefault((run, f), {})[name] = torch.cat([got[i] for i in range(n)])
    for run in {r for r, _ in files if _shares_base_drafter(r)}:
        base = run[: -len("headonly")] + "base"
        files[(run, "drafter/model.safetensors")] = files[(base, "drafter/model.safetensors")]
    for (run, f), state in files.items():
        dest = work / run / f
        dest.parent.mkdir(parents=True, exist_ok=True)
        save_file(state, str(dest))
    print(f"unpacked {len(files)} weight files into {work}")


if __name__ == "__main__":
    cmd, a, b = sys.argv[1:4]
    if cmd == "pack":
        pack(Path(a), Path(b), tuple(sys.argv[4].split(",")) if len(sys.argv) > 4 else RUNS)
    else:
        unpack(Path(a), Path(b))
