"""Offline acceptance: how many leading block slots a trained drafter gets right on the target's
own greedy responses, without decoding.

Greedy chain verification accepts exactly the leading slots whose proposal equals the target's
greedy token. On a response the target itself generated greedily, the context at every anchor
is the one decoding would have had, and the Domino head's GRU, fed the true tokens, sees what
it would see along an accepted prefix. So 1 + mean(leading matches) over anchors is the τ that
decoding from those anchors would measure, for the base proposals and the Domino-corrected ones,
from one batched forward.

Run it on training responses and on held-out responses of the evaluation prompts: a gap between
the two is generalisation; a gap between the held-out figure and the decoded τ of
`bench/smollm2_pipeline.py` would be an inference mismatch.

    python bench/acceptance_probe.py --runs WORK/dflash_base,WORK/dflash_domino \\
        --data train=WORK/train.regen.jsonl --data gsm8k=gsm8k.regen.jsonl --limit 40 --out probe.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from domino_graft.training.data import encode_record
from domino_graft.training.objective import IGNORE
from domino_graft.training.features import target_features


@torch.no_grad()
def leading_matches(target, adapter, head, example, *, max_anchors: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """Leading correct slots at every anchor of one response (the position of each response
    token, in order), for the base proposals and the Domino-corrected ones."""
    ids = torch.tensor([example.input_ids], device=target.device)
    mask = torch.tensor([example.loss_mask], device=target.device)
    resp = mask[0].nonzero().flatten()
    anchors = resp[:max_anchors][None]  # [1, n]
    capture = tuple(adapter.capture_layers())
    feats = target_features(target, ids, capture) if capture else None
    blocks = adapter.training_blocks(feats, ids, mask, anchors)
    k = adapter.num_slots  # decoding proposes num_slots per block (training may label one more)
    labels = blocks.labels[:, :k]
    n = labels.shape[0]
    corr = head.correction(blocks.hidden[:, :k], blocks.prev_emb[:, :k])  # [n, k, r]
    slot = torch.arange(k, device=ids.device).expand(n, k).reshape(-1)
    base = adapter.slot_base_logits(blocks.hidden[:, :k].reshape(n * k, -1), slot).float()
    delta = head.embed_proj[2](corr.reshape(n * k, -1)).float()
    final = base + delta * head.corrected_slots(k, ids.device)[slot][:, None].to(delta.dtype)
    lab = labels.reshape(-1)
    ok_b = ((base.argmax(-1) == lab) & (lab != IGNORE)).reshape(n, k)
    ok_f = ((final.argmax(-1) == lab) & (lab != IGNORE)).reshape(n, k)
    return ok_b.long().cumprod(-1).sum(-1).cpu(), ok_f.long().cumprod(-1).sum(-1).cpu()


def walk(lead: torch.Tensor) -> list[int]:
    """Greedy decoding over the response: the block at anchor i accepts lead[i] drafts plus the
    target's own token, and the next block starts after them. Returns the drafts each block
    accepts, in order (what `Engine.speculative` reports as `accepted`)."""
    i, accepted = 0, []
    while i < lead.numel():
        accepted.append(int(lead[i]))
        i += accepted[-1] + 1
    return accepted


def probe(target, adapter, head, examples, *, max_anchors: int) -> dict:
    """τ of greedy decoding replayed on the responses (tokens / forwards, as the benchmark
    counts it) and the mean over every anchor (which overweights stretches a drafter finds easy)."""
    tot = {"base": [0, 0], "final": [0, 0]}
    leads = {"base": [], "final": []}
    for ex in examples:
        for name, lead in zip(("base", "final"), leading_matches(target, adapter, head, ex, max_anchors=max_anchors)):
            accepted = walk(lead)
            tot[name][0] += sum(a + 1 for a in accepted)
            tot[name][1] += len(accepted)
            leads[name].append(lead)
    out = {"sequences": len(examples)}
    for name in ("base", "final"):
        every = torch.cat(leads[name]).double()
        out[f"tau_{name}"] = round(tot[name][0] / max(tot[name][1], 1), 4)
        out[f"tau_{name}_every_anchor"] = round(1 + every.mean().item(), 4)
    return out


def decoded_tau(records: Path, *, mode: str, eval_set: str, limit: int) -> float | None:
    """τ the decoding benchmark measured for drafter `mode` on the first `limit` prompts of a set."""
    rows = [r for f in sorted(records.glob("greedy_*.jsonl")) for r in map(json.loads, open(f))
            if r["mode"] == mode and r["set"] == eval_set and r["idx"] < limit]
    steps = sum(r["decode_steps"] for r in rows)
    return round(sum(r["step_tokens"] for r in rows) / steps, 4) if steps else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", required=True, help="run directories, comma-separated")
    p.add_argument("--data", action="append", required=True, metavar="NAME=FILE.jsonl",
                   help="responses of the target (regenerate output); repeatable")
    p.add_argument("--limit", type=int, default=40, help="first N records of each file")
    p.add_argument("--max-anchors", type=int, default=96, help="response tokens replayed per record "
                   "(the benchmark decodes 96)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--records", default=None, help="eval records of bench/smollm2_pipeline.py (WORK/eval): adds the "
                   "decoded greedy τ of the same first --limit prompts, for runs named like its drafters")
    p.add_argument("--out", default=None)
    args = p.parse_args()

    from domino_graft.rundir import load_run

    sets = {}
    for spec in args.data:
        name, sep, path = spec.partition("=")
        if not sep or not Path(path).is_file():
            p.error(f"--data: {spec!r}; valid: NAME=FILE.jsonl with an existing file")
        sets[name] = [json.loads(line) for line in open(path)][: args.limit]
    result = {"what": "greedy decoding replayed on the target's own greedy responses (teacher-forced drafts)",
              "limit": args.limit, "max_anchors": args.max_anchors,
              "data": {k: v for k, v in (s.partition("=")[::2] for s in args.data)}, "runs": {}}
    target = None
    for run_dir in args.runs.split(","):
        run = load_run(Path(run_dir), device=args.device)
        if target is not None:  # one target in memory for every run (load_run checks the identity)
            run.adapter.target = target
        target = target or run.target
        eos = (target.shape.eos_token_ids or (None,))[0]
        chat = run.recipe.target.chat
        result["runs"][run_dir] = {}
        for name, recs in sets.items():
            t0 = time.time()
            examples = [encode_record(r, target.tokenizer, chat=chat, eos_id=eos, where=f"{name}[{i}]")
                        for i, r in enumerate(recs)]
            res = probe(target, run.adapter, run.head, examples, max_anchors=args.max_anchors)
            if args.records:
                res["tau_decoded"] = decoded_tau(Path(args.records), mode=Path(run_dir).name, eval_set=name,
                                                 limit=args.limit)
            result["runs"][run_dir][name] = res
            print(f"{run_dir} {name}: tau base {res['tau_base']:.3f} final {res['tau_final']:.3f} "
                  f"(every anchor: {res['tau_base_every_anchor']:.3f} / {res['tau_final_every_anchor']:.3f}; "
                  f"{time.time() - t0:.0f} s)", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
