"""The bundle's README.md: what it is, what was measured, the engine rules it passed, how to serve
it and how it was made, all read from its manifest."""

from __future__ import annotations

import json
import math

from ..registry import get_family
from .engine_rules import ENGINE_NAMES

def _fmt_value(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def target_reference(manifest: dict) -> str:
    """The target as a serving command names it (TARGET for a random test target)."""
    t = manifest["target"]
    return "TARGET" if t.get("kind") == "random" else (t.get("path") or t.get("name_or_path") or "TARGET")


def model_card(manifest: dict, config: dict, *, bundle: str = "BUNDLE") -> str:
    """The bundle's README.md, section by section, from its manifest and main config."""
    family = get_family(manifest["drafter"].get("family") or manifest["recipe"]["drafter"]["family"])
    lines = _card_summary(manifest, config, family)
    lines += ["", "## Measured", ""] + _card_measured(manifest)
    lines += _card_engines(manifest, bundle)
    lines += ["", "## Serve", ""] + _card_serve(manifest, family, bundle)
    lines += ["", "## How it was made", ""] + _card_made(manifest, family, bundle)
    return "\n".join(lines)


def _card_summary(manifest: dict, config: dict, family) -> list[str]:
    """The title, what a Domino drafter is, and the table of target, drafter, head, tensors and format."""
    t, h = manifest["target"], manifest["head"]
    fmt, dtype = manifest["format"], manifest["dtype"]
    name = family.display_name
    drafter_row, format_row = family.card_rows(manifest, config)
    target_ref = target_reference(manifest)
    target_desc = (f"random {t.get('architecture')}, seed {t.get('seed')}" if t.get("kind") == "random"
                   else f"`{target_ref}`")
    n_params = sum(math.prod(v["shape"]) for v in manifest["tensors"].values())
    head_params = sum(math.prod(v["shape"]) for k, v in manifest["tensors"].items()
                      if k.startswith(("prefix_gru.", "embed_proj.")))
    return [
        f"# {manifest['recipe'].get('name') or 'domino-graft'} — {name} drafter + Domino head ({fmt}, {dtype})",
        "",
        f"A parallel {name} drafter with a Domino head (arXiv 2605.29707) for speculative decoding: one",
        "backbone forward drafts a block, and a bias-free GRU over the drafted prefix adds a low-rank",
        "logit correction, `L_final = L_base + W2·SiLU(W1·[H; S])`. Verification by the target keeps",
        "the output distribution exactly the target's.",
        "",
        "| | |",
        "|---|---|",
        f"| target | {target_desc} ({t.get('architecture')}, hidden {t.get('hidden_size')}, vocab {t.get('vocab_size')}, "
        f"config hash `{t.get('config_hash')}`) |",
        drafter_row,
        f"| head | GRU {h['gru_hidden_dim']}, rank {h['rank']}, pure prefix {h['pure_prefix_len']}: "
        + (f"{head_params:,} parameters |" if manifest.get("head_in_bundle", True) else
           "**dropped** from this bundle (the engine has no Domino runtime); the native bundle carries it |"),
        f"| tensors | {len(manifest['tensors'])}, {n_params:,} parameters, {dtype} |",
        format_row,
    ]


def _card_measured(manifest: dict) -> list[str]:
    """τ and friends from the source run's bench files, and the export self-check."""
    dtype = manifest["dtype"]
    lines = []
    bench = [b for b in manifest.get("bench") or [] if b["values"]]
    if bench:
        for b in bench:
            vals = ", ".join(f"`{k}` = {_fmt_value(v)}" for k, v in b["values"].items())
            where = f" on {b['device']}" if b.get("device") else ""
            lines.append(f"- `{b['file']}` (`domino-graft bench` of `{b.get('measured_on') or 'the source run'}`"
                         f"{where}, weights before rounding to {dtype}): {vals}")
    else:
        lines.append("τ (mean accepted tokens per target forward): **not measured** — no `bench*.json` in the source "
                     "run. Run `domino-graft bench` and re-export to record it here.")
    sc = manifest.get("self_check") or {}
    if sc:
        lines += [
            "",
            f"Export self-check ({sc['blocks']} random blocks): reloaded draft logits vs the weights rounded to {dtype}: "
            f"{sc['exact_max_rel_diff']:.2g} (≤ {sc['exact_tolerance']:g}); vs the trained model: "
            f"{sc['fidelity_max_rel_diff']:.2g} (≤ {sc['fidelity_tolerance']:g}), relative to max |logit|."
            + (f" transformers remote code: {sc['hf_max_rel_diff']:.2g}." if "hf_max_rel_diff" in sc else ""),
        ]
    return lines


def _card_engines(manifest: dict, bundle: str) -> list[str]:
    """Each engine's checklist result, as export recorded it (none: no section)."""
    engines = manifest.get("engines") or {}
    if not engines:
        return []
    lines = ["", "## Engine checklists", ""]
    lines += [f"- {ENGINE_NAMES[e]}: " + ("passes" if r["passed"] else f"refused: {r['refused']}" if r.get("refused")
              else f"fails {len(r['failed'])} of {r['rules']} rules") for e, r in engines.items()]
    lines.append(f"\n`domino-graft inspect {bundle}` lists every rule and its source.")
    return lines


def _card_serve(manifest: dict, family, bundle: str) -> list[str]:
    """How to serve it: the family's engine commands, after how to rebuild a random target."""
    lines = []
    if manifest["target"].get("kind") == "random":
        lines += random_target_rebuild(manifest, bundle)
        if getattr(family, "names_verifier", False):
            lines += [f"This {family.display_name} drafter's `speculators_config.verifier.name_or_path` is null: a "
                      "random target has no folder or hub name, so no engine can load its verifier by name "
                      "(`export --engine vllm` refuses it).", ""]
    return lines + family.card_serve_lines(manifest, bundle=bundle, target_ref=target_reference(manifest))


def _card_made(manifest: dict, family, bundle: str) -> list[str]:
    """Training, recipe, versions and source run; how to reload the bundle strictly."""
    lines = []
    training = (manifest.get("source_run") or {}).get("training")
    if isinstance(training, dict) and training:
        lines.append("Training (from the source run's manifest):")
        lines.append("")
        for k, v in training.items():
            lines.append(f"- `{k}`: {json.dumps(v, default=str) if isinstance(v, (dict, list)) else _fmt_value(v)}")
    else:
        lines.append("No training entry in the source run's manifest: the head is as grafted (W2 = 0 means the "
                     f"bundle drafts exactly like the base {family.display_name} drafter) or was loaded from a "
                     "checkpoint.")
    tr = manifest["recipe"].get("train") or {}
    lines += [
        "",
        f"Recipe (full text in manifest.json): backbone `{tr.get('backbone')}`, λ {tr.get('lambda_start')} → 0 over "
        f"{tr.get('decay_ratio')} of {tr.get('max_steps')} steps, γ {tr.get('gamma')}, lr {tr.get('lr')}.",
        f"domino-graft {manifest['versions'].get('domino-graft')} (git {manifest.get('git_sha')}), "
        f"torch {manifest['versions'].get('torch')}, transformers {manifest['versions'].get('transformers')}; "
        f"exported {manifest['created_at']} from `{manifest['source_run']['path']}`.",
        "",
        f"Reload strictly (checksums, target identity): `domino_graft.loading.load_bundle({bundle!r})`.",
        "",
    ]
    return lines


def random_target_rebuild(manifest: dict, bundle: str) -> list[str]:
    """The card's lines rebuilding a random target without domino_graft (transformers + torch)."""
    t = manifest["target"]
    dtype = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(
        ((manifest.get("recipe") or {}).get("target") or {}).get("dtype"), "float32")
    return [
        f"The target is a random test model (seed {t.get('seed')}), which `domino_graft.loading.load_bundle` rebuilds "
        "from its seed. Without domino_graft, with the transformers and torch versions in manifest.json's `versions`:",
        "",
        "```python",
        "import json, torch, transformers",
        f"t = json.load(open({(bundle + '/manifest.json')!r}))[\"target\"]",
        "config = transformers.AutoConfig.for_model(**t[\"hf_config\"])",
        "torch.manual_seed(t[\"seed\"])",
        f"target = transformers.AutoModelForCausalLM.from_config(config).to(torch.{dtype})",
        "```",
        "",
        f"(its config hash, sha256 of the sorted config JSON without its version and path keys: `{t.get('config_hash')}`).",
        "The serving commands below show the shape of a real deployment.",
        "",
    ]
