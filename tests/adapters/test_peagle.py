"""P-EAGLE family (adapters/peagle/, docs/peagle.md): the speculators 0.9.0 `peagle` layout, the
draft-vocabulary maps d2t/t2d (kept bit for bit, never lost silently), the draft -> target logit
mapping, speculators' training mask, and the layer variants. The conformance kit
(test_conformance.py) runs recipes/tiny_peagle.yaml (llama layer, a 95-of-97 draft vocabulary)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from domino_graft.graft import build_head
from domino_graft.recipe import load_recipe
from domino_graft.registry import get_family
from domino_graft.target import load_target
from tests.conftest import randomize_head

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "tiny_peagle.yaml"


def build(overrides=(), *, head_seed=None):
    recipe = load_recipe(RECIPE, list(overrides))
    target = load_target(recipe.target)
    adapter, found = get_family("peagle").build(recipe.drafter, target)
    head = build_head(recipe, adapter, found)
    if head_seed is not None:
        randomize_head(head, head_seed)
    return recipe, target, adapter, head


def context(target, adapter, length=30, batch=2, seed=0):
    ids = torch.randint(2, 95, (batch, length), generator=torch.Generator().manual_seed(seed))
    _, feats = target(ids, capture=adapter.capture_layers())
    return ids, feats


def propose(adapter, ids, feats, a):
    adapter.reset(ids.shape[0])
    adapter.observe(feats[:, :a], torch.arange(a), ids=ids[:, :a])
    return adapter.propose(ids[:, a], a)


# a 300-of-700 random draft vocabulary: offsets above 256, which bf16 cannot hold exactly
BIG_VOCAB = ["target.random.vocab_size=700", "drafter.mask_token_id=699", "drafter.draft_vocab_size=300"]


def write_maps(tmp_path, vocab=97, draft=40, seed=5):
    """speculators' d2t-N.npy / t2d-N.npy for a random draft vocabulary (offsets far from zero)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.sort(torch.randperm(vocab - 1, generator=g)[:draft])[0]  # never the mask row 96
    d2t, t2d = ids - torch.arange(draft), torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    np.save(tmp_path / f"d2t-{draft}.npy", d2t.numpy())
    np.save(tmp_path / f"t2d-{draft}.npy", t2d.numpy())
    return [f"drafter.draft_vocab_size={draft}", f"drafter.d2t_path={tmp_path / f'd2t-{draft}.npy'}",
            f"drafter.t2d_path={tmp_path / f't2d-{draft}.npy'}"], d2t, t2d


# ------------------------------------------------------------------------------ layout
def test_native_layout_names_and_layer_ids():
    from domino_graft.adapters.peagle.model import from_native

    _, _, adapter, _ = build()
    cfg = adapter.native_config()
    assert cfg["speculators_model_type"] == "peagle" and cfg["architectures"] == ["PEagleSpeculator"]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]  # the recipe's 0-based outputs [0, 1, 2], + 1
    assert cfg["speculators_config"]["algorithm"] == "peagle"
    assert cfg["speculators_config"]["proposal_methods"][0] == {"proposal_type": "greedy", "speculative_tokens": 6}
    assert cfg["draft_vocab_size"] == 95 and cfg["mask_token_id"] == 96 and cfg["embed_requires_grad"] is True
    assert cfg["transformer_layer_config"]["model_type"] == "llama"
    state = adapter.backbone_state_dict()
    assert {"embed_tokens.weight", "fc.weight", "layers.0.hidden_norm.weight", "norm.weight", "lm_head.weight",
            "mask_hidden", "d2t", "t2d"} <= set(state)
    assert state["layers.0.self_attn.q_proj.weight"].shape == (32, 64)  # EAGLE-3's first layer reads [emb; hid]
    assert state["fc.weight"].shape == (32, 96) and state["mask_hidden"].shape == (1, 1, 96)
    assert state["lm_head.weight"].shape == (95, 32)
    assert state["d2t"].dtype == torch.int64 and state["t2d"].dtype == torch.bool
    back = from_native(json.loads(json.dumps(cfg)), "x")
    assert back.target_layer_ids == [0, 1, 2] and back.num_slots == 6 and back.draft_vocab_size == 95


def test_qwen3_layers_and_fc_norms_have_speculators_names():
    _, _, adapter, _ = build(["drafter.layer_type=qwen3", "drafter.fc_norm=true", "drafter.num_layers=2"])
    names = set(adapter.backbone_state_dict())
    assert {"layers.0.self_attn.q_norm.weight", "layers.1.self_attn.k_norm.weight", "fc_norm.0.weight",
            "fc_norm.2.weight"} <= names
    assert "layers.1.hidden_norm.weight" not in names and "input_norm.weight" not in names
    _, _, adapter, _ = build(["drafter.norm_before_fc=true"])
    assert adapter.backbone_state_dict()["input_norm.weight"].shape == (96,)


def test_training_mask_is_speculators_mask_mod():
    """create_peagle_mask_mod (speculators 0.9.0 models/peagle/attention.py), transcribed: entries are
    (anchor_pos, depth) in the shifted sequence; depth-0 entry q has anchor_pos q, the depth-d entry
    of our anchor a has anchor_pos a-1 (its depth-0 entry is (x_a, g_{a-1}))."""
    from domino_graft.adapters.peagle.adapter import training_mask

    c, k = 12, 4
    anchors = torch.tensor([[5, 9, 1]])
    anchor_pos = torch.cat([torch.arange(c), (anchors[0] - 1).repeat_interleave(k - 1)])
    depth = torch.cat([torch.zeros(c, dtype=torch.long), torch.arange(1, k).repeat(anchors.shape[1])])
    q, kv = torch.meshgrid(torch.arange(len(depth)), torch.arange(len(depth)), indexing="ij")
    qa, ka, qd, kd = anchor_pos[q], anchor_pos[kv], depth[q], depth[kv]
    theirs = ((kd == 0) & (qa >= ka)) | ((qa == ka) & (qd >= kd))
    assert torch.equal(training_mask(anchors, c, k)[0], theirs)


# --------------------------------------------------------------------------- vocabulary
def test_base_logits_map_draft_ids_to_target_ids_losslessly(tmp_path):
    """The draft logits sit on their target ids unchanged; everything else is below them, so the
    argmax is P-EAGLE's own draft mapped by d2t, and a lost d2t would show here."""
    maps, d2t, t2d = write_maps(tmp_path)
    _, target, adapter, _ = build(maps)
    assert torch.equal(adapter.backbone.d2t, d2t) and torch.equal(adapter.backbone.t2d, t2d)
    ids, feats = context(target, adapter)
    block = propose(adapter, ids, feats, 17)
    draft = adapter.draft_logits(block.hidden)
    tids = torch.arange(40) + d2t
    assert torch.equal(block.base_logits[..., tids], draft)
    assert torch.equal(block.base_logits.argmax(-1), adapter.draft_to_target(draft.argmax(-1)))
    assert torch.equal(block.base_logits.argmax(-1), tids[draft.argmax(-1)])
    off = block.base_logits[..., ~t2d]
    assert bool((off < draft.min(-1, keepdim=True).values).all())
    assert float(torch.softmax(block.base_logits.detach(), -1)[..., ~t2d].sum(-1).max()) < 1e-9
    # every proposal is a draft-vocabulary id, through the engine too
    from domino_graft.decoding import rollout

    _, _, adapter2, head = build(maps, head_seed=3)
    block = propose(adapter2, ids, feats, 17)
    drafts, _ = rollout(head, block, ids[:, 17], adapter2.embed)
    assert bool(t2d[drafts].all())


def test_a_label_off_the_draft_vocabulary_gives_the_backbone_no_gradient(tmp_path):
    import torch.nn.functional as F

    maps, _, t2d = write_maps(tmp_path)
    _, _, adapter, _ = build(maps)
    hidden = torch.randn(3, 32, requires_grad=True)
    off = torch.nonzero(~t2d).flatten()[:3]
    F.cross_entropy(adapter.base_logits(hidden), off).backward()
    assert float(hidden.grad.abs().max()) < 1e-6
    hidden.grad = None  # a label on it: P-EAGLE's own draft-vocabulary CE (+ a constant)
    on = torch.nonzero(t2d).flatten()[:3]
    F.cross_entropy(adapter.base_logits(hidden), on).backward()
    g_ours = hidden.grad.clone()
    hidden.grad = None
    F.cross_entropy(adapter.draft_logits(hidden), torch.arange(3)).backward()
    torch.testing.assert_close(g_ours, hidden.grad)


def test_round_tripped_bundle_keeps_d2t_and_t2d_bit_equal(tmp_path):
    from safetensors.torch import load_file

    from domino_graft.apply import apply_recipe
    from domino_graft.export.run import export_run
    from domino_graft.loading import load_run, load_run_or_bundle

    maps, d2t, t2d = write_maps(tmp_path)
    run = tmp_path / "run"
    apply_recipe(str(RECIPE), str(run), overrides=maps, echo=lambda *_: None)
    raw = load_file(str(run / "drafter" / "model.safetensors"))  # the run dir keeps speculators' dtypes
    assert raw["d2t"].dtype == torch.int64 and torch.equal(raw["d2t"], d2t) and torch.equal(raw["t2d"], t2d)
    bundle = export_run(str(run), str(tmp_path / "bundle"), dtype="fp32", device="cpu", echo=lambda *_: None)
    cfg = json.loads((bundle / "drafter" / "config.json").read_text())
    assert cfg["speculators_model_type"] == "peagle" and cfg["draft_vocab_size"] == 40
    stored = load_file(str(bundle / "drafter" / "model.safetensors"))  # speculators' dtypes, as the run's
    assert stored["d2t"].dtype == torch.int64 and torch.equal(stored["d2t"], d2t)
    assert stored["t2d"].dtype == torch.bool and torch.equal(stored["t2d"], t2d)
    from domino_graft.export.inspect import inspect_path

    assert "draft 40 of 97 (d2t/t2d maps)" in inspect_path(bundle).format_text()
    loaded = load_run_or_bundle(str(bundle))
    for a in (load_run(run).adapter, loaded.adapter):
        assert a.backbone.d2t.dtype == torch.int64 and torch.equal(a.backbone.d2t, d2t)
        assert a.backbone.t2d.dtype == torch.bool and torch.equal(a.backbone.t2d, t2d)
    ids, feats = context(loaded.target, loaded.adapter)
    b1, b2 = propose(load_run(run).adapter, ids, feats, 17), propose(loaded.adapter, ids, feats, 17)
    assert torch.equal(b1.base_logits, b2.base_logits)


def test_trained_run_and_its_fp32_and_bf16_bundles_keep_the_maps_bit_equal(tmp_path):
    """Only floating-point tensors take the run's / bundle's dtype (docs/design.md §3): d2t and t2d
    stay int64 / bool through training (a trainable backbone rewrites RUN/drafter/; its training
    checkpoints hold them too) and exports in fp32 and bf16, whose strict loads hold the maps bit
    for bit. The offsets exceed 256, so a bf16 cast would round them."""
    from safetensors.torch import load_file

    from domino_graft.apply import apply_recipe
    from domino_graft.export.run import export_run
    from domino_graft.loading import load_bundle, load_run
    from domino_graft.training.loop import train

    run = tmp_path / "run"
    apply_recipe(str(RECIPE), str(run), overrides=BIG_VOCAB, echo=lambda *_: None)
    d2t, t2d = load_run(run).adapter.vocab_maps().values()
    assert int(d2t.max()) > 256 and not torch.equal(d2t.to(torch.bfloat16).long(), d2t)
    quiet = {"progress": False, "echo": lambda *_: None}
    train(str(run), ["train.backbone=full", "train.batch_size=2"], max_steps=2, save_every=1, **quiet)
    for f in ("drafter/model.safetensors", "checkpoints/step-2/model.safetensors"):
        raw = {k.removeprefix("adapter.backbone."): v for k, v in load_file(str(run / f)).items()}
        assert raw["d2t"].dtype == torch.int64 and torch.equal(raw["d2t"], d2t), f
        assert raw["t2d"].dtype == torch.bool and torch.equal(raw["t2d"], t2d), f
    for dtype, torch_dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        bundle = export_run(str(run), str(tmp_path / dtype), dtype=dtype, device="cpu", echo=lambda *_: None)
        stored = load_file(str(bundle / "drafter" / "model.safetensors"))
        assert stored["d2t"].dtype == torch.int64 and torch.equal(stored["d2t"], d2t)
        assert stored["t2d"].dtype == torch.bool and torch.equal(stored["t2d"], t2d)
        assert all(v.dtype == torch_dtype for k, v in stored.items() if k not in ("d2t", "t2d"))
        m = json.loads((bundle / "manifest.json").read_text())
        assert m["dtype"] == dtype and m["tensors"]["d2t"]["dtype"] == "int64" and m["tensors"]["t2d"]["dtype"] == "bool"
        assert {i["dtype"] for k, i in m["tensors"].items() if k not in ("d2t", "t2d")} == {dtype}
        loaded = load_bundle(bundle)
        assert loaded.adapter.backbone.d2t.dtype == torch.int64 and torch.equal(loaded.adapter.backbone.d2t, d2t)
        assert loaded.adapter.backbone.t2d.dtype == torch.bool and torch.equal(loaded.adapter.backbone.t2d, t2d)


def test_a_run_with_vocab_maps_resumes(tmp_path):
    from domino_graft.apply import apply_recipe
    from domino_graft.loading import load_run
    from domino_graft.training.loop import train

    run = tmp_path / "run"
    apply_recipe(str(RECIPE), str(run), overrides=BIG_VOCAB, echo=lambda *_: None)
    d2t, t2d = load_run(run).adapter.vocab_maps().values()
    quiet = {"progress": False, "echo": lambda *_: None}
    train(str(run), ["train.batch_size=2"], max_steps=1, save_every=1, **quiet)
    train(str(run), ["train.batch_size=2"], max_steps=2, resume=True, **quiet)
    a = load_run(run).adapter
    assert a.backbone.d2t.dtype == torch.int64 and torch.equal(a.backbone.d2t, d2t)
    assert a.backbone.t2d.dtype == torch.bool and torch.equal(a.backbone.t2d, t2d)


def test_a_bundle_of_older_exact_fp32_maps_still_loads(tmp_path):
    """Bundles written before integer tensors kept their dtype stored d2t/t2d as exact fp32 (the
    manifest recording fp32): they still verify and load, the maps rebuilt as int64/bool."""
    from safetensors.torch import load_file

    from domino_graft.apply import apply_recipe
    from domino_graft.artifacts.files import sha256_file
    from domino_graft.artifacts.tensors import save_tensors, tensor_sha256
    from domino_graft.export.run import export_run
    from domino_graft.loading import load_bundle

    maps, d2t, t2d = write_maps(tmp_path)
    run = tmp_path / "run"
    apply_recipe(str(RECIPE), str(run), overrides=maps, echo=lambda *_: None)
    bundle = export_run(str(run), str(tmp_path / "bundle"), dtype="fp32", device="cpu", echo=lambda *_: None)
    weights = bundle / "drafter" / "model.safetensors"
    state = load_file(str(weights))
    state["d2t"], state["t2d"] = state["d2t"].float(), state["t2d"].float()  # the old export's cast
    save_tensors(weights, state, {"format": "pt"})
    m = json.loads((bundle / "manifest.json").read_text())
    for name in ("d2t", "t2d"):
        m["tensors"][name].update(dtype="fp32", sha256=tensor_sha256(state[name]))
    m["files"]["drafter/model.safetensors"] = sha256_file(weights)
    (bundle / "manifest.json").write_text(json.dumps(m))
    a = load_bundle(bundle).adapter
    assert a.backbone.d2t.dtype == torch.int64 and torch.equal(a.backbone.d2t, d2t)
    assert a.backbone.t2d.dtype == torch.bool and torch.equal(a.backbone.t2d, t2d)


def _speculators_folder(tmp_path, target, src, *, drop=()):
    """A folder as speculators' save_pretrained writes it: diff-style transformer_layer_config,
    int64 d2t / bool t2d, embed_tokens and lm_head included (minus `drop`)."""
    from domino_graft.artifacts.tensors import save_tensors

    folder = tmp_path / "peagle"
    folder.mkdir(exist_ok=True)
    cfg = src.native_config()
    cfg["transformer_layer_config"] = {k: v for k, v in cfg["transformer_layer_config"].items()
                                       if k not in ("attention_dropout", "hidden_act", "mlp_bias", "rope_parameters")}
    (folder / "config.json").write_text(json.dumps(cfg))
    state = {k: v.contiguous() for k, v in src.backbone_state_dict().items() if k not in drop}
    save_tensors(folder / "model.safetensors", state, {"format": "pt"})
    return folder


def test_imports_a_speculators_checkpoint(tmp_path):
    maps, _, _ = write_maps(tmp_path)
    _, target, src, _ = build(maps + ["drafter.seed=3"])
    folder = _speculators_folder(tmp_path, target, src)
    _, _, imported, _ = build(maps + [f"drafter.path={folder}"])
    ids, feats = context(target, src)
    assert torch.equal(propose(src, ids, feats, 17).base_logits, propose(imported, ids, feats, 17).base_logits)
    # verifier-owned tensors a checkpoint may lack come from the target, as speculators fills them
    folder = _speculators_folder(tmp_path, target, src, drop=("embed_tokens.weight",))
    _, _, filled, _ = build(maps + [f"drafter.path={folder}"])
    torch.testing.assert_close(filled.backbone.embed_tokens.weight, target.model.get_input_embeddings().weight)
    with pytest.raises(ValueError, match="num_slots: 4 conflicts with the checkpoint's 6"):
        build(maps + [f"drafter.path={folder}", "drafter.num_slots=4"])


def test_a_checkpoint_without_d2t_fails_with_one_line_naming_it(tmp_path):
    maps, _, _ = write_maps(tmp_path)
    _, target, src, _ = build(maps)
    folder = _speculators_folder(tmp_path, target, src, drop=("d2t",))
    with pytest.raises(ValueError) as e:
        build(maps + [f"drafter.path={folder}"])
    msg = str(e.value)
    assert "\n" not in msg and "tensor 'd2t' is missing" in msg and "draft_vocab_size 40 < the target vocabulary 97" in msg
    folder = _speculators_folder(tmp_path, target, src, drop=("t2d",))
    with pytest.raises(ValueError, match="tensor 't2d' is missing"):
        build(maps + [f"drafter.path={folder}"])


def test_a_d2t_that_disagrees_with_t2d_is_refused(tmp_path):
    from domino_graft.artifacts.tensors import save_tensors

    maps, _, _ = write_maps(tmp_path)
    _, target, src, _ = build(maps)
    folder = _speculators_folder(tmp_path, target, src)
    state = {k: v.contiguous() for k, v in src.backbone_state_dict().items()}
    state["d2t"] = state["d2t"].clone()
    state["d2t"][3] += 1  # draft id 3 now lands on a target id t2d does not hold (or on draft id 4's)
    save_tensors(folder / "model.safetensors", state, {"format": "pt"})
    with pytest.raises(ValueError, match="tensor 'd2t' maps"):
        build(maps + [f"drafter.path={folder}"])


def test_older_float_maps_are_rebuilt_exactly_from_t2d_or_refused(tmp_path):
    """Older files held the maps as floats, bf16 ones with offsets above 256 rounded. d2t is rebuilt
    from t2d (0/1, exact in any float dtype) and must agree with the stored value at its precision;
    a float d2t of another vocabulary is refused on one line."""
    from domino_graft.artifacts.tensors import save_tensors

    _, target, src, _ = build(BIG_VOCAB)
    folder = _speculators_folder(tmp_path, target, src)
    state = {k: v.contiguous() for k, v in src.backbone_state_dict().items()}
    exact = dict(d2t=state["d2t"].clone(), t2d=state["t2d"].clone())
    state["d2t"], state["t2d"] = state["d2t"].to(torch.bfloat16), state["t2d"].to(torch.bfloat16)
    assert not torch.equal(state["d2t"].long(), exact["d2t"])  # rounded
    save_tensors(folder / "model.safetensors", state, {"format": "pt"})
    _, _, a, _ = build(BIG_VOCAB + [f"drafter.path={folder}"])
    assert a.backbone.d2t.dtype == torch.int64 and torch.equal(a.backbone.d2t, exact["d2t"])
    assert a.backbone.t2d.dtype == torch.bool and torch.equal(a.backbone.t2d, exact["t2d"])
    state["d2t"] = (exact["d2t"] + 1).to(torch.bfloat16)
    save_tensors(folder / "model.safetensors", state, {"format": "pt"})
    with pytest.raises(ValueError) as e:
        build(BIG_VOCAB + [f"drafter.path={folder}"])
    msg = str(e.value)
    assert "\n" not in msg and "tensor 'd2t' (torch.bfloat16) does not match the offsets t2d implies" in msg


# ------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("edit,expected", [
    ({"speculators_model_type": "eagle3"}, "speculators_model_type is 'eagle3' (EAGLE-3 drafts sequentially"),
    ({"draft_vocab_size": 500}, "draft_vocab_size 500 is invalid; valid: an integer in 2..97"),
    ({"mask_token_id": None}, "mask_token_id None is invalid; valid: a token id in 0..96"),
    ({"fc_norm": True, "norm_before_fc": True}, "norm_before_fc and fc_norm are both true"),
    ({"eagle_aux_hidden_state_layer_ids": [0, 2]}, "eagle_aux_hidden_state_layer_ids [0, 2] is invalid"),
])
def test_bad_config_fields_fail_on_one_line(tmp_path, edit, expected):
    from domino_graft.adapters.peagle.model import from_native

    _, _, adapter, _ = build()
    cfg = {**adapter.native_config(), **edit}
    with pytest.raises(ValueError) as e:
        from_native(cfg, "ckpt/config.json")
    assert "\n" not in str(e.value) and str(e.value).startswith("ckpt/config.json: ") and expected in str(e.value)


def test_bad_recipe_values_name_the_field(tmp_path):
    with pytest.raises(Exception, match="d2t_path is given alone"):
        load_recipe(RECIPE, [f"drafter.d2t_path={tmp_path / 'x.npy'}"])
    with pytest.raises(Exception, match="norm_before_fc and fc_norm are both true"):
        load_recipe(RECIPE, ["drafter.fc_norm=true", "drafter.norm_before_fc=true"])
    with pytest.raises(ValueError, match="drafter.mask_token_id: 1 is the target's eos id"):
        build(["drafter.mask_token_id=1"])
    with pytest.raises(ValueError, match="drafter.draft_vocab_size: 120 is more than the target's 97"):
        build(["drafter.draft_vocab_size=120"])
    with pytest.raises(ValueError, match=r"drafter.target_layer_ids: 4 in \[0, 4\] is out of range"):
        build(["drafter.target_layer_ids=[0,4]"])
    np.save(tmp_path / "d2t.npy", np.zeros(10, dtype=np.int64))
    np.save(tmp_path / "t2d.npy", np.ones(97, dtype=bool))
    with pytest.raises(ValueError, match=r"tensor 'd2t' has shape \[10\]; valid: \[95\]"):
        build([f"drafter.d2t_path={tmp_path / 'd2t.npy'}", f"drafter.t2d_path={tmp_path / 't2d.npy'}"])


# ----------------------------------------------------------------------------- variants
VARIANTS = [  # layer type, extra overrides
    ("llama", ["drafter.draft_vocab_size=97"]),
    ("qwen3", ["drafter.norm_before_fc=true", "drafter.norm_before_residual=true", "drafter.num_layers=2"]),
    ("llama", ["drafter.fc_norm=true"]),
]


@pytest.mark.parametrize("ltype,extra", VARIANTS)
def test_training_blocks_match_decoding_blocks(ltype, extra):
    _, target, adapter, _ = build([f"drafter.layer_type={ltype}", *extra])
    k = adapter.num_slots
    ids, feats = context(target, adapter)
    tb = adapter.training_blocks(feats, ids, torch.ones_like(ids), torch.tensor([[17, 5], [17, 9]]))
    adapter.reset(2)
    adapter.observe(feats[:, :9], torch.arange(9), ids=ids[:, :9])
    adapter.propose(ids[:, 9], 9)
    adapter.observe(feats[:, 9:13], torch.arange(9, 13), ids=ids[:, 9:13])  # context in two pieces
    adapter.observe(feats[:, 13:17], torch.arange(13, 17), ids=ids[:, 13:17])
    block = adapter.propose(ids[:, 17], 17)
    torch.testing.assert_close(block.hidden, tb.hidden[[0, 2]], rtol=1e-5, atol=1e-5)
    assert torch.equal(tb.labels[[0, 2]], ids[:, 18:18 + k])


@pytest.mark.parametrize("ltype,extra", VARIANTS)
def test_greedy_decoding_is_lossless(ltype, extra):
    from domino_graft.decoding import Engine

    small = ["target.random.vocab_size=11", "drafter.mask_token_id=10", "drafter.seed=1"]
    extra = [e if "draft_vocab_size" not in e else "drafter.draft_vocab_size=11" for e in extra]
    _, target, adapter, head = build([f"drafter.layer_type={ltype}", "drafter.draft_vocab_size=10", *extra, *small],
                                     head_seed=2)
    engine = Engine(target, adapter, head, stop_ids=[])
    prompt = [3, 5, 7, 2, 4]
    ref = engine.target_only(prompt, max_new_tokens=30)
    for use_head in (True, False):
        out = engine.speculative(prompt, max_new_tokens=30, use_head=use_head)
        assert out.tokens == ref.tokens, use_head
