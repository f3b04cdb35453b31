"""`domino-graft train`: the training loop, top to bottom.

One optimizer step = `train.batch_size` sequences over all ranks, in `train.grad_accum`
micro-steps; each rank takes every world-th sequence of a micro-batch (DistributedSampler
style). Gradients are sums of weighted per-slot cross-entropies, divided once per step by
the global label weight, so 1 rank and N ranks compute the same update.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from ..recipe import Recipe, apply_overrides, parse_recipe, recipe_to_dict
from .checkpoints import (
    final_tensors,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
    update_run_weights,
)
from .data import StreamSampler, collate, fingerprint, load_examples
from .distributed import DistInfo, init_distributed, set_grad_sync, shard, teardown
from .objective import DominoObjective, estimated_tau, lambda_at, lr_factor

# Sections whose weights already exist in the run dir: changing them at train time would
# silently train something other than what the run (and its plan) describe.
FROZEN_SECTIONS = ("name", "target", "drafter", "head")


@dataclass
class TrainResult:
    run_dir: Path
    steps: int
    summary: dict  # per-slot accuracies and τ over the last steps


def train(run: Optional[str] = None, overrides: list[str] | None = None, *, max_steps: Optional[int] = None,
          save_every: Optional[int] = None, resume: bool = False, echo: Callable = print,
          progress: bool = True) -> TrainResult:
    from ..apply import pick_device
    from ..rundir import resolve_run

    run_dir = resolve_run(run)
    overrides = list(overrides or [])
    for item in overrides:
        section = item.split("=", 1)[0].split(".", 1)[0]
        if section in FROZEN_SECTIONS:
            raise ValueError(
                f"{item}: the run's {section} weights already exist, so `train` cannot change {section}.*; "
                f"re-run `domino-graft apply RECIPE {item}` for a new run. Valid here: train.*, export.*, bench.*, device"
            )
    if max_steps is not None:
        overrides.append(f"train.max_steps={max_steps}")
    if save_every is not None:
        overrides.append(f"train.save_every={save_every}")

    ckpt = latest_checkpoint(run_dir)
    if resume and ckpt is None:
        raise FileNotFoundError(f"--resume: {run_dir}/checkpoints has no complete step-N checkpoint to resume from")
    if not resume and ckpt is not None:
        raise ValueError(
            f"{run_dir}: checkpoint {ckpt.name} exists; pass --resume to continue that run (add --max-steps to "
            f"extend it), or delete {run_dir}/checkpoints to start over"
        )
    ckpt_state = json.loads((ckpt / "state.json").read_text()) if resume else None
    recipe = _recipe(run_dir, overrides, ckpt_state)
    info = init_distributed(pick_device(recipe))
    try:
        return _train(run_dir, recipe, info, ckpt if resume else None, echo=echo if info.main else (lambda *a, **k: None),
                      progress=progress and info.main)
    finally:
        teardown(info)


def _recipe(run_dir: Path, overrides: list[str], ckpt_state: Optional[dict]) -> Recipe:
    """The run's recipe; on resume the checkpoint's train section (what that run used), then
    this invocation's overrides, all re-validated by the schema."""
    data = json.loads((run_dir / "recipe.resolved.json").read_text())
    if ckpt_state is not None:
        data["train"] = ckpt_state["train"]
    if overrides:
        data = apply_overrides(data, overrides, source="overrides")
    return parse_recipe(data, source=f"{run_dir}/recipe.resolved.json + overrides")


def _setup_backbone(adapter, mode: str, cfg) -> Optional[float]:
    """Freeze / unfreeze / inject LoRA. Returns the LoRA scaling (None unless lora)."""
    backbone = adapter.backbone
    if mode == "frozen":
        for p in backbone.parameters():
            p.requires_grad_(False)
        return None
    # Trainable weights live in fp32 (AdamW on bf16 weights loses small updates); the target
    # keeps its dtype and CUDA runs the forward under autocast.
    backbone.float()
    if mode == "full":
        for p in backbone.parameters():
            p.requires_grad_(True)
        return None
    from peft import LoraConfig, inject_adapter_in_model
    from torch import nn

    # Every Linear, matched by its full name: PEFT matches list entries as name suffixes, and a
    # bare "1" (Medusa's per-head output layer) would also match a Sequential named "...1".
    names = [n for n, m in backbone.named_modules() if isinstance(m, nn.Linear)]
    if not names:
        raise ValueError("train.backbone: 'lora' needs Linear layers in the drafter backbone; it has none. "
                         "Valid here: frozen, full")
    pattern = "^(" + "|".join(re.escape(n) for n in names) + ")$"
    torch.manual_seed(cfg.seed)  # LoRA A matrices draw from the global RNG
    inject_adapter_in_model(
        LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=0.0, target_modules=pattern, bias="none"),
        backbone,
    )
    for n, p in backbone.named_parameters():
        p.requires_grad_(".lora_" in n)
    return cfg.lora_alpha / cfg.lora_rank


def _train(run_dir: Path, recipe: Recipe, info: DistInfo, ckpt: Optional[Path], *, echo, progress) -> TrainResult:
    import numpy as np

    from ..checkpoint import sha256_file
    from ..rundir import load_run
    from .features import OfflineFeatures, OnlineFeatures, build_offline_cache, cache_key

    cfg = recipe.train
    per_micro, rem = divmod(cfg.batch_size, cfg.grad_accum * info.world)
    if rem or per_micro == 0:
        raise ValueError(
            f"train.batch_size: {cfg.batch_size} must be a positive multiple of train.grad_accum ({cfg.grad_accum}) "
            f"× world size ({info.world}) = {cfg.grad_accum * info.world}"
        )
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)

    loaded = load_run(run_dir, device=info.device)
    target, adapter, head = loaded.target, loaded.adapter, loaded.head
    drafter_file = run_dir / "drafter" / "model.safetensors"
    drafter_sha = sha256_file(drafter_file) if drafter_file.is_file() else None
    drafter_dtype = next(adapter.backbone.parameters()).dtype
    # The family's native tensor set, taken before LoRA renames anything: what the final save
    # must contain, exactly (tied aliases and adapter tensors are dropped, missing ones fatal).
    native_shapes = {k: tuple(v.shape) for k, v in adapter.backbone_state_dict().items()}

    # ---- data and features
    eos = (target.shape.eos_token_ids or (getattr(target.tokenizer, "eos_token_id", None),))[0]
    # the drafter's placeholder token (DFlash mask, PARD pard token) must not occur in the data
    reserved = {getattr(getattr(adapter, "cfg", None), "mask_token_id", None),
                getattr(adapter, "pard_token_id", None)} - {None}
    examples = load_examples(recipe, target.tokenizer, vocab_size=target.shape.vocab_size, eos_id=eos,
                             reserved=reserved)
    data_fp = fingerprint(examples)
    capture = tuple(adapter.capture_layers())
    if cfg.features == "offline" and capture:
        key = cache_key(data_fp, target.identity, capture, recipe.target.dtype)
        folder = build_offline_cache(run_dir / "features", key, examples, target, capture, rank=info.rank,
                                     world=info.world, barrier=info.barrier, progress=progress)
        features = OfflineFeatures(folder)
        # Only the embeddings and LM head are still needed: free the decoder layers.
        target.model.model.layers = torch.nn.ModuleList()
    elif capture:
        features = OnlineFeatures(target, capture)
    else:  # the drafter reads no target features (PARD): no target forward at all
        def features(batch, idx):
            return None
    sampler = StreamSampler(len(examples), cfg.seed)

    # ---- model, optimizer, schedule
    lora_scaling = _setup_backbone(adapter, cfg.backbone, cfg)
    for p in head.parameters():
        p.requires_grad_(True)
    objective = DominoObjective(adapter, head, gamma=cfg.gamma, loss_chunk=cfg.loss_chunk,
                                backbone_trainable=cfg.backbone != "frozen").to(info.device)
    shard(objective, info)
    named = [(n, p) for n, p in objective.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in named if not n.startswith("head.")], "lr": cfg.lr},
        {"params": [p for n, p in named if n.startswith("head.")], "lr": cfg.head_lr or cfg.lr},
    ]
    groups = [g for g in groups if g["params"]]
    params = [p for _, p in named]
    optimizer = torch.optim.AdamW(groups, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, warmup_steps=cfg.warmup_steps, max_steps=cfg.max_steps, schedule=cfg.lr_schedule)
    )

    metrics_path = run_dir / "metrics.jsonl"
    start, tokens_seen = 0, 0
    if ckpt is not None:
        state = load_checkpoint(ckpt, objective, optimizer, scheduler, info)
        if cfg.backbone == "lora" and state.get("drafter_sha256") not in (None, drafter_sha):
            raise ValueError(
                f"--resume: {ckpt} holds LoRA weights for the drafter backbone it started from, but "
                f"{drafter_file} has changed since (a finished run merges LoRA into it); resume is not possible, "
                "start a new run with `domino-graft apply`"
            )
        if state.get("data_fingerprint") != data_fp:
            echo(f"warning: the training data differs from the data {ckpt.name} was trained on")
        if state["max_steps"] != cfg.max_steps:
            echo(f"note: max_steps {state['max_steps']} -> {cfg.max_steps}: the λ and LR schedules now span {cfg.max_steps} steps")
        start, tokens_seen = state["step"], state["tokens_seen"]
        if start > cfg.max_steps:
            raise ValueError(f"train.max_steps: {cfg.max_steps} is below the step of {ckpt} ({start}); valid: >= {start}")
        if info.main:
            _truncate_metrics(metrics_path, start)
        echo(f"resumed from {ckpt} (step {start})")
    elif info.main:
        metrics_path.write_text("")
    info.barrier()

    if cfg.backbone_only_steps >= cfg.max_steps:
        echo(f"note: train.backbone_only_steps={cfg.backbone_only_steps} >= max_steps={cfg.max_steps}: the head never trains")
    echo(
        f"training {run_dir}: {len(examples)} sequences, backbone {cfg.backbone}, features {cfg.features}, "
        f"{cfg.batch_size} seq/step ({cfg.grad_accum} micro-step(s) × {info.world} rank(s)), steps {start}->{cfg.max_steps}"
    )

    writer = _tensorboard(run_dir) if info.main else None
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.max_steps, initial=start, desc="train", unit="step", dynamic_ncols=True)
    autocast = (torch.autocast("cuda", dtype=target.dtype) if info.device.startswith("cuda")
                and target.dtype in (torch.bfloat16, torch.float16) else contextlib.nullcontext())
    num_slots = None
    for step in range(start, cfg.max_steps):
        t0 = time.perf_counter()
        head_on = step >= cfg.backbone_only_steps
        # During the backbone-only warm-up the loss is CE(base) alone: λ = 1 in effect.
        lam = lambda_at(step, lambda_start=cfg.lambda_start, decay_ratio=cfg.decay_ratio,
                        max_steps=cfg.max_steps) if head_on else 1.0
        lr_now = [g["lr"] for g in optimizer.param_groups]
        acc = None
        tokens = 0
        for m in range(cfg.grad_accum):
            first = step * cfg.batch_size + m * per_micro * info.world
            positions = [first + info.rank + info.world * i for i in range(per_micro)]
            idx = [sampler.index(p) for p in positions]
            batch = collate([examples[i] for i in idx], positions, anchors_per_seq=cfg.anchors_per_seq, seed=cfg.seed)
            feats = features(batch, idx)
            feats = feats.to(info.device) if feats is not None else None  # None: a drafter that reads tokens only (PARD)
            set_grad_sync(objective, m == cfg.grad_accum - 1)
            with autocast:
                out = objective(feats, batch["input_ids"].to(info.device), batch["loss_mask"].to(info.device),
                                batch["anchors"].to(info.device), batch["valid"].to(info.device), lam, head_on)
            out["loss_sum"].backward()
            num_slots = out["count"].numel()
            vec = torch.cat([
                torch.stack([out["ce_final_sum"].float(), out["ce_base_sum"].float(), out["weight_sum"].float()]).cpu().double(),
                out["correct_base"].cpu().double(), out["correct_final"].cpu().double(), out["count"].cpu().double(),
            ])
            acc = vec if acc is None else acc + vec
            tokens += sum(batch["lengths"])
        stats = torch.cat([acc, torch.tensor([float(tokens)], dtype=torch.float64)])
        if info.active:
            stats = info.all_reduce(stats.to(info.device)).cpu()
        ce_f, ce_b, wsum = stats[0].item(), stats[1].item(), stats[2].item()
        k = num_slots
        ok_b, ok_f, cnt = stats[3 : 3 + k], stats[3 + k : 3 + 2 * k], stats[3 + 2 * k : 3 + 3 * k]
        step_tokens = int(stats[-1].item())
        # FSDP averaged the gradients over ranks; they are sums, so scale by world / Σweight.
        scale = info.world / wsum if wsum > 0 else 0.0
        for p in params:
            if p.grad is not None:
                p.grad.mul_(scale)
        grad_norm = None
        if cfg.max_grad_norm > 0:
            gn = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            grad_norm = float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        tokens_seen += step_tokens

        loss_f = ce_f / wsum if wsum else float("nan")
        loss_b = ce_b / wsum if wsum else float("nan")
        acc_b = [round(a / c, 6) if c else None for a, c in zip(ok_b.tolist(), cnt.tolist())]
        acc_f = [round(a / c, 6) if c else None for a, c in zip(ok_f.tolist(), cnt.tolist())]
        tau_slots = adapter.num_slots
        rec = {
            "step": step + 1,
            "loss": (1 - lam) * loss_f + lam * loss_b,
            "loss_final": loss_f,
            "loss_base": loss_b,
            "lambda": lam,
            "lr": lr_now[0],
            "acc_base": acc_b,
            "acc_final": acc_f,
            "count": [int(c) for c in cnt.tolist()],
            "tau_base": estimated_tau(acc_b[:tau_slots]),
            "tau_final": estimated_tau(acc_f[:tau_slots]),
            "grad_norm": grad_norm,
            "tokens": step_tokens,
            "tokens_per_s": step_tokens / dt,
        }
        if not head_on:
            rec["phase"] = "backbone_only"
        if info.main:
            with open(metrics_path, "a") as f:
                f.write(json.dumps(rec) + "\n")
            if writer is not None:
                for key in ("loss", "loss_final", "loss_base", "lambda", "lr", "tau_base", "tau_final", "tokens_per_s"):
                    writer.add_scalar(f"train/{key}", rec[key], step + 1)
        if bar is not None:
            bar.set_postfix(loss=f"{rec['loss']:.3f}", lam=f"{lam:.2f}", tau_b=f"{rec['tau_base']:.2f}",
                            tau_f=f"{rec['tau_final']:.2f}")
            bar.update(1)
        done = step + 1
        if (cfg.save_every and done % cfg.save_every == 0) or done == cfg.max_steps:
            save_checkpoint(run_dir, done, objective, optimizer, scheduler, info, {
                "train": recipe_to_dict(recipe)["train"],
                "max_steps": cfg.max_steps,
                "lambda": lam,
                "samples_seen": done * cfg.batch_size,
                "data_position": done * cfg.batch_size,  # position in the sampler's stream
                "tokens_seen": tokens_seen,
                "world_size": info.world,
                "data_fingerprint": data_fp,
                "drafter_sha256": drafter_sha,
            }, cfg.keep_last)
    if bar is not None:
        bar.close()
    if writer is not None:
        writer.close()

    # ---- the run's weights
    tensors = final_tensors(objective, info, lora_scaling=lora_scaling)
    summary = summarize(metrics_path, tau_slots=adapter.num_slots) if info.main else {}
    if info.main:
        head_t, backbone_t = tensors
        if cfg.backbone != "frozen":
            backbone_t = {k: v for k, v in backbone_t.items() if k in native_shapes}
        update_run_weights(
            run_dir,
            head_tensors=head_t,
            head_spec=head.spec.to_dict(),
            backbone=backbone_t if cfg.backbone != "frozen" else None,
            backbone_shapes=native_shapes,
            drafter_dtype=drafter_dtype,
            native_config=adapter.native_config(),
            training={
                "steps": cfg.max_steps,
                "tokens": tokens_seen,
                "samples": cfg.max_steps * cfg.batch_size,
                "backbone": cfg.backbone,
                "features": cfg.features,
                "world_size": info.world,
                "checkpoint": list_checkpoints(run_dir)[-1][1].name if list_checkpoints(run_dir) else None,
                "final_metrics": summary,
            },
        )
        echo(format_summary(summary))
        echo(f"updated {run_dir}/head.safetensors" + ("" if cfg.backbone == "frozen" else " and drafter/model.safetensors")
             + "; metrics in metrics.jsonl")
    info.barrier()
    return TrainResult(run_dir, cfg.max_steps, summary)


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop lines a killed run logged after its last checkpoint: they will be recomputed."""
    from ..checkpoint import atomic_write_text

    if not path.is_file():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:  # a line cut short by the kill
            continue
        if rec.get("step", 0) <= step:
            keep.append(line)
    atomic_write_text(path, "".join(x + "\n" for x in keep))


def _tensorboard(run_dir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # optional: tensorboard is not a dependency
        return None
    return SummaryWriter(str(run_dir / "tensorboard"))


def summarize(metrics_path: Path, *, tau_slots: int, last: int = 10) -> dict:
    """Per-slot accuracies pooled (count-weighted) over the last `last` steps, and τ estimates."""
    recs = [json.loads(x) for x in metrics_path.read_text().splitlines() if x.strip()]
    if not recs:
        return {}
    tail = recs[-last:]
    k = len(tail[-1]["count"])
    out = {"steps_pooled": len(tail), "last_step": recs[-1]["step"]}
    for key in ("acc_base", "acc_final"):
        accs = []
        for j in range(k):
            num = sum((r[key][j] or 0.0) * r["count"][j] for r in tail)
            den = sum(r["count"][j] for r in tail)
            accs.append(round(num / den, 4) if den else None)
        out[key] = accs
    out["tau_base"] = round(estimated_tau(out["acc_base"][:tau_slots]), 4)
    out["tau_final"] = round(estimated_tau(out["acc_final"][:tau_slots]), 4)
    out["loss_final"] = tail[-1]["loss_final"]
    out["loss_base"] = tail[-1]["loss_base"]
    return out


def format_summary(s: dict) -> str:
    if not s:
        return "no metrics"
    lines = [f"per-slot accuracy over the last {s['steps_pooled']} step(s) (step {s['last_step']}):",
             "  slot   base    final"]
    for j, (b, f) in enumerate(zip(s["acc_base"], s["acc_final"]), start=1):
        fmt = lambda v: "   -  " if v is None else f"{v:6.3f}"  # noqa: E731
        lines.append(f"  {j:>4} {fmt(b)}  {fmt(f)}")
    lines.append(f"  τ est {s['tau_base']:6.3f}  {s['tau_final']:6.3f}   (1 + Σ_k Π_i<=k acc_i)")
    # SmolLM2 DFlash + Domino (bench/results/smollm2_h200/): this estimate read 3.11 at the end of
    # training; greedy decoding on GSM8K measured 2.35 (acceptance_probe_smollm2.json explains the gap)
    lines.append("  (training batches, slots taken as independent; `domino-graft replay` on held-out responses "
                 "gives the τ decoding measures)")
    return "\n".join(lines)
