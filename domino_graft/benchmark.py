"""`bench`: decode every prompt three ways and measure what speculation buys.

    target alone      the baseline: autoregressive, on the same engine, caches and dtype
    base drafter      speculative, Domino head off (the parallel drafter as it was)
    domino drafter    speculative, Domino head on

Modes are interleaved prompt by prompt, so drift in machine load hits all three alike.
Metrics (docs/design.md §5): tau = tokens per target forward after the prefill (accepted + bonus,
averaged over all verify steps of all prompts); per-slot acceptance = accepted / reached
per slot; tokens/s = generated tokens / wall time (prefill included, every mode);
speedup = tokens/s over the baseline's tokens/s. Greedy runs also check that every
speculative output equals the baseline token for token. The report's `timing_note` says when
tokens/s and speedup are not results (a toy target, or a CPU, where speculation cannot win).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

from .decoding import Engine, Sampling, encode_prompt, stop_token_ids
from .decoding.divergence import first_divergence

MODES = ("target", "base", "domino")
MODE_LABELS = {"target": "target alone", "base": "base drafter", "domino": "domino drafter"}
RANDOM_PROMPTS = 8  # built-in prompt set for tokenizer-less (random) targets


# ---------------------------------------------------------------------- prompts
def read_prompts(path: str, *, limit: Optional[int] = None, flag: str = "--prompts") -> list[dict]:
    """JSONL, one object per line: {"prompt": str} | {"messages": [...]} | {"prompt_ids": [int]}
    (optionally "raw": true to skip the chat template for that prompt). Every line's types are
    checked as it is read (file:line, field, bad value); lengths are checked when encoding."""
    from .inputs import check_prompt_record, iter_jsonl

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{flag}: {str(p)!r} does not exist or is not a file")
    out = []
    for n, obj in iter_jsonl(p, flag):
        check_prompt_record(obj, f"{flag}: {p}:{n}")
        out.append({"source": f"{p.name}:{n}", **obj})
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise ValueError(f"{flag}: {p} holds no prompts; valid: one JSON object per line, e.g. {{\"prompt\": \"Hi\"}}")
    return out


def random_id_prompts(vocab_size: int, *, seed: int, reserved=(), count: int = RANDOM_PROMPTS) -> list[dict]:
    """Deterministic token-id prompts (lengths 8..24) for targets without a tokenizer."""
    import random

    rng = random.Random(seed)
    usable = [i for i in range(vocab_size) if i not in set(reserved)]
    return [
        {"source": f"random:{i}", "prompt_ids": [rng.choice(usable) for _ in range(rng.randint(8, 24))]}
        for i in range(count)
    ]


def resolve_prompts(loaded, path: Optional[str], *, seed: int, limit: Optional[int]) -> list[dict]:
    path = path or loaded.recipe.bench.prompts
    if path:
        return read_prompts(path, limit=limit)
    if loaded.target.tokenizer is not None:
        raise ValueError(
            "--prompts: required for a target with a tokenizer (bench.prompts is not set in the recipe); give a "
            "JSONL file with {\"prompt\": ...} or {\"messages\": [...]} lines"
        )
    prompts = random_id_prompts(loaded.target.shape.vocab_size, seed=seed, reserved=_reserved_ids(loaded))
    return prompts[:limit] if limit is not None else prompts


def _reserved_ids(loaded) -> set[int]:
    """Ids a prompt must not hold: the target's stop ids and the drafter's placeholder tokens."""
    return stop_token_ids(loaded.target) | {int(i) for i in loaded.adapter.reserved_token_ids()}


def encode(loaded, item: dict, *, max_new_tokens: Optional[int] = None) -> list[int]:
    """One prompt's ids; it must fit the target's positions with `max_new_tokens` to generate."""
    return encode_prompt(
        loaded.target,
        prompt=item.get("prompt"),
        messages=item.get("messages"),
        prompt_ids=item.get("prompt_ids"),
        raw=bool(item.get("raw", False)),
        chat=loaded.recipe.target.chat,
        reserved=_reserved_ids(loaded),
        placeholders=loaded.adapter.reserved_token_ids(),
        max_new_tokens=max_new_tokens,
        where=f"--prompts {item.get('source', '')}".strip(),
    )


# ------------------------------------------------------------------------ bench
class Tally:
    def __init__(self, k: int):
        self.tokens = 0
        self.seconds = 0.0
        self.steps = 0
        self.step_tokens = 0
        self.reached = [0] * k
        self.accepted = [0] * k
        self.request_rates: list[float] = []  # each request's tokens / its own latency

    def add(self, r, *, seconds: Optional[float] = None) -> None:
        """One request's result; `seconds` = the wall time it adds (a batch adds its wall time once)."""
        self.tokens += len(r.tokens)
        self.seconds += r.seconds if seconds is None else seconds
        if r.seconds > 0:
            self.request_rates.append(len(r.tokens) / r.seconds)
        self.steps += r.decode_steps
        self.step_tokens += sum(a + 1 for a in r.accepted) if r.accepted else r.decode_steps
        for j, (n, a) in enumerate(zip(r.slot_reached, r.slot_accepted)):
            self.reached[j] += n
            self.accepted[j] += a

    def tau(self) -> Optional[float]:
        return self.step_tokens / self.steps if self.steps else None

    def per_slot(self) -> list[Optional[float]]:
        return [a / n if n else None for a, n in zip(self.accepted, self.reached)]

    def tokens_per_s(self) -> Optional[float]:
        return self.tokens / self.seconds if self.seconds > 0 else None

    def per_request_tokens_per_s(self) -> Optional[float]:
        return sum(self.request_rates) / len(self.request_rates) if self.request_rates else None


def _decode_prompt(runs, i, ids, item, count, target, sampling, tallies, identical, kv_paths, divergences,
                   bar) -> dict:
    """Prompt i decoded in every mode (interleaved: drift in machine load hits all alike) -> its row."""
    results = {}
    for mode in MODES:
        bar.set_postfix_str(f"prompt {i + 1}/{count} {mode}")
        results[mode] = runs[mode](ids, i)
        kv_paths[mode].add(results[mode].kv_path)
        tallies[mode].add(results[mode])
        bar.update(1)
    return _prompt_row(ids, item, results, target, sampling, identical, divergences)


def _decode_batch(runs, start, chunk, items, count, target, sampling, tallies, identical, kv_paths, divergences,
                  bar) -> list[dict]:
    """Prompts start.. decoded together in every mode (batch by batch, interleaved) -> their rows."""
    import time

    results = {}
    for mode in MODES:
        bar.set_postfix_str(f"prompts {start + 1}-{start + len(chunk)}/{count} {mode}")
        t0 = time.perf_counter()
        results[mode] = runs[mode](chunk, start)
        wall = time.perf_counter() - t0
        for n, r in enumerate(results[mode]):
            kv_paths[mode].add(r.kv_path)
            tallies[mode].add(r, seconds=wall if n == 0 else 0.0)
        bar.update(len(chunk))
    return [_prompt_row(ids, items[n], {m: results[m][n] for m in MODES}, target, sampling, identical, divergences)
            for n, ids in enumerate(chunk)]


def _prompt_row(ids, item, results, target, sampling, identical, divergences) -> dict:
    row = {"source": item.get("source"), "prompt_tokens": len(ids)}
    for mode in ("base", "domino"):
        identical[mode] &= results[mode].tokens == results["target"].tokens
    row["new_tokens"] = {m: len(results[m].tokens) for m in MODES}
    row["tau"] = {m: results[m].tau for m in ("base", "domino")}
    if sampling.greedy:
        row["identical_to_target"] = {m: results[m].tokens == results["target"].tokens for m in ("base", "domino")}
        for m in ("base", "domino"):
            if not row["identical_to_target"][m]:  # numerics or a bug? measure the target's top-2 gap there
                div = first_divergence(target, ids, results["target"].tokens, results[m].tokens)
                row.setdefault("divergence", {})[m] = div
                divergences.append((m, div))
    return row


# Below this many target parameters a forward takes well under a millisecond: tokens/s then
# measure Python overhead and the machine's mood (a random tiny target read 33-328 tokens/s
# alone across runs of one bench), not decoding. SmolLM2-135M, the smallest real target, is 135 M.
TOY_TARGET_PARAMETERS = 10_000_000


def timing_note(target, device: str) -> Optional[str]:
    """Why this bench's tokens/s and speedups are not results (None when they are)."""
    why = []
    params = sum(p.numel() for p in target.parameters())
    if (target.identity or {}).get("kind") == "random" or params < TOY_TARGET_PARAMETERS:
        kind = "a random toy model" if (target.identity or {}).get("kind") == "random" else "a toy-sized model"
        why.append(f"the target is {kind} ({params:,} parameters): its forwards take well under a millisecond, so "
                   "tokens/s measure overhead and vary several-fold between runs")
    if not device.startswith("cuda"):
        where = "a CPU" if device == "cpu" else f"{device} (not a CUDA GPU)"
        why.append(f"on {where} speculation cannot make decoding faster: a verify forward is compute-bound, "
                   "its cost growing with the K+1 tokens it checks")
    if not why:
        return None
    return ("tokens/s and speedup are NOT meaningful here: " + "; ".join(why)
            + ". tau, acceptance and identical_to_target are; speed results measured on a GPU: docs/results.md")


def run_bench(
    loaded,
    prompts: list[dict],
    *,
    max_new_tokens: int,
    sampling: Sampling,
    rollout: str | dict = "torch",
    progress: bool = True,
    warmup: bool = True,
    kv: str = "auto",
    batch_size: int = 1,
    verify_budget=None,
) -> dict:
    """batch_size > 1: the prompts decode `batch_size` at a time (decoding/batched.py: chains, on the
    fast engine's static cache where the target supports it, any device; kv="dynamic" forces the
    HF cache); tokens/s are then the batch's totals, per-request tokens/s each request's own.
    verify_budget: a decoding.budget.VerifyBudget for the batched chains (None: verify all K)."""
    from .artifacts.provenance import hardware, versions
    from .progress import Progress

    target, adapter, head = loaded.target, loaded.adapter, loaded.head
    choice = {"name": rollout} if isinstance(rollout, str) else dict(rollout)  # see decoding.rollout_choice
    engine = Engine(target, adapter, head, rollout=choice, stop_ids=stop_token_ids(target), kv=kv)
    encoded = [encode(loaded, item, max_new_tokens=max_new_tokens) for item in prompts]  # all, before any decode
    k = adapter.num_slots
    # one budget per speculative mode: what a decode learns (acceptance by batch size) is the mode's own
    budgets = {m: None if verify_budget is None else verify_budget.fresh() for m in ("base", "domino")}
    runs = {
        "target": lambda ids, i: engine.target_only(ids, max_new_tokens=max_new_tokens, sampling=sampling, seed_offset=i),
        "base": lambda ids, i: engine.speculative(ids, max_new_tokens=max_new_tokens, sampling=sampling,
                                                  use_head=False, seed_offset=i, budget=budgets["base"]),
        "domino": lambda ids, i: engine.speculative(ids, max_new_tokens=max_new_tokens, sampling=sampling,
                                                    use_head=True, seed_offset=i, budget=budgets["domino"]),
    }
    if batch_size < 1:
        raise ValueError(f"--batch-size: {batch_size!r} is invalid; valid: an integer >= 1")
    if verify_budget is not None:  # before any decode
        verify_budget.check(k, str(target.device).split(":")[0])
    budget_hist: dict = {}  # batch size -> mode -> K' -> steps
    batched = batch_size > 1
    if batched:
        from .decoding.batched import batched_chain, batched_target_only

        # at T > 0: seed + the batch's first index
        kw = dict(max_new_tokens=max_new_tokens, sampling=sampling, kv="dynamic" if kv == "dynamic" else "auto")
        def chain(mode):
            def decode(chunk, i):
                out = batched_chain(engine, chunk, use_head=mode == "domino", seed_offset=i, budget=budgets[mode],
                                    **kw)
                if verify_budget is not None and i >= 0:  # the K' chosen, by batch size (not the warm-up's)
                    hist = budget_hist.setdefault(str(len(chunk)), {}).setdefault(mode, {})
                    for kk, n in engine.last_run.k_hist().items():  # inside the timed decode: not the whole report
                        hist[kk] = hist.get(kk, 0) + n
                return out
            return decode

        runs = {"target": lambda chunk, i: batched_target_only(engine, chunk, seed_offset=i, **kw),
                "base": chain("base"), "domino": chain("domino")}
    tallies = {m: Tally(k) for m in MODES}
    identical = {"base": True, "domino": True}
    per_prompt = []
    kv_paths: dict[str, set] = {m: set() for m in MODES}  # the target cache each mode's decodes ran on
    divergences: list = []
    with Progress(total=len(encoded) * len(MODES), desc="bench", unit="decode", enabled=progress, leave=False) as bar:
        if warmup:  # first calls pay one-off costs (allocator, lazy init, kernels): keep them out of tokens/s
            for mode in MODES:
                bar.set_postfix_str(f"warm-up {mode}")
                runs[mode](encoded[:batch_size], -1) if batched else runs[mode](encoded[0], -1)
        if batched:
            for start in range(0, len(encoded), batch_size):
                per_prompt += _decode_batch(runs, start, encoded[start: start + batch_size], prompts[start:],
                                            len(encoded), target, sampling, tallies, identical, kv_paths,
                                            divergences, bar)
        else:
            for i, ids in enumerate(encoded):
                per_prompt.append(_decode_prompt(runs, i, ids, prompts[i], len(encoded), target, sampling, tallies,
                                                 identical, kv_paths, divergences, bar))

    base_tps = tallies["target"].tokens_per_s()
    kv_path = {m: "+".join(sorted(kv_paths[m])) or None for m in MODES}

    def speedup(mode):
        tps = tallies[mode].tokens_per_s()
        return tps / base_tps if tps and base_tps else None

    device = str(target.device)
    timing = timing_note(target, device)
    notes = []
    if not sampling.greedy:
        notes.append(
            "identical_to_target is null: at temperature > 0 speculative sampling matches the target's output "
            "distribution, not its token sequence (different random draws), so outputs are not compared token for token"
        )
    if batched:
        notes.append(
            f"batch_size {batch_size}: the prompts decoded {batch_size} at a time (the target on the cache kv_path "
            "names: static = the fast engine's, with CUDA graphs per batch size on a GPU; the drafter on its static "
            "batch path where its family has one, else eager); "
            "tokens_per_s is the batches' total, per_request_tokens_per_s each request's tokens over its own "
            "latency, averaged")
    if head is not None and head.is_identity():
        notes.append("the Domino head is the identity (W2 = 0, untrained): grafted and base drafters propose the same")
    if divergences:
        ties = sum(d["near_tie"] for _, d in divergences)
        notes.append(
            f"{len(divergences)} greedy decode(s) differ from the target's own: {ties} at a floating-point near-tie "
            "(the target's top-2 logits within rounding; both outputs are valid greedy decodes of the target), "
            f"{len(divergences) - ties} NOT at a near-tie (look for a bug); see per_prompt[].divergence")
    run = loaded.manifest
    estimate = training_tau_estimate(run)
    collapsed = {}
    if sampling.greedy and estimate:
        for mode, key in (("domino", "tau_final"), ("base", "tau_base")):
            if tau_collapsed(tallies[mode].tau(), estimate.get(key)):
                collapsed[mode] = True
                notes.append(
                    f"WARNING: tau collapse ({mode}): {tallies[mode].tau():.2f} when decoding vs {estimate[key]:.2f} "
                    "estimated in training. The drafter predicts under teacher forcing but not when serving: the "
                    "usual cause is a convention mismatch between the checkpoint and this serving path "
                    "(the drafter's slot conventions: label shift, pure prefix, target layers, placeholder token; "
                    "docs/design.md §2), or prompts far from the training data")
    return {
        "tau": tallies["domino"].tau(),
        "per_slot_acceptance": tallies["domino"].per_slot(),
        # slot j's acceptance = accepted[j] / reached[j]: a 1.00 from 1 of 1 is not a result
        "slot_reached": tallies["domino"].reached,
        "slot_accepted": tallies["domino"].accepted,
        "base_slot_reached": tallies["base"].reached,  # "base" keeps its fixed key set, as with kv_path
        "base_slot_accepted": tallies["base"].accepted,
        "tokens_per_s": tallies["domino"].tokens_per_s(),
        "target_tokens_per_s": base_tps,
        "batch_size": batch_size,
        # each request's tokens / its own latency, averaged ("base" keeps its fixed key set)
        "per_request_tokens_per_s": tallies["domino"].per_request_tokens_per_s(),
        "base_per_request_tokens_per_s": tallies["base"].per_request_tokens_per_s(),
        "target_per_request_tokens_per_s": tallies["target"].per_request_tokens_per_s(),
        "speedup": speedup("domino"),
        "identical_to_target": identical["domino"] if sampling.greedy else None,
        "timing_note": timing,  # None: the timings are meaningful (a real target on a GPU)
        "device": device,
        "base": {
            "tau": tallies["base"].tau(),
            "per_slot_acceptance": tallies["base"].per_slot(),
            "tokens_per_s": tallies["base"].tokens_per_s(),
            "speedup": speedup("base"),
            "identical_to_target": identical["base"] if sampling.greedy else None,
        },
        # the target cache each mode ran on ("static" | "dynamic"); "base" keeps its fixed key set
        "kv_path": kv_path["domino"],
        "base_kv_path": kv_path["base"],
        "target_kv_path": kv_path["target"],
        "kv": {"requested": kv, **kv_path, "note": engine.kv_note},
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,
        "top_p": sampling.top_p,
        "seed": sampling.seed,
        "max_new_tokens": max_new_tokens,
        "num_prompts": len(encoded),
        "num_slots": k,
        "new_tokens": {m: tallies[m].tokens for m in MODES},
        "target_forwards": {m: tallies[m].steps + len(encoded) for m in MODES},
        "rollout": choice,
        # the drafts verified per step (decoding/budget.py): K' -> steps, by batch size and mode; the
        # costs it chose by (measured on CUDA where the table had none: reusable as --verify-costs)
        "verify_budget": None if verify_budget is None else {
            "mode": verify_budget.label(), "by_batch_size": budget_hist,
            "costs": None if verify_budget.costs is None else verify_budget.costs.to_dict()},
        "training_tau_estimate": estimate,
        "tau_collapse": collapsed,
        "run": {
            "path": str(Path(loaded.path).resolve()),
            "kind": run.get("kind"),
            "created_at": run.get("created_at"),
            "git_sha": run.get("git_sha"),
            "target": run.get("target"),
            "drafter": run.get("drafter"),
        },
        "recipe": {"name": loaded.recipe.name, "drafter_family": loaded.recipe.drafter.family},
        "hardware": hardware(),
        "versions": versions(),
        "notes": notes,
        "per_prompt": per_prompt,
    }


# ------------------------------------------------------------- collapse check
# Serving tau far below what training measured is the classic silent failure of drafter ports
# (an off-by-one slot or layer convention: training accuracy looks fine, tau ~ 1 in serving).
# Flag it when the training estimate is meaningful (>= 1.5) and serving keeps under a quarter of
# its gain over 1. Loose on purpose: bench prompts may sit outside the training distribution.
COLLAPSE_MIN_ESTIMATE = 1.5
COLLAPSE_KEPT_FRACTION = 0.25


def training_tau_estimate(manifest: dict) -> dict:
    """{"tau_final", "tau_base"} from the run's last training metrics ({} if never trained)."""
    final = ((manifest or {}).get("training") or {}).get("final_metrics") or {}
    return {k: float(final[k]) for k in ("tau_final", "tau_base") if final.get(k) is not None}


def tau_collapsed(serving_tau: Optional[float], estimate: Optional[float]) -> bool:
    if serving_tau is None or estimate is None or estimate < COLLAPSE_MIN_ESTIMATE:
        return False
    return serving_tau - 1.0 < COLLAPSE_KEPT_FRACTION * (estimate - 1.0)


# ---------------------------------------------------------------------- output
def _f(x, fmt: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def format_report(rep: dict) -> str:
    mode = "greedy" if rep["temperature"] == 0 else f"temperature {rep['temperature']:g}"
    timing = rep.get("timing_note")
    star = "*" if timing else ""  # marks the columns the timing note disowns
    lines = [
        f"bench {rep['recipe']['name'] or ''}  {rep['num_prompts']} prompts, max {rep['max_new_tokens']} new tokens, "
        f"{mode}, batch {rep.get('batch_size', 1)}, {rep.get('device') or rep['hardware'].get('device')}",
        f"  {'':<16}{'tau':>7}{'tokens/s' + star:>11}{'speedup' + star:>9}{'identical':>11}",
        f"  {MODE_LABELS['target']:<16}{1.0:>7.2f}{_f(rep['target_tokens_per_s'], '.1f'):>11}{'1.00x':>9}{'-':>11}",
    ]
    for label, d in ((MODE_LABELS["base"], rep["base"]), (MODE_LABELS["domino"], rep)):
        ident = {True: "yes", False: "NO", None: "n/a"}[d["identical_to_target"]]
        sp = _f(d["speedup"], ".2f") + "x" if d["speedup"] is not None else "-"
        lines.append(f"  {label:<16}{_f(d['tau'], '.2f'):>7}{_f(d['tokens_per_s'], '.1f'):>11}{sp:>9}{ident:>11}")
    choice = rep.get("rollout") or {}
    if choice.get("pool_select") == "block_shared":  # say which tau this is: SGLang's, not a per-slot pool's
        lines.append(f"  domino drafts from SGLang's candidates: one block_shared pool of {choice.get('pool_size')} "
                     "per block (--speculative-domino-candidate-pool-size)")
    if rep.get("batch_size", 1) > 1:
        lines.append(f"  batch size {rep['batch_size']}: tokens/s are the batch's total; per request: target "
                     f"{_f(rep['target_per_request_tokens_per_s'], '.1f')}, base "
                     f"{_f(rep['base_per_request_tokens_per_s'], '.1f')}, domino "
                     f"{_f(rep['per_request_tokens_per_s'], '.1f')}")
    vb = rep.get("verify_budget")
    if vb:
        for size, modes in vb["by_batch_size"].items():
            lines.append(f"  verify budget {vb['mode']}, batch {size}: K' chosen (K' x steps): " + "; ".join(
                f"{m} " + " ".join(f"{kk}x{n}" for kk, n in sorted(h.items(), key=lambda e: int(e[0])))
                for m, h in modes.items()))
    if timing:
        import textwrap

        lines += textwrap.wrap(timing, width=112, initial_indent="  * ", subsequent_indent="    ")
    lines += format_acceptance(rep)
    for note in rep.get("notes", []):
        lines.append(f"  note: {note}")
    return "\n".join(lines)


def format_acceptance(rep: dict) -> list[str]:
    """One line per slot, each rate with the counts behind it: `0.61 (311/510)`. Slot j is the
    j-th proposal after the anchor (docs/design.md §2), numbered as in the plan and in train."""
    k = len(rep["per_slot_acceptance"])
    cols = [(MODE_LABELS["base"], rep["base"]["per_slot_acceptance"], rep.get("base_slot_accepted"),
             rep.get("base_slot_reached")),
            (MODE_LABELS["domino"], rep["per_slot_acceptance"], rep.get("slot_accepted"), rep.get("slot_reached"))]

    def cell(rates, accepted, reached, j) -> str:
        rate = _f(rates[j], ".2f")
        return f"{rate:>4} ({accepted[j]}/{reached[j]})" if accepted and reached else rate

    lines = [f"  acceptance by slot (slot j = proposal j of {k} after the anchor; accepted / blocks that reached it)",
             f"    {'slot':>4}   " + "".join(f"{label:<22}" for label, *_ in cols).rstrip()]
    for j in range(k):
        lines.append(f"    {j + 1:>4}   " + "".join(f"{cell(r, a, n, j):<22}" for _, r, a, n in cols).rstrip())
    return lines


def check_plot_available() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise RuntimeError("--plot: matplotlib is not installed; `pip install matplotlib`, or run without --plot") from None


def plot_acceptance(rep: dict, path: str) -> None:
    check_plot_available()
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    k = len(rep["per_slot_acceptance"])
    slots = list(range(1, k + 1))
    nan = float("nan")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for label, d, marker in (("base drafter", rep["base"], "o"), ("domino drafter", rep, "s")):
        ys = [nan if a is None else a for a in d["per_slot_acceptance"]]
        ax.plot(slots, ys, marker=marker, label=f"{label} (tau {_f(d['tau'], '.2f')})")
    ax.set_xlabel("slot j (given slots < j accepted)")
    ax.set_ylabel("acceptance")
    ax.set_ylim(0, 1.02)
    ax.set_xticks(slots)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"{rep['recipe']['name'] or 'bench'}: acceptance by slot, T={rep['temperature']:g}")
    fig.tight_layout()
    import io

    from .artifacts.files import atomic_write_bytes

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
