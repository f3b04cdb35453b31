"""Target features for training: the captured layer outputs the drafter reads.

online:  one no-grad target forward per micro-batch, `capture=adapter.capture_layers()`.
offline: computed once per sequence into RUN/features/<key>/ (safetensors shards, memory
         mapped when read), then every step reads them back instead of running the target.
         The key covers the token data, the target's identity, the capture layers and dtype,
         so a changed dataset or target never reuses stale features.

Both produce the same tensors up to float rounding (tested): the cache is unpadded and
collation pads with zeros, which no trained position attends to.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from ..artifacts.files import atomic_write_json
from ..artifacts.tensors import save_tensors
from ..progress import Progress
from .attention import run_with_fallback

SHARD_SIZE = 256  # sequences per file: few files, and one shard's build is cheap to redo


@torch.no_grad()
def target_features(target, input_ids: torch.Tensor, capture: tuple[int, ...]) -> torch.Tensor:
    # logits_to_keep=1: the [B, T, V] logits are not needed, only the captured layers. The attention
    # runs with the KV heads repeated where SDPA would take its math path (training/attention.py).
    ids = input_ids.to(target.device)
    return run_with_fallback(target.model, lambda: target(ids, capture=capture, logits_to_keep=1)[1])


class OnlineFeatures:
    def __init__(self, target, capture: tuple[int, ...]):
        self.target = target
        self.capture = capture

    def __call__(self, batch: dict, indices: list[int]) -> torch.Tensor:
        return target_features(self.target, batch["input_ids"], self.capture)


def cache_key(data_fingerprint: str, target_identity: dict, capture: tuple[int, ...], dtype: str) -> str:
    blob = json.dumps([data_fingerprint, target_identity.get("config_hash"), target_identity.get("seed"),
                       target_identity.get("path"), list(capture), dtype])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class OfflineFeatures:
    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.index = json.loads((self.folder / "index.json").read_text())
        self._open: dict[int, object] = {}

    def _shard(self, s: int):
        if s not in self._open:
            from safetensors import safe_open

            self._open[s] = safe_open(str(self.folder / f"shard-{s:05d}.safetensors"), framework="pt")
        return self._open[s]

    def get(self, i: int) -> torch.Tensor:
        s, j = divmod(i, self.index["shard_size"])
        return self._shard(s).get_tensor(str(j))

    def __call__(self, batch: dict, indices: list[int]) -> torch.Tensor:
        b, length = batch["input_ids"].shape
        out = torch.zeros(b, length, self.index["dim"], dtype=getattr(torch, self.index["dtype"]))
        for r, i in enumerate(indices):
            f = self.get(i)
            out[r, : f.shape[0]] = f
        return out


def build_offline_cache(root: Path, key: str, examples, target, capture: tuple[int, ...], *, rank: int = 0,
                        world: int = 1, barrier=lambda: None, batch_size: int = 8, progress: bool = True) -> Path:
    """Write the missing shards (rank r builds shards r, r+world, ...) and the index; resumable:
    a finished shard is a complete file (atomic write), so an interrupted build continues."""
    folder = Path(root) / key
    folder.mkdir(parents=True, exist_ok=True)
    n = len(examples)
    num_shards = (n + SHARD_SIZE - 1) // SHARD_SIZE
    mine = [s for s in range(num_shards) if s % world == rank and not (folder / f"shard-{s:05d}.safetensors").is_file()]
    bar = Progress(total=sum(min(SHARD_SIZE, n - s * SHARD_SIZE) for s in mine), desc="caching features",
                   unit="seq", enabled=progress and rank == 0 and bool(mine), dynamic_ncols=True)
    try:
        _write_shards(folder, mine, examples, target, capture, n, batch_size, bar)
    finally:
        bar.close()
    barrier()
    if rank == 0 and not (folder / "index.json").is_file():
        from safetensors import safe_open

        with safe_open(str(folder / "shard-00000.safetensors"), framework="pt") as f:
            t = f.get_tensor("0")
            dim, dtype = t.shape[-1], str(t.dtype).removeprefix("torch.")
        atomic_write_json(folder / "index.json", {
            "key": key, "num_examples": n, "shard_size": SHARD_SIZE, "num_shards": num_shards,
            "dim": dim, "dtype": dtype, "capture_layers": list(capture),
        })
    barrier()
    return folder


def _write_shards(folder: Path, mine: list[int], examples, target, capture, n: int, batch_size: int, bar) -> None:
    """This rank's missing shards, each one atomic file (what makes the build resumable)."""
    for s in mine:
        tensors = {}
        ids = list(range(s * SHARD_SIZE, min(n, (s + 1) * SHARD_SIZE)))
        for c in range(0, len(ids), batch_size):
            chunk = ids[c : c + batch_size]
            length = max(len(examples[i].input_ids) for i in chunk)
            x = torch.zeros(len(chunk), length, dtype=torch.long)
            for r, i in enumerate(chunk):
                x[r, : len(examples[i].input_ids)] = torch.tensor(examples[i].input_ids)
            feats = target_features(target, x, capture).cpu()
            for r, i in enumerate(chunk):
                tensors[str(i - s * SHARD_SIZE)] = feats[r, : len(examples[i].input_ids)].clone()
            bar.update(len(chunk))
        save_tensors(folder / f"shard-{s:05d}.safetensors", tensors, {"format": "domino-graft features"})
