"""bench/pack_runs.py: run dirs survive a pack -> unpack round trip in bf16, tensors larger than a
shard included (split by rows, joined back), and a pack missing a piece is refused by name."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

REPO = Path(__file__).resolve().parents[1]


def _pack_runs():
    spec = importlib.util.spec_from_file_location("pack_runs", REPO / "bench" / "pack_runs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _bf16_exact(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16).float()


def test_round_trip_splits_and_joins_large_tensors(tmp_path):
    pr = _pack_runs()
    work, out, back = tmp_path / "work", tmp_path / "out", tmp_path / "back"
    w2 = _bf16_exact(1001, 64, seed=0)  # 128 KB in bf16: over the 40 KB shard below, so split
    drafter = {"fc.weight": _bf16_exact(32, 96, seed=1), "norm.weight": _bf16_exact(32, seed=2)}
    for run, head in (("dflash_base", {"embed_proj.2.weight": torch.zeros(1001, 64)}),
                      ("dflash_domino", {"embed_proj.2.weight": w2})):
        (work / run / "drafter").mkdir(parents=True)
        save_file(drafter, str(work / run / "drafter" / "model.safetensors"))
        save_file(head, str(work / run / "head.safetensors"))
        (work / run / "manifest.json").write_text("{}")
    pr.pack(work, out, ("dflash_base", "dflash_domino"), shard_bytes=40 * 1024)
    shards = sorted(out.glob("weights.*.safetensors"))
    assert len(shards) > 2 and all(p.stat().st_size < 48 * 1024 for p in shards)
    pr.unpack(out, back)
    got = load_file(str(back / "dflash_domino" / "head.safetensors"))
    assert torch.equal(got["embed_proj.2.weight"], w2)
    assert load_file(str(back / "dflash_base" / "drafter" / "model.safetensors")).keys() == drafter.keys()
    assert (back / "dflash_domino" / "manifest.json").exists()

    # a pack returned over two calls but unpacked from one of them: refused, naming the tensor
    for p in shards[1:]:
        p.unlink()
    with pytest.raises(SystemExit, match="embed_proj.2.weight"):
        pr.unpack(out, tmp_path / "partial")
