"""Issue #29 follow-up: integer and bool tensors keep their dtype bit for bit (docs/design.md §3).

Only floating-point tensors take a bundle's dtype; P-EAGLE's d2t (int64) and t2d (bool) are stored
as speculators writes them, and the manifest records each tensor's dtype. Strict loading refuses,
on one line naming the file, the tensor, the dtype found and the one expected: an integer tensor
that arrived as a float (even with the checksums re-signed), a float tensor in another dtype than
the manifest's, and a manifest that records a float tensor outside its own dtype.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from domino_graft.cli import main
from tests.conftest import REPO

RECIPE = REPO / "recipes" / "tiny_peagle.yaml"
# offsets above 256: a bf16 cast of d2t would round them
BIG_VOCAB = ["target.random.vocab_size=700", "drafter.mask_token_id=699", "drafter.draft_vocab_size=300"]
WEIGHTS = "drafter/model.safetensors"
GENERATE = ["--prompt-ids", "5 9 12", "--max-new-tokens", "2"]


@pytest.fixture(scope="module")
def bf16_bundle(tmp_path_factory):
    from domino_graft.apply import apply_recipe
    from domino_graft.export.run import export_run

    root = tmp_path_factory.mktemp("exact")
    apply_recipe(str(RECIPE), str(root / "run"), overrides=BIG_VOCAB, echo=lambda *_: None)
    return export_run(str(root / "run"), str(root / "bundle"), dtype="bf16", device="cpu", echo=lambda *_: None)


@pytest.fixture
def bundle(bf16_bundle, tmp_path):
    out = tmp_path / "b"
    shutil.copytree(bf16_bundle, out)
    return out


def rewrite(bundle, name: str, dtype: torch.dtype) -> None:
    """Store one tensor of drafter/model.safetensors in another dtype (the file's metadata kept)."""
    f = bundle / WEIGHTS
    with safe_open(str(f), framework="pt") as fh:
        meta = fh.metadata()
    state = load_file(str(f))
    state[name] = state[name].to(dtype)
    save_file(state, str(f), metadata=meta)


def resign(bundle) -> None:
    """Every checksum and shape of the manifest made to agree with the files again, the recorded
    dtypes left as they were (what a careless converter would do)."""
    from domino_graft.artifacts.files import sha256_file
    from domino_graft.artifacts.tensors import tensor_sha256

    m = json.loads((bundle / "manifest.json").read_text())
    state = load_file(str(bundle / WEIGHTS))
    for name, t in state.items():
        m["tensors"][name]["sha256"] = tensor_sha256(t)
    m["files"][WEIGHTS] = sha256_file(bundle / WEIGHTS)
    (bundle / "manifest.json").write_text(json.dumps(m))


def one_error_line(argv, capsys) -> str:
    capsys.readouterr()
    rc = main(argv)
    _, err = capsys.readouterr()
    assert rc == 1 and "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and err.rstrip().endswith(errors[0]), err
    return errors[0]


def test_the_bundle_keeps_the_maps_in_their_own_dtype(bf16_bundle):
    state = load_file(str(bf16_bundle / WEIGHTS))
    assert state["d2t"].dtype == torch.int64 and int(state["d2t"].max()) > 256
    assert state["t2d"].dtype == torch.bool
    assert {v.dtype for k, v in state.items() if k not in ("d2t", "t2d")} == {torch.bfloat16}
    m = json.loads((bf16_bundle / "manifest.json").read_text())
    assert (m["dtype"], m["tensors"]["d2t"]["dtype"], m["tensors"]["t2d"]["dtype"]) == ("bf16", "int64", "bool")


@pytest.mark.parametrize("name,dtype,found,expected", [
    ("d2t", torch.float32, "fp32", "int64"),   # exact in fp32, but not what the manifest records
    ("d2t", torch.bfloat16, "bf16", "int64"),  # rounded: the bundle's own float dtype
    ("t2d", torch.float32, "fp32", "bool"),
])
@pytest.mark.parametrize("resigned", [False, True])
def test_an_integer_tensor_rewritten_as_float_is_refused(bundle, capsys, name, dtype, found, expected, resigned):
    rewrite(bundle, name, dtype)
    if resigned:
        resign(bundle)
    line = one_error_line(["generate", str(bundle), *GENERATE], capsys)
    assert f"{bundle / WEIGHTS}" in line and f"tensor {name!r} is {found}, expected {expected}" in line, line


def test_a_float_tensor_in_another_dtype_than_the_manifests_is_refused(bundle, capsys):
    rewrite(bundle, "fc.weight", torch.float32)
    resign(bundle)
    line = one_error_line(["bench", str(bundle), "--limit", "1", "--max-new-tokens", "2", "--no-progress"], capsys)
    assert f"{bundle / WEIGHTS}" in line and "tensor 'fc.weight' is fp32, expected bf16" in line, line


def test_a_manifest_recording_a_float_tensor_outside_its_dtype_is_refused(bundle, capsys):
    m = json.loads((bundle / "manifest.json").read_text())
    m["tensors"]["d2t"]["dtype"] = "fp32"  # as an older export recorded it, but in a bf16 bundle
    (bundle / "manifest.json").write_text(json.dumps(m))
    line = one_error_line(["generate", str(bundle), *GENERATE], capsys)
    assert "manifest.json" in line and "tensor 'd2t' is recorded as fp32" in line and "'bf16'" in line, line


def test_a_weight_stored_as_integers_is_refused_even_when_recorded_so(bundle, capsys):
    """The manifest made to agree (dtype, checksums): the family's loader still wants a float weight."""
    rewrite(bundle, "norm.weight", torch.int64)
    m = json.loads((bundle / "manifest.json").read_text())
    m["tensors"]["norm.weight"]["dtype"] = "int64"
    (bundle / "manifest.json").write_text(json.dumps(m))
    resign(bundle)
    line = one_error_line(["generate", str(bundle), *GENERATE], capsys)
    assert f"{bundle / WEIGHTS}" in line and "tensor 'norm.weight' is int64" in line, line


def test_the_strict_loader_reads_the_maps_back_bit_equal(bf16_bundle):
    from domino_graft.loading import load_bundle

    stored = load_file(str(bf16_bundle / WEIGHTS))
    a = load_bundle(bf16_bundle).adapter
    assert a.backbone.d2t.dtype == torch.int64 and torch.equal(a.backbone.d2t, stored["d2t"])
    assert a.backbone.t2d.dtype == torch.bool and torch.equal(a.backbone.t2d, stored["t2d"])


def test_export_refuses_a_family_that_casts_an_integer_tensor(bf16_bundle, tmp_path, monkeypatch):
    """The rule is the core's: a family's bundle_contents that rounds d2t to the export dtype fails
    the export on one line, and nothing is written."""
    from domino_graft.export.run import export_run
    from domino_graft.export.self_check import ExportError
    from domino_graft.registry import get_family

    family = get_family("peagle")
    real = family.bundle_contents

    def casting(adapter, head, *, format, dtype):
        files, configs = real(adapter, head, format=format, dtype=dtype)
        files[WEIGHTS]["d2t"] = files[WEIGHTS]["d2t"].to(torch.bfloat16)
        return files, configs

    monkeypatch.setattr(family, "bundle_contents", casting)
    out = tmp_path / "never"
    with pytest.raises(ExportError) as e:
        export_run(str(bf16_bundle.parent / "run"), str(out), dtype="bf16", device="cpu", echo=lambda *_: None)
    msg = str(e.value)
    assert "\n" not in msg and f"{WEIGHTS}: tensor 'd2t' would be written as bf16, expected int64" in msg, msg
    assert not out.exists() and not list(tmp_path.glob(".never*"))
