"""Resuming training exactly: the run's training checkpoints (save, list, prune, load).

    RUN/checkpoints/step-N/         written atomically (a temp folder renamed into place)
        model.safetensors           trainable tensors only (head + backbone or LoRA), by module path
        optimizer.pt                AdamW state, keyed by parameter path (world-size independent)
        trainer.pt                  LR scheduler state, RNG states of every rank
        state.json                  step, λ, samples/tokens seen, what the checkpoint assumes

Full (unsharded) state dicts via torch.distributed.checkpoint's helpers, so a checkpoint
written by N ranks resumes on M ranks, and a single process uses the same code. The files
themselves go through domino_graft/artifacts/ (atomic writes, strict tensor checks); what
training finally writes into the run is training/weights.py.
"""

from __future__ import annotations

import io
import random
import shutil
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from ..artifacts.files import CheckpointError, atomic_dir, atomic_write_bytes, atomic_write_json, read_json
from ..artifacts.provenance import now
from ..artifacts.tensors import (check_dtypes, check_tensors, dtype_name, first_nonfinite, load_tensors, save_tensors,
                                 torch_load)


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    out = []
    for p in checkpoint_dir(run_dir).glob("step-*"):
        tail = p.name.removeprefix("step-")
        if tail.isdigit() and (p / "state.json").is_file():
            out.append((int(tail), p))
    return sorted(out)


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


# what resume reads from state.json, and the type each must have
STATE_FIELDS = {"step": int, "train": dict, "max_steps": int, "tokens_seen": int}


def read_checkpoint_state(path: Path) -> dict:
    """A checkpoint's state.json, checked: valid JSON with the fields resume reads."""
    f = Path(path) / "state.json"
    state = read_json(f)
    for key, typ in STATE_FIELDS.items():
        if key not in state:
            raise CheckpointError(f"{f}: field {key!r} is missing; the checkpoint is damaged: resume from an "
                                  "earlier one (delete this folder) or start over")
        if not isinstance(state[key], typ) or isinstance(state[key], bool):
            raise CheckpointError(f"{f}: field {key!r} is {state[key]!r}, expected {typ.__name__}")
    return state


def _torch_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def rng_state() -> dict:
    import numpy as np

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [kind, keys.tolist(), pos, has_gauss, cached],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    import numpy as np

    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def state_dict_options(info, *, trainable_only: bool) -> StateDictOptions:
    # cpu_offload with full_state_dict gathers to rank 0 only: the other ranks get empty dicts.
    return StateDictOptions(full_state_dict=True, cpu_offload=info.active, ignore_frozen_params=trainable_only)


def save_checkpoint(run_dir: Path, step: int, module, optimizer, scheduler, info, state: dict, keep_last: int) -> Path:
    """Collective: every rank calls it; rank 0 writes."""
    msd, osd = get_state_dict(module, optimizer, options=state_dict_options(info, trainable_only=True))
    rngs = info.gather_objects(rng_state())
    final = checkpoint_dir(run_dir) / f"step-{step}"
    if info.main:
        with atomic_dir(final) as tmp:
            save_tensors(tmp / "model.safetensors", msd, {"format": "domino-graft training checkpoint"})
            atomic_write_bytes(tmp / "optimizer.pt", _torch_bytes(osd))
            atomic_write_bytes(tmp / "trainer.pt", _torch_bytes({"scheduler": scheduler.state_dict(), "rng": rngs}))
            # which parameters have AdamW moments: the resume restores exactly these (see load_checkpoint)
            atomic_write_json(tmp / "state.json", {**state, "step": step, "saved_at": now(),
                                                   "optimizer_state_for": sorted(osd.get("state", {}))})
        prune(run_dir, keep_last)
    info.barrier()
    return final


def prune(run_dir: Path, keep_last: int) -> None:
    found = list_checkpoints(run_dir)
    for _, p in found[: max(0, len(found) - keep_last)]:
        shutil.rmtree(p, ignore_errors=True)
    # Temp folders of a checkpoint write that was killed mid-way.
    for p in checkpoint_dir(run_dir).glob(".step-*.tmp-*"):
        shutil.rmtree(p, ignore_errors=True)


def load_checkpoint(path: Path, module, optimizer, scheduler, info) -> dict:
    """Restore model, optimizer, scheduler and this rank's RNG; return state.json."""
    state = read_checkpoint_state(path)
    msd = load_tensors(path / "model.safetensors")
    # A sharded parameter (DTensor) reports its global shape: the check needs no collective.
    expected = {n: tuple(p.shape) for n, p in module.named_parameters() if p.requires_grad}
    # persistent buffers (P-EAGLE's d2t/t2d maps) are saved too, in their own dtype (docs/design.md §3)
    buffers = {n: b for n, b in module.state_dict(keep_vars=True).items() if n not in dict(module.named_parameters())}
    expected.update({n: tuple(b.shape) for n, b in buffers.items()})
    check_tensors(msd, expected, source=str(path / "model.safetensors"))
    check_dtypes(msd, {n: dtype_name(b.dtype) for n, b in buffers.items() if not b.is_floating_point()},
                 source=str(path / "model.safetensors"))
    osd = torch_load(path / "optimizer.pt")
    if not isinstance(osd, dict) or not isinstance(osd.get("state", {}), dict):
        raise CheckpointError(f"{path / 'optimizer.pt'}: not an optimizer state (expected a dict with 'state')")
    moments = {f"state[{p!r}].{k}": v for p, st in osd.get("state", {}).items() if isinstance(st, dict)
               for k, v in st.items() if isinstance(v, torch.Tensor)}
    bad = first_nonfinite(moments)
    if bad:
        raise CheckpointError(f"{path / 'optimizer.pt'}: {bad[0]} holds {bad[1]} non-finite value(s) (NaN/Inf) of "
                              f"{bad[2]}; the checkpoint is damaged: resume from an earlier one")
    # strict=False: a trainable parameter that never got a gradient (the head during
    # train.backbone_only_steps) has no AdamW state to restore; the model tensors were checked above.
    # strict=False would also restart the moments of a parameter whose state is missing from a
    # damaged or swapped optimizer.pt, silently: state.json lists the parameters that had state.
    had_state = state.get("optimizer_state_for")  # absent in checkpoints of older versions
    missing = sorted(set(had_state or ()) - set(osd.get("state", {})))
    if missing:
        raise CheckpointError(
            f"{path / 'optimizer.pt'}: no AdamW state for {len(missing)} parameter(s) that had it when "
            f"step {state.get('step')} was saved (e.g. {missing[0]}); the file is damaged or from another "
            "checkpoint: restore it, or resume from an earlier checkpoint")
    set_state_dict(module, optimizer, model_state_dict=msd, optim_state_dict=osd,
                   options=StateDictOptions(full_state_dict=True, ignore_frozen_params=True, strict=False))
    trainer = torch_load(path / "trainer.pt")
    if not isinstance(trainer, dict) or not {"scheduler", "rng"} <= set(trainer):
        raise CheckpointError(f"{path / 'trainer.pt'}: not a trainer state (expected 'scheduler' and 'rng')")
    scheduler.load_state_dict(trainer["scheduler"])
    rngs = trainer["rng"]
    if len(rngs) == info.world:
        set_rng_state(rngs[info.rank])
    else:  # a different world size: every rank takes rank 0's streams
        set_rng_state(rngs[0])
    return state
