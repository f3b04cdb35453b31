"""`domino-graft train`: the training loop, phase by phase.

One optimizer step = `train.batch_size` sequences over all ranks, in `train.grad_accum`
micro-steps; each rank takes every world-th sequence of a micro-batch (DistributedSampler
style). Gradients are sums of weighted per-slot cross-entropies, divided once per step by
the global label weight, so 1 rank and N ranks compute the same update.

`train` resolves the run, its recipe and the checkpoint to resume, then hands one
`TrainingRun` per rank its phases in order (as a torchtune recipe does):

    setup_model        seeds, the run's target / drafter / head, what the final save must hold
    setup_data         examples, their fingerprint, target features, the sampler
    setup_optimizer    backbone mode (frozen / full / LoRA), objective, sharding, AdamW, schedule
    restore            resume from a checkpoint (exact), or start the metrics afresh
    train_step         one optimizer step -> its metrics record; then log, maybe checkpoint
    finish             gather the trained weights, update the run dir, report
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from ..artifacts.files import read_json
from ..artifacts.lock import RunLock
from ..progress import Progress
from ..recipe import Recipe, apply_overrides, parse_recipe, recipe_to_dict
from .data import StreamSampler, collate, fingerprint, load_examples
from .distributed import DistInfo, init_distributed, set_grad_sync, shard, teardown
from .objective import DominoObjective, estimated_tau, lambda_at, lr_factor
from .resume import latest_checkpoint, list_checkpoints, load_checkpoint, read_checkpoint_state, save_checkpoint
from .weights import final_tensors, update_run_weights

# Sections whose weights already exist in the run dir: changing them at train time would
# silently train something other than what the run (and its plan) describe.
FROZEN_SECTIONS = ("name", "target", "drafter", "head")
TENSORBOARD_KEYS = ("loss", "loss_final", "loss_base", "lambda", "lr", "tau_base", "tau_final", "tokens_per_s")


class TrainingError(RuntimeError):
    """Training cannot go on (a non-finite loss, gradient or weight); nothing was saved."""


@dataclass
class TrainResult:
    run_dir: Path
    steps: int
    summary: dict  # per-slot accuracies and τ over the last steps


def train(run: Optional[str] = None, overrides: list[str] | None = None, *, max_steps: Optional[int] = None,
          save_every: Optional[int] = None, resume: bool = False, echo: Callable = print,
          progress: bool = True) -> TrainResult:
    from ..artifacts.rundir import check_run_layout, resolve_run
    from ..device import pick_device

    run_dir = resolve_run(run)
    overrides = _train_overrides(overrides, max_steps=max_steps, save_every=save_every)
    check_run_layout(run_dir, writing=True)
    # One trainer per run dir (rank 0 holds the lock for all ranks of a torchrun job).
    main_process = os.environ.get("RANK", "0") == "0"
    with RunLock(run_dir, echo=echo) if main_process else contextlib.nullcontext():
        ckpt = _checkpoint_to_resume(run_dir, resume)
        ckpt_state = read_checkpoint_state(ckpt) if ckpt is not None else None
        recipe = _recipe(run_dir, overrides, ckpt_state)
        info = init_distributed(pick_device(recipe.device))
        try:
            return TrainingRun(run_dir, recipe, info, echo=echo if info.main else (lambda *a, **k: None),
                               progress=progress and info.main).run(ckpt)
        finally:
            teardown(info)


def _train_overrides(overrides: list[str] | None, *, max_steps: Optional[int], save_every: Optional[int]) -> list[str]:
    """KEY=VALUE overrides (never of a section whose weights the run already holds), then the flags'."""
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
    return overrides


def _checkpoint_to_resume(run_dir: Path, resume: bool) -> Optional[Path]:
    """The latest checkpoint with --resume (which needs one), None without (which needs none)."""
    ckpt = latest_checkpoint(run_dir)
    if resume and ckpt is None:
        raise FileNotFoundError(f"--resume: {run_dir}/checkpoints has no complete step-N checkpoint to resume from")
    if not resume and ckpt is not None:
        raise ValueError(
            f"{run_dir}: checkpoint {ckpt.name} exists; pass --resume to continue that run (add --max-steps to "
            f"extend it), or delete {run_dir}/checkpoints to start over"
        )
    return ckpt if resume else None


def _recipe(run_dir: Path, overrides: list[str], ckpt_state: Optional[dict]) -> Recipe:
    """The run's recipe; on resume the checkpoint's train section (what that run used), then
    this invocation's overrides, all re-validated by the schema."""
    data = read_json(run_dir / "recipe.resolved.json", missing="file not found; not a run directory written by "
                     "`domino-graft apply`")
    if ckpt_state is not None:
        data["train"] = ckpt_state["train"]
    if overrides:
        data = apply_overrides(data, overrides, source="overrides")
    return parse_recipe(data, source=f"{run_dir}/recipe.resolved.json + overrides")


def _all_zero(weight: torch.Tensor) -> bool:
    """Whether every entry is 0 (a sharded DTensor is gathered first: every rank calls this)."""
    full = weight.full_tensor() if hasattr(weight, "full_tensor") else weight
    return not bool(full.detach().any())


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
    # bare "1" (the output layer of each head, in a family with one LM head per slot) would also
    # match a Sequential named "...1".
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


class TrainingRun:
    """One rank's share of one `train` invocation. The phases run in the order `run` calls
    them; each leaves on `self` what the later ones read (the order is part of exact resume:
    the seeds, the RNG draws of LoRA's init and the restored RNG states depend on it)."""

    def __init__(self, run_dir: Path, recipe: Recipe, info: DistInfo, *, echo: Callable, progress: bool):
        self.run_dir, self.recipe, self.info = run_dir, recipe, info
        self.cfg = recipe.train
        self.echo, self.progress = echo, progress
        self.metrics_path = run_dir / "metrics.jsonl"
        self.start, self.tokens_seen = 0, 0

    def run(self, ckpt: Optional[Path]) -> TrainResult:
        self.prepare(ckpt)
        self.announce()
        self.loop()
        return self.finish()

    def prepare(self, ckpt: Optional[Path]) -> None:
        """Everything before the first step (bench/training.py steps a run prepared this way)."""
        self.setup_model()
        self.setup_data()
        self.setup_optimizer()
        self.restore(ckpt)

    # ------------------------------------------------------------------------- setup
    def setup_model(self) -> None:
        """Check the batch split, seed every RNG, load the run's target, drafter and head."""
        import numpy as np

        from ..artifacts.files import sha256_file
        from ..loading import load_run

        cfg, info = self.cfg, self.info
        per_micro, rem = divmod(cfg.batch_size, cfg.grad_accum * info.world)
        if rem or per_micro == 0:
            raise ValueError(
                f"train.batch_size: {cfg.batch_size} must be a positive multiple of train.grad_accum ({cfg.grad_accum}) "
                f"× world size ({info.world}) = {cfg.grad_accum * info.world}"
            )
        self.per_micro = per_micro
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed % 2**32)

        loaded = load_run(self.run_dir, device=info.device)
        self.target, self.adapter, self.head = loaded.target, loaded.adapter, loaded.head
        self.drafter_file = self.run_dir / "drafter" / "model.safetensors"
        self.drafter_sha = sha256_file(self.drafter_file) if self.drafter_file.is_file() else None
        self.drafter_dtype = next(self.adapter.backbone.parameters()).dtype
        # The family's native tensor set, taken before LoRA renames anything: what the final save
        # must contain, exactly (tied aliases and adapter tensors are dropped, missing ones fatal).
        self.native_shapes = {k: tuple(v.shape) for k, v in self.adapter.backbone_state_dict().items()}
        target = self.target
        self.autocast = (torch.autocast("cuda", dtype=target.dtype) if info.device.startswith("cuda")
                         and target.dtype in (torch.bfloat16, torch.float16) else contextlib.nullcontext())

    def setup_data(self) -> None:
        """The training sequences, their fingerprint, the target features the drafter reads
        (cached offline, computed online, or none), and the stateless sampler."""
        from .features import OfflineFeatures, OnlineFeatures, build_offline_cache, cache_key

        cfg, info, target, adapter = self.cfg, self.info, self.target, self.adapter
        eos = (target.shape.eos_token_ids or (getattr(target.tokenizer, "eos_token_id", None),))[0]
        # the drafter's placeholder tokens must not occur in the data
        self.examples = load_examples(self.recipe, target.tokenizer, vocab_size=target.shape.vocab_size, eos_id=eos,
                                      reserved=set(adapter.reserved_token_ids()))
        self.data_fp = fingerprint(self.examples)
        capture = tuple(adapter.capture_layers())
        if cfg.features == "offline" and capture:
            key = cache_key(self.data_fp, target.identity, capture, self.recipe.target.dtype)
            folder = build_offline_cache(self.run_dir / "features", key, self.examples, target, capture, rank=info.rank,
                                         world=info.world, barrier=info.barrier, progress=self.progress)
            self.features = OfflineFeatures(folder)
            # Only the embeddings and LM head are still needed: free the decoder layers.
            target.model.model.layers = torch.nn.ModuleList()
        elif capture:
            self.features = OnlineFeatures(target, capture)
        else:  # a drafter that reads tokens only: no target forward at all
            self.features = lambda batch, idx: None
        self.sampler = StreamSampler(len(self.examples), cfg.seed)

    def setup_optimizer(self) -> None:
        """Backbone mode, the objective (sharded across ranks), AdamW's two groups, the LR schedule."""
        cfg, info = self.cfg, self.info
        self.lora_scaling = _setup_backbone(self.adapter, cfg.backbone, cfg)
        for p in self.head.parameters():
            p.requires_grad_(True)
        self.objective = DominoObjective(self.adapter, self.head, gamma=cfg.gamma, loss_chunk=cfg.loss_chunk,
                                         backbone_trainable=cfg.backbone != "frozen",
                                         checkpoint_chunks=cfg.loss_checkpoint).to(info.device)
        shard(self.objective, info)
        named = [(n, p) for n, p in self.objective.named_parameters() if p.requires_grad]
        groups = [
            {"params": [p for n, p in named if not n.startswith("head.")], "lr": cfg.lr},
            {"params": [p for n, p in named if n.startswith("head.")], "lr": cfg.head_lr or cfg.lr},
        ]
        groups = [g for g in groups if g["params"]]
        self.params = [p for _, p in named]
        self.param_names = [n for n, _ in named]
        self.optimizer = torch.optim.AdamW(groups, weight_decay=cfg.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda s: lr_factor(s, warmup_steps=cfg.warmup_steps, max_steps=cfg.max_steps, schedule=cfg.lr_schedule),
        )

    def restore(self, ckpt: Optional[Path]) -> None:
        """Resume exactly from `ckpt` (model, optimizer, schedule, RNG; metrics cut back to its
        step), or start metrics.jsonl afresh."""
        cfg, info, echo = self.cfg, self.info, self.echo
        if ckpt is not None:
            state = load_checkpoint(ckpt, self.objective, self.optimizer, self.scheduler, info)
            if cfg.backbone == "lora" and state.get("drafter_sha256") not in (None, self.drafter_sha):
                raise ValueError(
                    f"--resume: {ckpt} holds LoRA weights for the drafter backbone it started from, but "
                    f"{self.drafter_file} has changed since (a finished run merges LoRA into it); resume is not "
                    "possible, start a new run with `domino-graft apply`"
                )
            if state.get("data_fingerprint") != self.data_fp:
                echo(f"warning: the training data differs from the data {ckpt.name} was trained on")
            if state["max_steps"] != cfg.max_steps:
                echo(f"note: max_steps {state['max_steps']} -> {cfg.max_steps}: the λ and LR schedules now span "
                     f"{cfg.max_steps} steps")
            self.start, self.tokens_seen = state["step"], state["tokens_seen"]
            if self.start > cfg.max_steps:
                raise ValueError(f"train.max_steps: {cfg.max_steps} is below the step of {ckpt} ({self.start}); "
                                 f"valid: >= {self.start}")
            if info.main:
                _truncate_metrics(self.metrics_path, self.start)
            echo(f"resumed from {ckpt} (step {self.start})")
        elif info.main:
            from ..artifacts.files import atomic_write_text

            atomic_write_text(self.metrics_path, "")
        info.barrier()
        self.objective.head_is_identity = _all_zero(self.head.embed_proj[2].weight)

    def announce(self) -> None:
        cfg = self.cfg
        if cfg.backbone_only_steps >= cfg.max_steps:
            self.echo(f"note: train.backbone_only_steps={cfg.backbone_only_steps} >= max_steps={cfg.max_steps}: "
                      "the head never trains")
        self.echo(
            f"training {self.run_dir}: {len(self.examples)} sequences, backbone {cfg.backbone}, features {cfg.features}, "
            f"{cfg.batch_size} seq/step ({cfg.grad_accum} micro-step(s) × {self.info.world} rank(s)), "
            f"steps {self.start}->{cfg.max_steps}"
        )

    # -------------------------------------------------------------------------- loop
    def loop(self) -> None:
        """Steps start..max_steps: each trains, logs and (every save_every, and at the end) checkpoints."""
        info = self.info
        writer = _tensorboard(self.run_dir) if info.main else None
        bar = Progress(total=self.cfg.max_steps, initial=self.start, desc="train", unit="step", enabled=self.progress,
                       dynamic_ncols=True)
        try:
            for step in range(self.start, self.cfg.max_steps):
                rec = self.train_step(step)
                self.log(rec, writer, bar)
                self.maybe_checkpoint(step + 1, rec["lambda"])
        finally:
            bar.close()
            if writer is not None:
                writer.close()

    def micro_batch(self, step: int, m: int) -> tuple[dict, list[int]]:
        """Micro-step m of `step` on this rank: (collated batch, example indices)."""
        cfg, info = self.cfg, self.info
        first = step * cfg.batch_size + m * self.per_micro * info.world
        positions = [first + info.rank + info.world * i for i in range(self.per_micro)]
        idx = [self.sampler.index(p) for p in positions]
        batch = collate([self.examples[i] for i in idx], positions, anchors_per_seq=cfg.anchors_per_seq, seed=cfg.seed)
        return batch, idx

    def train_step(self, step: int) -> dict:
        """One optimizer step (grad_accum micro-steps, statistics summed over ranks) -> its metrics record."""
        cfg, info = self.cfg, self.info
        dev = info.device
        t0 = time.perf_counter()
        head_on = step >= cfg.backbone_only_steps
        # During the backbone-only warm-up the loss is CE(base) alone: λ = 1 in effect.
        lam = lambda_at(step, lambda_start=cfg.lambda_start, decay_ratio=cfg.decay_ratio,
                        max_steps=cfg.max_steps) if head_on else 1.0
        lr_now = [g["lr"] for g in self.optimizer.param_groups]
        acc = None
        tokens = 0
        num_slots = None
        for m in range(cfg.grad_accum):
            batch, idx = self.micro_batch(step, m)
            feats = self.features(batch, idx)
            feats = feats.to(dev) if feats is not None else None  # None: a drafter that reads tokens only
            set_grad_sync(self.objective, m == cfg.grad_accum - 1)
            with self.autocast:
                out = self.objective(feats, batch["input_ids"].to(dev), batch["loss_mask"].to(dev),
                                     batch["anchors"].to(dev), batch["valid"].to(dev), lam, head_on)
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
            stats = info.all_reduce(stats.to(dev)).cpu()
        ce_f, ce_b, wsum = stats[0].item(), stats[1].item(), stats[2].item()
        k = num_slots
        ok_b, ok_f, cnt = stats[3 : 3 + k], stats[3 + k : 3 + 2 * k], stats[3 + 2 * k : 3 + 3 * k]
        step_tokens = int(stats[-1].item())
        # FSDP averaged the gradients over ranks; they are sums, so scale by world / Σweight.
        scale = info.world / wsum if wsum > 0 else 0.0
        for p in self.params:
            if p.grad is not None:
                p.grad.mul_(scale)
        grad_norm = None
        if cfg.max_grad_norm > 0:
            gn = torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm)
            grad_norm = float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn)
            norm_seen = grad_norm
        else:  # not clipping: still measured, the finite check needs it
            gn = torch.nn.utils.get_total_norm([p.grad for p in self.params if p.grad is not None])
            norm_seen = float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn)
        loss_f = ce_f / wsum if wsum else float("nan")
        loss_b = ce_b / wsum if wsum else float("nan")
        if wsum > 0:  # no labelled token in the batch: nothing was learnt, the losses are undefined
            self.check_finite_step(step + 1, {"loss_final": loss_f, "loss_base": loss_b}, norm_seen, head_on)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        self.tokens_seen += step_tokens

        acc_b = [round(a / c, 6) if c else None for a, c in zip(ok_b.tolist(), cnt.tolist())]
        acc_f = [round(a / c, 6) if c else None for a, c in zip(ok_f.tolist(), cnt.tolist())]
        tau_slots = self.adapter.num_slots
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
        return rec

    # ---------------------------------------------------------------- finite checks
    def _lr_hint(self) -> str:
        cfg = self.cfg
        lrs = f"train.lr {cfg.lr:g}" + (f", train.head_lr {cfg.head_lr:g}" if cfg.head_lr is not None else "")
        ckpt = latest_checkpoint(self.run_dir)
        last = f"the latest checkpoint is {ckpt.name}" if ckpt is not None else "there is no checkpoint yet"
        return (f"stopped before saving anything ({last}; the run's weights are unchanged); the update diverged: "
                f"lower the learning rate ({lrs}) or check the data")

    def check_finite_step(self, step: int, losses: dict, grad_norm: float, head_on: bool) -> None:
        """The first non-finite loss or gradient norm stops training, before the optimizer
        applies it and before anything is saved. Every rank sees the same reduced numbers."""
        bad = [f"{k} is {v}" for k, v in losses.items() if not math.isfinite(v) and (head_on or k == "loss_base")]
        if bad:
            raise TrainingError(f"train: step {step}: {' and '.join(bad)}; " + self._lr_hint())
        if not math.isfinite(grad_norm):
            raise TrainingError(f"train: step {step}: the gradient norm is {grad_norm} (loss_final "
                                f"{losses['loss_final']:.4g}, loss_base {losses['loss_base']:.4g}); " + self._lr_hint())

    def check_finite_weights(self, step: int) -> None:
        """Before a checkpoint or the final save: every trainable tensor finite (collective)."""
        from ..artifacts.tensors import nonfinite_count

        counts = torch.tensor([float(nonfinite_count(p.to_local() if hasattr(p, "to_local") else p))
                               for p in self.params], dtype=torch.float64)
        if self.info.active:
            counts = self.info.all_reduce(counts.to(self.info.device)).cpu()
        bad = [(n, int(c)) for n, c in zip(self.param_names, counts.tolist()) if c]
        if bad:
            name, c = bad[0]
            raise TrainingError(f"train: after step {step} the weight {name} holds {c} non-finite value(s) "
                                f"(NaN/Inf; {len(bad)} tensor(s) in all); " + self._lr_hint())

    def log(self, rec: dict, writer, bar) -> None:
        """metrics.jsonl and TensorBoard (rank 0), the progress bar."""
        if self.info.main:
            from ..artifacts.files import with_path

            try:
                with open(self.metrics_path, "a") as f:
                    f.write(json.dumps(rec) + "\n")
            except OSError as e:
                raise with_path(e, self.metrics_path) from None
            if writer is not None:
                for key in TENSORBOARD_KEYS:
                    writer.add_scalar(f"train/{key}", rec[key], rec["step"])
        bar.set_postfix(loss=f"{rec['loss']:.3f}", lam=f"{rec['lambda']:.2f}", tau_b=f"{rec['tau_base']:.2f}",
                        tau_f=f"{rec['tau_final']:.2f}")
        bar.update(1)

    def maybe_checkpoint(self, done: int, lam: float) -> None:
        """A checkpoint after `done` steps, every save_every and at max_steps (collective)."""
        cfg, info = self.cfg, self.info
        if (cfg.save_every and done % cfg.save_every == 0) or done == cfg.max_steps:
            self.check_finite_weights(done)
            save_checkpoint(self.run_dir, done, self.objective, self.optimizer, self.scheduler, info, {
                "train": recipe_to_dict(self.recipe)["train"],
                "max_steps": cfg.max_steps,
                "lambda": lam,
                "samples_seen": done * cfg.batch_size,
                "data_position": done * cfg.batch_size,  # position in the sampler's stream
                "tokens_seen": self.tokens_seen,
                "world_size": info.world,
                "data_fingerprint": self.data_fp,
                "drafter_sha256": self.drafter_sha,
            }, cfg.keep_last)

    # ------------------------------------------------------------------------ finish
    def finish(self) -> TrainResult:
        """Gather the trained weights (collective), write them into the run dir, report."""
        cfg, info, run_dir = self.cfg, self.info, self.run_dir
        self.check_finite_weights(cfg.max_steps)
        tensors = final_tensors(self.objective, info, lora_scaling=self.lora_scaling)
        summary = summarize(self.metrics_path, tau_slots=self.adapter.num_slots) if info.main else {}
        if info.main:
            head_t, backbone_t = tensors
            if cfg.backbone != "frozen":
                backbone_t = {k: v for k, v in backbone_t.items() if k in self.native_shapes}
            found = list_checkpoints(run_dir)
            update_run_weights(
                run_dir,
                head_tensors=head_t,
                head_spec=self.head.spec.to_dict(),
                backbone=backbone_t if cfg.backbone != "frozen" else None,
                backbone_shapes=self.native_shapes,
                drafter_dtype=self.drafter_dtype,
                native_config=self.adapter.native_config(),
                training={
                    "steps": cfg.max_steps,
                    "tokens": self.tokens_seen,
                    "samples": cfg.max_steps * cfg.batch_size,
                    "backbone": cfg.backbone,
                    "features": cfg.features,
                    "world_size": info.world,
                    "checkpoint": found[-1][1].name if found else None,
                    "final_metrics": summary,
                },
            )
            self.echo(format_summary(summary))
            self.echo(f"updated {run_dir}/head.safetensors"
                      + ("" if cfg.backbone == "frozen" else " and drafter/model.safetensors") + "; metrics in metrics.jsonl")
        info.barrier()
        return TrainResult(run_dir, cfg.max_steps, summary)


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop lines a killed run logged after its last checkpoint: they will be recomputed."""
    from ..artifacts.files import atomic_write_text

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
    # num_slots: the K proposals decoding makes; training may score more block positions
    # (a block drafter with a label shift trains all B = K + 1), so acc_* can be longer than K
    out = {"steps_pooled": len(tail), "last_step": recs[-1]["step"], "num_slots": tau_slots}
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
    trained = len(s["acc_base"])
    k = min(s.get("num_slots") or trained, trained)
    # Slots as `apply`'s plan and `bench` number them: slot j = the j-th of the K proposals after
    # the anchor. A block drafter with a label shift trains all B positions of its block but
    # proposes K = B - 1: printing the extra one as "slot 8" made train show 8 slots where the
    # plan said 7 and bench showed 7.
    lines = [f"per-slot accuracy over the last {s['steps_pooled']} step(s) (step {s['last_step']}; slot j = proposal "
             f"j of {k} after the anchor):",
             "  slot   base    final"]
    fmt = lambda v: "   -  " if v is None else f"{v:6.3f}"  # noqa: E731
    for j, (b, f) in enumerate(zip(s["acc_base"][:k], s["acc_final"][:k]), start=1):
        lines.append(f"  {j:>4} {fmt(b)}  {fmt(f)}")
    if trained > k:
        which = "last position" if trained == k + 1 else f"last {trained - k} positions"
        extra = ", ".join(f"{fmt(b).strip()} / {fmt(f).strip()}" for b, f in zip(s["acc_base"][k:], s["acc_final"][k:]))
        lines.append(f"  (training also scores the block's {which}, which decoding never proposes: base / final "
                     f"{extra}; not in τ)")
    lines.append(f"  τ est {s['tau_base']:6.3f}  {s['tau_final']:6.3f}   (1 + Σ_k Π_i<=k acc_i)")
    # On a SmolLM2 run this estimate read 3.11 at the end of training where greedy decoding on GSM8K
    # measured 2.35 (docs/results.md, History: the acceptance probe explains the gap)
    lines.append("  (training batches, slots taken as independent; `domino-graft replay` on held-out responses "
                 "gives the τ decoding measures)")
    return "\n".join(lines)
