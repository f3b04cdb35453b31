"""The hf bundle decodes speculatively by itself: `DominoDraftModel.spec_generate` (issue #28 item 4).

A tiny DFlash run with a randomised head is exported with `--format hf`, loaded through
`AutoModel.from_pretrained(..., trust_remote_code=True)` and run against the run's target
saved to disk as a plain transformers model:

* greedy: token for token `target.generate(do_sample=False)`, with the reference rollout, with
  an oracle drafter (long accepted runs: the cache crop and the bonus token), and with the
  shipped Triton kernels in Triton's interpreter;
* T > 0: a fixed seed reproduces; the joint distribution of the first two new tokens on a
  8-token vocabulary matches the target's exact one by a chi-square test (ALPHA = 1e-3, cells
  with expected count < 5 pooled), and the same test rejects a verifier given the wrong q (the
  base drafter's distribution while the drafts come from the Domino-corrected one).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from domino_graft.adapters.dflash import bundle as dflash_bundle
from domino_graft.apply import apply_recipe
from domino_graft.artifacts.tensors import load_tensors, save_tensors
from domino_graft.export.run import export_run
from domino_graft.head import DominoHead
from domino_graft.loading import load_run
from tests.conftest import randomize_head

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "recipes" / "tiny_dflash.yaml"
ALPHA = 1e-3
SMALL_VOCAB = 8  # the schema's smallest: 64 cells for the first two tokens


def _export(root: Path, name: str, overrides: list[str], head_scale: float) -> tuple[Path, Path]:
    run = root / name
    apply_recipe(str(TINY), str(run), overrides=overrides, echo=lambda *_: None)
    head = DominoHead(load_run(run).head.spec)
    head.load_state_dict(load_tensors(run / "head.safetensors"))
    randomize_head(head, seed=1, scale=head_scale)
    save_tensors(run / "head.safetensors", head.state_dict())
    bundle = export_run(str(run), str(root / f"{name}-hf"), format="hf", dtype="fp32", device="cpu",
                           echo=lambda *_: None)
    target_dir = root / f"{name}-target"
    load_run(run).target.model.save_pretrained(str(target_dir))
    return bundle, target_dir


def _load(bundle: Path, target_dir: Path):
    import transformers

    model = transformers.AutoModel.from_pretrained(str(bundle), trust_remote_code=True, local_files_only=True,
                                                   dtype=torch.float32).eval()
    target = transformers.AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    return model, target


def _rollout_module(model):
    """The bundle's rollout_domino module, as transformers imported it."""
    return importlib.import_module(type(model).__module__.rsplit(".", 1)[0] + ".rollout_domino")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    bundle, target_dir = _export(tmp_path_factory.mktemp("hfspec"), "tiny", [], head_scale=2.0)
    return (bundle, *_load(bundle, target_dir), target_dir)


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    over = [f"target.random.vocab_size={SMALL_VOCAB}", f"drafter.mask_token_id={SMALL_VOCAB - 1}",
            "drafter.block_size=4"]
    bundle, target_dir = _export(tmp_path_factory.mktemp("hfspec13"), "v13", over, head_scale=3.0)
    model, target = _load(bundle, target_dir)
    target.generation_config.eos_token_id = None  # every sample has two new tokens (no early stop)
    return model, target


PROMPTS = ([5], [3, 17, 42, 8, 60], [11, 2, 90, 33, 33, 7, 64, 21, 50, 4, 9, 77])


def _generate(target, prompt, n):
    ids = torch.tensor([prompt])
    return target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)


# ------------------------------------------------------------------------ the bundle's files
def test_bundle_ships_rollout_and_triton_kernels(tiny):
    bundle = tiny[0]
    names = {p.name for p in bundle.iterdir()}
    assert set(dflash_bundle.hf_shipped_files()) <= names
    shipped = (bundle / "triton_rollout_domino.py").read_bytes()
    assert shipped == (REPO / "kernels" / "head" / "triton_rollout.py").read_bytes()  # the project's kernels, verbatim
    code = (bundle / "rollout_domino.py").read_text()
    imports = re.findall(r"^\s*(?:from|import)\s+([\w.]+)", code, re.M)
    assert {i.split(".")[0] for i in imports} <= {"__future__", "typing", "torch", "transformers", ""}
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert "triton_rollout_domino.py" in manifest["files"] and manifest["engines"]["hf"]["passed"]


# ------------------------------------------------------------------------------------ greedy
def test_greedy_equals_target_generate(tiny):
    _, model, target, _ = tiny
    for prompt in PROMPTS:
        want = _generate(target, prompt, 20)
        got, stats = model.spec_generate(target, torch.tensor([prompt]), 20, return_stats=True)
        assert torch.equal(got, want), (prompt, got.tolist(), want.tolist())
        assert stats["rollout"] == "torch" and stats["steps"] >= 1


def test_head_changes_the_drafts(tiny):
    """The randomised head matters: with W2 zeroed the rollout proposes other tokens."""
    _, model, target, _ = tiny
    ro = _rollout_module(model)
    embed = target.get_input_embeddings()
    torch.manual_seed(0)
    hidden = torch.randn(4, model.num_proposals, model.config.hidden_size)
    base = ro.target_logits(target, hidden)
    anchor = torch.tensor([3, 17, 42, 8])
    with_head = ro.reference_rollout(model, hidden, base, anchor, embed)[0]
    assert torch.equal(with_head[:, 0], base[:, 0].argmax(-1))  # slot 1 is the pure prefix
    w2 = model.embed_proj[2].weight
    saved = w2.detach().clone()
    with torch.no_grad():
        w2.zero_()
    try:
        plain = ro.reference_rollout(model, hidden, base, anchor, embed)[0]
    finally:
        with torch.no_grad():
            w2.copy_(saved)
    assert torch.equal(plain, base.argmax(-1)) and not torch.equal(plain, with_head)


def test_greedy_with_an_oracle_drafter_accepts_long_runs(tiny, monkeypatch):
    """Drafts that are the target's own continuation (wrong after a few slots): many tokens per
    step, the cache cropped mid-block, and still exactly `generate`'s output."""
    _, model, target, _ = tiny
    ro = _rollout_module(model)
    prompt, n = list(PROMPTS[1]), 24
    want = _generate(target, prompt, n + model.num_proposals + 1)[0].tolist()
    calls = []

    def oracle(model_, hidden, base, anchor, embed, **kw):
        # the anchor sits at len(prompt) + emitted - 1; propose the true next tokens, spoil slot 5
        start = len(prompt) + sum(calls)
        draft = torch.tensor([want[start:start + hidden.shape[1]]])
        if len(calls) % 2:
            draft[0, 4:] = (draft[0, 4:] + 1) % model.config.vocab_size
        calls.append(0)
        return draft, None

    real_accept = ro.accept_greedy

    def counting(draft, logits):
        out = real_accept(draft, logits)
        calls[-1] = len(out)
        return out

    monkeypatch.setattr(ro, "reference_rollout", oracle)
    monkeypatch.setattr(ro, "accept_greedy", counting)
    got, stats = model.spec_generate(target, torch.tensor([prompt]), n, return_stats=True)
    assert got[0].tolist() == want[: len(prompt) + n]
    assert stats["tau"] > 4 and max(calls) == model.num_proposals + 1 and 5 in calls


FUSED_SCRIPT = r"""
import sys, torch, transformers
bundle, target_dir = sys.argv[1:3]
model = transformers.AutoModel.from_pretrained(bundle, trust_remote_code=True, local_files_only=True,
                                               dtype=torch.float32).eval()
target = transformers.AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
ro = sys.modules[type(model).__module__.rsplit(".", 1)[0] + ".rollout_domino"]
assert ro.triton_unavailable_reason(torch.device("cpu")) is None
embed = target.get_input_embeddings()
g = torch.Generator().manual_seed(0)
hidden = torch.randn(3, model.num_proposals, model.config.hidden_size, generator=g)
base = ro.target_logits(target, hidden)
anchor = torch.tensor([3, 17, 42])
want = ro.reference_rollout(model, hidden, base, anchor, embed)[0]
got = ro.FusedGreedyRollout(model, embed.weight)(hidden, base, anchor)
assert torch.equal(got, want), (got, want)
# in bf16 the fused path accumulates in fp32 and may break near-ties the eager path rounds:
# there the reference is the project's own fused rollout (kernels/head/domino_rollout.py), token for token
import copy
from domino_graft.adapters.base import DraftBlock
from domino_graft.head import DominoHead, HeadSpec
from domino_graft.kernels import make_rollout
low = copy.deepcopy(model).to(torch.bfloat16)
emb16 = copy.deepcopy(embed).to(torch.bfloat16)
spec = HeadSpec(hidden_dim=low.config.hidden_size, emb_dim=low.config.hidden_size, vocab_size=low.config.vocab_size,
                gru_hidden_dim=low.prefix_gru.hidden_size, rank=low.embed_proj[0].out_features,
                pure_prefix_len=low.pure_draft_prefix_len)
head = DominoHead(spec).to(torch.bfloat16)
head.load_state_dict({k: v for k, v in low.state_dict().items() if k.startswith(("prefix_gru.", "embed_proj."))})
h16, b16 = hidden.to(torch.bfloat16), base.to(torch.bfloat16)
project = make_rollout("triton", head, emb16.weight, cuda_graphs=False)(head, DraftBlock(h16, b16), anchor, emb16)[0]
assert torch.equal(ro.FusedGreedyRollout(low, emb16.weight)(h16, b16, anchor), project)
ids = torch.tensor([[3, 17, 42, 8, 60]])
out, stats = model.spec_generate(target, ids, 6, rollout="triton", return_stats=True)
ref = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False)
assert stats["rollout"] == "triton" and torch.equal(out, ref), (out, ref)
print("FUSED-OK", stats)
"""


def test_greedy_fused_kernels_in_the_interpreter(tiny):
    """The shipped Triton kernels (Triton's interpreter on the CPU: TRITON_INTERPRET must be set
    before triton is imported, hence a fresh interpreter) draft what the reference drafts, and
    spec_generate through them is still `generate`'s output."""
    pytest.importorskip("triton")
    bundle, target_dir = tiny[0], tiny[3]
    env = {**os.environ, "TRITON_INTERPRET": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", FUSED_SCRIPT, str(bundle), str(target_dir)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "FUSED-OK" in proc.stdout, proc.stderr[-3000:]


def test_rollout_triton_refuses_without_the_interpreter(tiny):
    pytest.importorskip("triton")
    _, model, target, _ = tiny
    ro = _rollout_module(model)
    reason = ro.triton_unavailable_reason(torch.device("cpu"))
    if reason is None:  # triton was imported under TRITON_INTERPRET=1 (tests/kernels does that)
        pytest.skip("the kernels run in the interpreter in this process")
    assert "interpreter" in reason
    with pytest.raises(RuntimeError, match="CPU tensors"):
        model.spec_generate(target, torch.tensor([PROMPTS[0]]), 4, rollout="triton")


# ---------------------------------------------------------------------------------- sampling
def test_sampling_is_reproducible_with_a_seed(tiny):
    _, model, target, _ = tiny
    prompt = torch.tensor([PROMPTS[2]])

    def draw(seed):
        return model.spec_generate(target, prompt, 16, temperature=0.8, top_p=0.9,
                                   generator=torch.Generator().manual_seed(seed))

    a, b = draw(7), draw(7)
    assert torch.equal(a, b) and a.shape == (1, len(PROMPTS[2]) + 16)
    assert any(not torch.equal(a, draw(s)) for s in (8, 9, 10))


@torch.no_grad()
def _target_joint(target, prompt, temperature, top_p, warp):
    """Exact P(t1, t2) of the target's own sampling after `prompt`: [V, V]."""
    v = target.config.vocab_size
    ids = torch.tensor([prompt])
    p1 = warp(target(ids).logits[0, -1], temperature, top_p)
    both = torch.cat([ids.expand(v, -1), torch.arange(v)[:, None]], dim=1)
    p2 = warp(target(both).logits[:, -1], temperature, top_p)
    return p1[:, None] * p2


def test_sampling_matches_the_target_distribution(small_vocab, monkeypatch):
    from tests.decoding.test_sampling import chi_square_pvalue

    model, target = small_vocab
    ro = _rollout_module(model)
    prompt, temperature, top_p = [3, 7, 2, 5, 4], 0.8, 0.95
    joint = _target_joint(target, prompt, temperature, top_p, ro.warp)
    n = 400  # ~15 ms a spec_generate call on the CPU; the wrong q still scores p < 1e-9

    def counts():
        g = torch.Generator().manual_seed(1234)
        c = torch.zeros(SMALL_VOCAB, SMALL_VOCAB)
        for _ in range(n):
            out = model.spec_generate(target, torch.tensor([prompt]), 2, temperature=temperature, top_p=top_p,
                                      generator=g)[0, len(prompt):]
            c[out[0], out[1]] += 1
        return c

    _, p_ok = chi_square_pvalue(counts(), joint)
    assert p_ok > ALPHA, p_ok

    real = ro.reference_rollout

    def wrong_q(model_, hidden, base, anchor, embed, **kw):
        draft, q = real(model_, hidden, base, anchor, embed, **kw)
        return draft, ro.warp(base, kw["temperature"], kw["top_p"])  # the base drafter's q, not the drafts'

    monkeypatch.setattr(ro, "reference_rollout", wrong_q)
    _, p_bad = chi_square_pvalue(counts(), joint)
    assert p_bad < ALPHA, p_bad
