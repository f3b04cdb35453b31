"""Lossless speculative decoding: greedy output == target-only output, token for token.

Random tiny targets have near-flat logits, so a random drafter is almost never right and a
speculative decode would rarely accept anything: the verifier's hard paths (partial
acceptance, cache rollback after a long accepted run, a stop token or max_new_tokens in
the middle of an accepted block) would go untested. `Oracle` wraps the real DFlash
adapter (real context, real backbone forward, real Domino head) and only boosts, on a
random subset of slots, the base logit of the token the target will actually emit.
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import shutil
import warnings

import pytest
import torch

from domino_graft.adapters.base import DraftBlock
from domino_graft.adapters.dflash import adapter as dflash
from domino_graft.decoding import Engine, Sampling, get_rollout, rollout, rollout_names, stop_token_ids, warp
from domino_graft.graft import build_head
from domino_graft.recipe import parse_recipe
from domino_graft.target import load_target
from tests.conftest import REPO, randomize_head


def build(seed: int, *, arch="qwen3", vocab=61, tie=False, layers=2, block_size=4, shift=True, ppl=1,
          draft_layers=1, capture=None, head_scale=0.5, dtype="fp32", device="cpu"):
    data = {
        "name": f"variant-{seed}",
        "target": {"random": {
            "architecture": arch, "vocab_size": vocab, "hidden_size": 32, "num_layers": layers, "num_heads": 4,
            "num_kv_heads": 2, "head_dim": 8, "intermediate_size": 64, "tie_word_embeddings": tie,
            "eos_token_id": 1, "seed": seed,
        }, "dtype": dtype},
        "drafter": {"family": "dflash", "num_layers": draft_layers, "block_size": block_size,
                    "target_layer_ids": capture, "mask_token_id": vocab - 1, "shift_label": shift, "seed": seed},
        "head": {"gru_hidden_dim": 16, "rank": 8, "pure_prefix_len": ppl, "seed": seed},
        "device": device,
    }
    recipe = parse_recipe(data)
    target = load_target(recipe.target, device=device)
    adapter, _ = dflash.build(recipe.drafter, target)
    head = build_head(recipe, adapter)
    randomize_head(head, seed, head_scale)  # W2 != 0: the head really changes the drafts
    return target, adapter, head.to(device)


class Oracle:
    """The real adapter, with base logits nudged toward the target's known continuation (with
    probability `hit` per slot). With `vocab` given, a missed slot is pushed toward a wrong
    token instead of left alone, so rejections happen whatever the random drafter proposes."""

    def __init__(self, inner, reference: list[int], hit: float, seed: int, boost: float = 30.0,
                 vocab: int | None = None):
        self.inner, self.reference, self.hit, self.boost, self.vocab = inner, reference, hit, boost, vocab
        self.rng = random.Random(seed)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, anchor, position):
        return self.nudge(self.inner.propose(anchor, position), position)

    def static_drafter(self, max_len):
        """The inner adapter's fast path, nudged the same way (so both caches see the same drafts)."""
        fast = self.inner.static_drafter(max_len)
        return None if fast is None else _Nudged(fast, self)

    def nudge(self, block, position):
        base = block.base_logits.clone()
        for j in range(base.shape[1]):
            at = position + 1 + j
            if at >= len(self.reference):
                continue
            right = self.reference[at]
            if self.rng.random() < self.hit:
                base[:, j, right] += self.boost
            elif self.vocab is not None:
                base[:, j, (right + 1 + self.rng.randrange(5)) % (self.vocab - 1)] += self.boost
        return DraftBlock(block.hidden, base)


class _Nudged:
    """A static drafter whose proposals an Oracle nudges."""

    def __init__(self, fast, oracle):
        self.fast, self.oracle = fast, oracle

    def __getattr__(self, name):
        return getattr(self.fast, name)

    def propose(self, anchor, position):
        return self.oracle.nudge(self.fast.propose(anchor, position), position)


def chunk_ends(result) -> list[int]:
    """Output lengths at which each emitted chunk ended (prefill token, then one chunk per step)."""
    ends, n = [1], 1
    for a in result.accepted:
        n += a + 1
        ends.append(n)
    return ends


def variant(seed: int) -> dict:
    rng = random.Random(1000 + seed)
    return dict(
        arch=rng.choice(["qwen3", "qwen3", "llama", "gemma3"]),
        vocab=rng.choice([37, 61, 97]),
        tie=rng.random() < 0.25,
        layers=rng.choice([2, 3]),
        block_size=rng.choice([2, 3, 4, 6, 8]),
        shift=rng.random() < 0.5,
        ppl=rng.choice([0, 1]),
        draft_layers=rng.choice([1, 2]),
    )


@pytest.mark.parametrize("seed", range(24))
def test_greedy_speculative_equals_target(seed):
    cfg = variant(seed)
    target, adapter, head = build(seed, **cfg)
    k = adapter.num_slots
    engine = Engine(target, adapter, head, stop_ids=stop_token_ids(target))
    rng = random.Random(seed)
    # gemma3's random config has a 64-token sliding window: some prompts cross it, so
    # rollbacks must work past the window
    plen = rng.choice([3, 7, 12, 70]) if cfg["arch"] == "gemma3" else rng.choice([1, 3, 7, 12])
    prompt = [rng.randrange(2, cfg["vocab"] - 1) for _ in range(plen)]
    budget = 24
    ref = engine.target_only(prompt, max_new_tokens=budget)
    where = f"seed {seed} {cfg} K={k}"

    for use_head in (True, False):
        out = engine.speculative(prompt, max_new_tokens=budget, use_head=use_head)
        assert out.tokens == ref.tokens, f"{where} use_head={use_head}"
        assert out.stop_reason == ref.stop_reason

    # oracle drafts: partial and full acceptance, rollbacks after long accepted runs
    full = prompt + ref.tokens
    for hit in (0.6, 1.0):
        oracle = Engine(target, Oracle(adapter, full, hit, seed), head, stop_ids=stop_token_ids(target))
        out = oracle.speculative(prompt, max_new_tokens=budget)
        assert out.tokens == ref.tokens, f"{where} oracle hit={hit}"

    # a stop token first emitted in the middle of a fully accepted block
    oracle = Engine(target, Oracle(adapter, full, 1.0, seed), head, stop_ids=stop_token_ids(target))
    firsts = {}
    for i, t in enumerate(ref.tokens):
        firsts.setdefault(t, i)
    mid = [(i, t) for t, i in firsts.items() if i >= 1 and i % (k + 1) != 0]
    if mid:
        i, stop = rng.choice(mid)
        want = engine.target_only(prompt, max_new_tokens=budget, stop_ids=[stop])
        assert want.tokens == ref.tokens[: i + 1] and want.stop_reason == "stop"
        got = oracle.speculative(prompt, max_new_tokens=budget, stop_ids=[stop])
        assert got.tokens == want.tokens and got.stop_reason == "stop", f"{where} stop {stop} at {i}"

    # max_new_tokens reached in the middle of a block
    for m in sorted(rng.sample(range(1, len(ref.tokens) + 1), min(3, len(ref.tokens)))):
        want = engine.target_only(prompt, max_new_tokens=m)
        got = oracle.speculative(prompt, max_new_tokens=m)
        assert got.tokens == want.tokens and len(got.tokens) <= m, f"{where} max_new_tokens={m}"


TINY_RECIPES = sorted(p.name for p in (REPO / "recipes").glob("tiny_*.yaml"))


@pytest.mark.parametrize("name", TINY_RECIPES)
def test_every_shipped_family_decodes_losslessly(name):
    """The engine serves ANY chain adapter: each shipped tiny recipe (one per drafter
    family), with an untied target (varied outputs) and a randomized head."""
    from domino_graft.recipe import apply_overrides, load_recipe_text
    from domino_graft.registry import get_family

    _, data = load_recipe_text(REPO / "recipes" / name)
    data = apply_overrides(data, ["target.random.tie_word_embeddings=false", "device=cpu"])
    recipe = parse_recipe(data, base_dir=str(REPO / "recipes"))
    target = load_target(recipe.target)
    adapter, _ = get_family(recipe.drafter.family).build(recipe.drafter, target)
    if adapter.topology != "chain":
        pytest.skip(f"{name}: {adapter.topology} verification is not implemented")
    head = build_head(recipe, adapter)
    randomize_head(head, 0)
    prompt = [5, 9, 2, 14, 3]
    ref = Engine(target, stop_ids=stop_token_ids(target)).target_only(prompt, max_new_tokens=20)
    for inner in (adapter, Oracle(adapter, prompt + ref.tokens, 0.7, 0)):
        engine = Engine(target, inner, head, stop_ids=stop_token_ids(target))
        for use_head in (True, False):
            assert engine.speculative(prompt, max_new_tokens=20, use_head=use_head).tokens == ref.tokens, (
                f"{name} use_head={use_head} oracle={inner is not adapter}"
            )


def test_oracle_harness_reaches_the_hard_paths():
    """The property test above must exercise partial acceptance, full blocks, and stops /
    max_new_tokens inside a block; check that it does on one fixed variant."""
    target, adapter, head = build(7, block_size=6, ppl=1, shift=True)
    k = adapter.num_slots
    prompt = [5, 9, 13, 4]
    engine = Engine(target, adapter, head)
    ref = engine.target_only(prompt, max_new_tokens=40)
    assert len(set(ref.tokens)) > 5, "the random target should not just repeat one token"
    full = prompt + ref.tokens

    partial = Engine(target, Oracle(adapter, full, 0.6, 0), head).speculative(prompt, max_new_tokens=40)
    assert partial.tokens == ref.tokens
    assert any(0 < a < k for a in partial.accepted), partial.accepted

    perfect = Engine(target, Oracle(adapter, full, 1.0, 0), head)
    res = perfect.speculative(prompt, max_new_tokens=40)
    # every block fully accepted (the last one may run past the known reference)
    assert res.tokens == ref.tokens and set(res.accepted[:-1]) == {k}, res.accepted

    # per-slot statistics: every accepted draft counted once, every step reaches slot 1
    for r in (partial, res):
        assert sum(r.slot_accepted) == sum(r.accepted) and r.slot_reached[0] == len(r.accepted)
        assert all(r.slot_accepted[j] <= r.slot_reached[j] for j in range(k))
        assert r.slot_reached[1:] == r.slot_accepted[:-1]  # slot j+1 is reached iff slot j was accepted
    assert res.slot_accepted[: k] == res.slot_reached[: k] or res.accepted[-1] < k

    m = 1 + (k + 1) + 2  # two tokens into the third chunk (chunk ends: 1, k+2, 2k+3, ...)
    assert m not in chunk_ends(res)
    cut = perfect.speculative(prompt, max_new_tokens=m)
    assert cut.tokens == ref.tokens[:m] and cut.stop_reason == "length"


class Recorder:
    """The real adapter, recording what the engine lets it observe."""

    def __init__(self, inner):
        self.inner, self.seen = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def observe(self, features, positions, **kw):
        self.seen.append((features.clone(), positions.clone()))
        self.inner.observe(features, positions, **kw)


def test_drafter_observes_exactly_the_verified_context():
    """After decoding, the drafter must have seen each verified position once, in order, with
    the features a single uncached target forward over the final sequence gives (the anchor
    itself is never observed before it is verified). Greedy equality cannot catch a
    mistake here: it only costs acceptance."""
    target, adapter, head = build(9, block_size=5)
    prompt = [7, 3, 11, 20, 2]
    ref = Engine(target).target_only(prompt, max_new_tokens=30)
    rec = Recorder(Oracle(adapter, prompt + ref.tokens, 0.6, 1))
    out = Engine(target, rec, head).speculative(prompt, max_new_tokens=30)
    assert out.tokens == ref.tokens and any(0 < a < adapter.num_slots for a in out.accepted)
    feats = torch.cat([f for f, _ in rec.seen], 1)
    pos = torch.cat([p for _, p in rec.seen])
    seq = torch.tensor([prompt + out.tokens])
    with torch.inference_mode():
        _, want = target(seq, capture=adapter.capture_layers())
    assert torch.equal(pos, torch.arange(pos.numel()))
    # the last step's tokens are emitted, never observed: decoding ended there
    assert len(prompt) < pos.numel() < seq.shape[1]
    torch.testing.assert_close(feats, want[:, : pos.numel()], atol=1e-5, rtol=1e-4)


def test_target_only_matches_uncached_recompute():
    """The baseline itself is right: cached decoding == full recompute at every step."""
    target, _, _ = build(3, arch="llama")
    engine = Engine(target)
    prompt = [4, 8, 15, 16, 23]
    out = engine.target_only(prompt, max_new_tokens=12)
    ids = torch.tensor([prompt])
    want = []
    with torch.inference_mode():
        for _ in range(12):
            logits, _ = target(ids)
            nxt = logits[:, -1].argmax(-1)
            want.append(int(nxt))
            ids = torch.cat([ids, nxt[:, None]], 1)
    assert out.tokens == want


@pytest.mark.parametrize("shift,ppl,block_size", [(True, 1, 8), (False, 0, 4), (True, 0, 3), (False, 1, 6)])
def test_incremental_rollout_matches_teacher_forced_block(shift, ppl, block_size):
    target, adapter, head = build(11, block_size=block_size, shift=shift, ppl=ppl, head_scale=1.0)
    k = adapter.num_slots
    prompt = torch.tensor([[3, 14, 15, 9, 26, 5]])
    n = prompt.shape[1]
    with torch.inference_mode():
        _, feats = target(prompt, capture=adapter.capture_layers())
        adapter.reset(1)
        adapter.observe(feats, torch.arange(n))
        anchors = torch.tensor([7, 22, 40])  # three rows: the rollout is batched
        blocks = [adapter.propose(a.view(1), n) for a in anchors]
        block = DraftBlock(torch.cat([b.hidden for b in blocks]), torch.cat([b.base_logits for b in blocks]))

        def teacher_forced(drafts):
            prev = torch.cat([anchors[:, None], drafts[:, :-1]], 1)  # E(x_0), E(d_1) .. E(d_{K-1})
            return head.block(block.hidden, block.base_logits, adapter.embed(prev))

        drafts, q = rollout(head, block, anchors, adapter.embed, temperature=0.0)
        assert q is None
        final = teacher_forced(drafts)
        assert torch.equal(drafts, final.argmax(-1))
        base_drafts, _ = rollout(head, block, anchors, adapter.embed, temperature=0.0, use_head=False)
        assert torch.equal(base_drafts, block.base_logits.argmax(-1))
        # slots within the pure prefix are the plain base proposal (d_1 = argmax base_1 when ppl=1)
        assert torch.equal(drafts[:, :ppl], base_drafts[:, :ppl])
        assert not torch.equal(drafts, base_drafts), "head had no effect: the comparison would be vacuous"

        g = torch.Generator().manual_seed(0)
        for temperature, top_k, top_p in ((1.0, 0, 1.0), (0.7, 5, 0.9)):
            drafts, q = rollout(head, block, anchors, adapter.embed, temperature=temperature, top_k=top_k,
                                top_p=top_p, generator=g)
            want = warp(teacher_forced(drafts), temperature, top_k, top_p)
            torch.testing.assert_close(q, want, atol=1e-6, rtol=1e-5)
            assert bool((q.gather(-1, drafts[..., None]) > 0).all()), "a draft outside q's support"
    assert drafts.shape == (3, k)


def test_rollout_registry():
    assert get_rollout("torch") is rollout
    with pytest.raises(ValueError, match=r"--rollout: 'nope' .*valid: torch"):
        get_rollout("nope")


def test_kernel_rollout_is_a_drop_in():
    """Names beyond "torch" come from domino_graft.kernels; on this CPU they fall back to a
    PyTorch path with the same semantics, and must keep decoding lossless."""
    if "triton" not in rollout_names():
        pytest.skip("domino_graft.kernels provides no 'triton' rollout")
    target, adapter, head = build(12, block_size=5)
    prompt = [4, 9, 16, 25]
    ref = Engine(target).target_only(prompt, max_new_tokens=20)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "falling back to PyTorch" on CPU
        engine = Engine(target, Oracle(adapter, prompt + ref.tokens, 0.7, 0), head, rollout="triton")
        assert engine.speculative(prompt, max_new_tokens=20).tokens == ref.tokens


def test_recipe_kernel_choice_reaches_the_rollout():
    """bench.head_kernel / pool_size / pool_select pick and configure the rollout; --rollout overrides the name."""
    if "triton_pool" not in rollout_names():
        pytest.skip("domino_graft.kernels provides no 'triton_pool' rollout")
    from domino_graft.decoding import rollout_choice
    from domino_graft.recipe import Bench

    section = Bench(head_kernel="triton_pool", pool_size=64, pool_select="bucket")
    choice = rollout_choice(section)
    assert choice == {"name": "triton_pool", "pool_size": 64, "pool_select": "bucket"}
    assert rollout_choice(section, "torch") == {"name": "torch"}
    assert rollout_choice(Bench()) == {"name": "torch"}
    with pytest.raises(ValueError, match=r"--rollout: 'nope' .*valid: torch"):
        rollout_choice(section, "nope")
    _, _, head = build(3)
    built = get_rollout(choice["name"], head, pool_size=choice["pool_size"], pool_select=choice["pool_select"])
    assert (built.pool_size, built.config.pool_select) == (64, "bucket")


def test_first_divergence_measures_the_targets_top2_gap():
    from domino_graft.decoding.divergence import first_divergence

    target, _, _ = build(4)
    prompt = [3, 7, 11]
    ref = Engine(target).target_only(prompt, max_new_tokens=8).tokens
    assert first_divergence(target, prompt, ref, ref) is None
    wrong = ref[:3] + [(ref[3] + 1) % 50] + ref[4:]
    div = first_divergence(target, prompt, ref, wrong)
    with torch.no_grad():  # the gap at position 3, recomputed independently from one forward
        logits, _ = target.forward(torch.tensor([prompt + ref[:3]]))
    top = torch.topk(logits[0, -1].float(), 2).values
    assert div["first_diff"] == 3 and div["target_token"] == ref[3] and div["spec_token"] == wrong[3]
    assert div["target_top2_gap"] == pytest.approx(float(top[0] - top[1]), abs=1e-5)
    assert div["near_tie"] == (div["target_top2_gap"] <= 1e-3)
    short = first_divergence(target, prompt, ref, ref[:5])  # stopped early: a length-only difference
    assert short["first_diff"] == 5 and short["spec_token"] is None


def test_engine_edges():
    target, adapter, head = build(5)
    engine = Engine(target, adapter, head)
    one = engine.speculative([3, 4], max_new_tokens=1)
    assert len(one.tokens) == 1 and one.target_forwards == 1 and one.tau is None
    assert one.tokens == engine.target_only([3, 4], max_new_tokens=1).tokens
    first = one.tokens[0]
    stopped = engine.speculative([3, 4], max_new_tokens=10, stop_ids=[first])
    assert stopped.tokens == [first] and stopped.stop_reason == "stop"
    streamed = []
    res = engine.speculative([3, 4], max_new_tokens=9, on_tokens=streamed.extend)
    assert streamed == res.tokens
    with pytest.raises(ValueError, match="--max-new-tokens: 0"):
        engine.speculative([3], max_new_tokens=0)
    with pytest.raises(ValueError, match="empty"):
        engine.target_only([], max_new_tokens=3)
    with pytest.raises(ValueError, match=r"outside the target vocabulary; valid: 0\.\.60"):
        engine.speculative([3, 61], max_new_tokens=3)
    with pytest.raises(ValueError, match="--top-p"):
        Sampling(temperature=1.0, top_p=0.0)


# ------------------------------------------------------------------------- CLI
def run_command(name: str, argv: list[str]) -> int:
    """Drive one command module the way cli.main does, without importing every other command."""
    from domino_graft.cli import COMMANDS
    from domino_graft.errors import run_with_clean_errors

    module = importlib.import_module(COMMANDS[name][0])
    parser = argparse.ArgumentParser(prog=f"domino-graft {name}")
    module.add_arguments(parser)
    return run_with_clean_errors(module.run, parser.parse_args(argv))


BENCH_KEYS = {
    "tau", "per_slot_acceptance", "tokens_per_s", "target_tokens_per_s", "speedup", "base", "identical_to_target",
    "temperature", "num_prompts", "hardware", "versions", "run", "recipe", "max_new_tokens",
}


def test_bench_greedy_is_identical(tiny_run, tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = run_command("bench", [str(tiny_run), "--temperature", "0", "--max-new-tokens", "16", "--limit", "4",
                               "--json", str(out)])
    assert rc == 0
    rep = json.loads(out.read_text())
    assert BENCH_KEYS <= set(rep)
    assert rep["identical_to_target"] is True and rep["base"]["identical_to_target"] is True
    assert rep["tau"] >= 1 and rep["base"]["tau"] >= 1
    assert set(rep["base"]) == {"tau", "per_slot_acceptance", "tokens_per_s", "speedup", "identical_to_target"}
    assert len(rep["per_slot_acceptance"]) == 7 and rep["num_prompts"] == 4 and rep["max_new_tokens"] == 16
    assert rep["target_tokens_per_s"] > 0 and rep["speedup"] > 0
    assert rep["recipe"]["name"] == "tiny_dflash" and rep["run"]["target"]["kind"] == "random"
    text = capsys.readouterr().out
    assert "target alone" in text and "domino drafter" in text and "acceptance by slot" in text


def test_bench_flags_tau_collapse_against_the_training_estimate(tiny_run, tmp_path, capsys):
    """Training said the drafter predicts well, decoding says tau ~ 1: bench must say so loudly."""
    from domino_graft.benchmark import tau_collapsed, training_tau_estimate

    assert tau_collapsed(1.05, 3.0) and not tau_collapsed(1.6, 3.0) and not tau_collapsed(1.0, 1.3)
    assert not tau_collapsed(None, 3.0) and training_tau_estimate({}) == {}
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    out = tmp_path / "bench.json"
    args = [str(run), "--temperature", "0", "--max-new-tokens", "12", "--limit", "2", "--json", str(out)]
    assert run_command("bench", args) == 0
    healthy = json.loads(out.read_text())  # never trained: nothing to compare against
    assert healthy["training_tau_estimate"] == {} and healthy["tau_collapse"] == {}
    # claim a training estimate whose gain over 1 is 5x (+1) what decoding achieves: a collapse
    claim = {"tau_final": 2.0 + 5 * (healthy["tau"] - 1), "tau_base": 2.0 + 5 * (healthy["base"]["tau"] - 1)}
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["training"] = {"final_metrics": claim}
    (run / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    assert run_command("bench", args) == 1  # its own earlier report is kept unless --force
    assert "--force" in capsys.readouterr().err
    assert run_command("bench", args + ["--force"]) == 0
    rep = json.loads(out.read_text())
    assert rep["training_tau_estimate"] == claim
    assert rep["tau_collapse"] == {"domino": True, "base": True}
    assert "WARNING: tau collapse (domino)" in capsys.readouterr().out


def test_bench_sampling_and_prompt_file(tiny_run, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt_ids": [5, 6, 7, 8]}\n\n{"prompt": "byte fallback"}\n')
    out = tmp_path / "bench.json"
    rc = run_command("bench", [str(tiny_run), "--prompts", str(prompts), "--temperature", "1", "--seed", "3",
                               "--max-new-tokens", "12", "--json", str(out)])
    assert rc == 0
    rep = json.loads(out.read_text())
    assert rep["num_prompts"] == 2 and rep["temperature"] == 1.0
    assert rep["tau"] >= 1 and rep["identical_to_target"] is None and rep["base"]["identical_to_target"] is None
    assert any("temperature > 0" in n for n in rep["notes"])


def test_bench_errors_name_the_flag(tiny_run, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt key"}\n')
    assert run_command("bench", [str(tiny_run), "--prompts", str(bad)]) == 1
    assert "--prompts" in capsys.readouterr().err
    assert run_command("bench", [str(tiny_run), "--temperature", "-1"]) == 1
    assert "--temperature: -1.0 is invalid" in capsys.readouterr().err
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert run_command("bench", [str(tiny_run), "--plot", str(tmp_path / "a.png")]) == 1
        assert "--plot: matplotlib is not installed" in capsys.readouterr().err


def test_generate_streams_ids_and_reports_tau(tiny_run, capsys):
    rc = run_command("generate", [str(tiny_run), "--prompt-ids", "5,6,7,8", "--max-new-tokens", "9"])
    assert rc == 0
    cap = capsys.readouterr()
    ids = [int(x) for x in cap.out.split()]
    assert 1 <= len(ids) <= 9
    assert "tau " in cap.err and "target forwards" in cap.err
    rc = run_command("generate", [str(tiny_run), "--prompt-ids", "5,6,7,8", "--max-new-tokens", "9", "--target-only"])
    assert rc == 0
    assert [int(x) for x in capsys.readouterr().out.split()] == ids
