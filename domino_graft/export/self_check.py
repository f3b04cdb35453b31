"""The export self-check: the bundle in its temporary folder is reloaded through the project's own
loader (and any reload check of its format's, e.g. transformers remote code) and its draft logits
are compared with the model in memory, before the bundle is renamed into place."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

from ..artifacts.bundle import verify_bundle
from ..artifacts.files import CheckpointError
from ..loading import load_bundle

# Fidelity: the reloaded bundle vs the model in memory (unrounded), max |Δlogit| / max |logit|.
# Rounding every weight to bf16 (8 mantissa bits) moves logits by ~1% on the tiny and 8B
# shapes; 5% still fails a transposed or swapped tensor by orders of magnitude.
FIDELITY_TOL = {"fp32": 1e-5, "fp16": 1e-2, "bf16": 5e-2}
# Exactness: the reloaded bundle vs the in-memory weights rounded to the export dtype — the
# same numbers through the same code, so only a mapping/config error can move them.
EXACT_TOL = {"fp32": 1e-5, "fp16": 1e-3, "bf16": 1e-3}  # keyed by the *compute* dtype


class ExportError(RuntimeError):
    """The bundle failed its self-check; nothing was written."""


# --------------------------------------------------------------------------- self-check
def _greedy(adapter, head, block, anchor):
    """Proposals d_1..d_K (docs/design.md §2): the GRU reads E(x_0), then each realised proposal."""
    import torch

    state = head.init_state(anchor.shape[0], device=block.hidden.device)
    prev, out = anchor, []
    for j in range(block.hidden.shape[1]):
        logits, state = head.step(state, adapter.embed(prev), block.hidden[:, j], block.base_logits[:, j])
        prev = logits.argmax(-1)
        out.append(prev)
    return torch.stack(out, dim=1)


def _probe_inputs(target, adapter, *, seed: int, batch: int = 2):
    """Random token sequences, the target's captured features, and anchors spread over them."""
    import torch

    k = adapter.num_slots
    length = max(24, 3 * (k + 1))
    g = torch.Generator().manual_seed(seed)
    # ids 0, 1 and the last row are often special (bos/eos, a drafter's placeholder token): avoid them
    ids = torch.randint(2, target.shape.vocab_size - 1, (batch, length), generator=g).to(target.device)
    _, feats = target(ids, capture=adapter.capture_layers())
    anchors = sorted({max(1, length // 4), length // 2, length - 1})
    return ids, feats, anchors


def _draft_logits(adapter, head, ids, feats, anchors, prev_tokens=None, greedy=True):
    """Per anchor: (final logits [B, K, V] teacher-forced on `prev_tokens` or on the model's
    own greedy proposals, those proposals [B, K] or None when greedy=False)."""
    import torch

    out = []
    for i, a in enumerate(anchors):
        adapter.reset(ids.shape[0])
        adapter.observe(None if feats is None else feats[:, :a], torch.arange(a, device=ids.device), ids=ids[:, :a])
        anchor = ids[:, a]
        block = adapter.propose(anchor, a)
        tokens = _greedy(adapter, head, block, anchor) if greedy or prev_tokens is None else None
        forced = tokens if prev_tokens is None else prev_tokens[i]
        prev = torch.cat([anchor[:, None], forced[:, :-1]], dim=1)
        out.append((head.block(block.hidden, block.base_logits, adapter.embed(prev)).float(), tokens))
    return out


def max_rel_diff(a_list, b_list) -> float:
    """max |a - b| / max(1, max |a|) over the blocks; NaN as soon as either side holds a
    non-finite value (Python's max(0.0, nan) is 0.0: a NaN must never read as a match)."""
    worst = 0.0
    for (a, _), (b, _) in zip(a_list, b_list):
        if a.shape != b.shape:
            return math.inf
        if a.numel() == 0:
            continue
        if not (bool(a.isfinite().all()) and bool(b.isfinite().all())):
            return math.nan
        scale = max(1.0, float(a.abs().max()))
        d = float((a - b).abs().max()) / scale
        if not d <= worst:  # also takes a NaN
            worst = d
    return worst


@contextlib.contextmanager
def rounded_weights(adapter, head, dtype: str):
    """Inside: the drafter's own weights and the head's rounded to `dtype` (and back to their
    compute dtype), as a bundle of that dtype holds them. Restored on exit. Works for every
    family: only `backbone_parameters()` (the contract's own-weights list) are touched, never
    the shared target."""
    import torch

    from ..target import TORCH_DTYPES

    params = list(adapter.backbone_parameters()) + list(head.parameters())
    saved = [p.detach().clone() for p in params]
    try:
        with torch.no_grad():
            for p in params:
                p.copy_(p.to(TORCH_DTYPES[dtype]).to(p.dtype))
        yield adapter, head
    finally:
        with torch.no_grad():
            for p, v in zip(params, saved):
                p.copy_(v)


def _base_logits(adapter, ids, feats, anchors):
    """Per anchor: (the drafter's own base logits [B, K, V], their argmax): what a bundle
    without the Domino head drafts from."""
    import torch

    out = []
    for a in anchors:
        adapter.reset(ids.shape[0])
        adapter.observe(None if feats is None else feats[:, :a], torch.arange(a, device=ids.device), ids=ids[:, :a])
        logits = adapter.propose(ids[:, a], a).base_logits.float()
        out.append((logits, logits.argmax(-1)))
    return out


def _reload_headless(bundle_dir: Path, *, recipe, family, target, device):
    """A bundle written without the head, rebuilt the way any checkpoint of the family is read."""
    verify_bundle(bundle_dir)
    drafter = family.bundle_recipe(recipe, bundle_dir).drafter
    adapter, head_tensors = family.build(drafter, target)
    if head_tensors:
        raise CheckpointError(f"{bundle_dir}: holds head tensors {sorted(head_tensors)} though its format drops the head")
    return adapter.to(device)


def self_check(bundle_dir: Path, *, target, adapter, head, dtype: str, format: str, family, seed: int = 0,
               device="cpu", recipe=None, head_in_bundle: bool = True) -> dict:
    """Reload the bundle through the project's loader and compare draft logits; raise ExportError.
    head_in_bundle=False: the format drops the head, so the drafter's base logits are compared."""
    import torch

    with torch.no_grad():
        ids, feats, anchors = _probe_inputs(target, adapter, seed=seed)

        def draft(a, h, prev_tokens=None, greedy=True):
            if not head_in_bundle:
                return _base_logits(a, ids, feats, anchors)
            return _draft_logits(a, h, ids, feats, anchors, prev_tokens, greedy)

        mem = draft(adapter, head)
        if not all(bool(x.isfinite().all()) for x, _ in mem):
            raise ExportError("export self-check failed, no bundle written: the model's own draft logits are not "
                              "finite (NaN/Inf weights or activations); it is not exportable")
        tokens = [t for _, t in mem]
        # fp32 export: rounding is the identity, the in-memory pass is the rounded reference
        if dtype == "fp32":
            rounded = mem
        else:
            with rounded_weights(adapter, head, dtype):
                rounded = draft(adapter, head, tokens, greedy=False)
        if head_in_bundle:
            loaded = load_bundle(bundle_dir, device=device, target=target)
            # teacher-forced on the in-memory proposals (comparable logits), plus its own greedy ones
            reloaded = draft(loaded.adapter, loaded.head, tokens)
        else:
            reloaded = draft(_reload_headless(bundle_dir, recipe=recipe, family=family, target=target,
                                              device=device), None)
        compute = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[target.dtype]
        result = {
            "blocks": len(anchors) * ids.shape[0],
            "anchors": anchors,
            "exact_max_rel_diff": max_rel_diff(rounded, reloaded),
            "exact_tolerance": EXACT_TOL[compute],
            "fidelity_max_rel_diff": max_rel_diff(mem, reloaded),
            # in bf16/fp16 compute any weight perturbation flips activation roundings: ~1% seen on
            # an H200 for an fp16 export of a bf16 model, so the compute dtype bounds it from below
            "fidelity_tolerance": max(FIDELITY_TOL[dtype], FIDELITY_TOL[compute]),
            "greedy_tokens_equal": sum(int(torch.equal(a, b)) for (_, a), (_, b) in zip(mem, reloaded)),
        }
        problems = []
        if not result["exact_max_rel_diff"] <= result["exact_tolerance"]:
            problems.append(
                f"reloaded bundle vs the in-memory weights rounded to {dtype}: max |Δlogit|/max|logit| = "
                f"{result['exact_max_rel_diff']:.3g} > {result['exact_tolerance']:g} (a tensor or config field "
                "was written wrongly)"
            )
        if not result["fidelity_max_rel_diff"] <= result["fidelity_tolerance"]:
            problems.append(
                f"reloaded {dtype} bundle vs the trained model: max |Δlogit|/max|logit| = "
                f"{result['fidelity_max_rel_diff']:.3g} > {result['fidelity_tolerance']:g} (weights do not survive "
                f"{dtype}; export with --dtype fp32)"
            )
        if dtype == "fp32" and result["greedy_tokens_equal"] != len(anchors):
            problems.append("greedy draft tokens of the reloaded fp32 bundle differ from the in-memory model's")
        extra, extra_problems = family.bundle_extra_check(bundle_dir, format=format, probe={
            "target": target, "ids": ids, "feats": feats, "anchors": anchors, "tokens": tokens,
            "reference": rounded, "compute": compute, "dtype": dtype})
        result.update(extra)
        problems += extra_problems
    if problems:
        raise ExportError("export self-check failed, no bundle written: " + "; ".join(problems))
    result["passed"] = True
    return result
