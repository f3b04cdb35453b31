"""The family contract: everything the core knows about a drafter family, in one object.

A family is one package (under `adapters/` for the built-in ones, or any installed
package registered under the entry-point group `domino_graft.families`) that exposes a
`Family` instance. The core (recipe, graft, training, decoding, export, bench) reaches a
family only through it (`domino_graft.registry`), never by name. docs/adding_a_family.md
walks through writing one.

What a family declares:

* `name` (the recipe's `drafter.family`) and `schema`, its recipe section: a pydantic
  model deriving from `domino_graft.schema.Strict` with `family: Literal[name]`. The schema
  must import without torch (`domino-graft validate` never loads torch), so the package's
  `__init__` imports only the schema and this module; the model code is imported lazily.
* `plan` (a `FamilyPlan` from configs alone) and `build` (the `DrafterAdapter`, see
  adapters/base.py, plus any Domino head tensors found in the drafter's checkpoint).
* Its bundle layout. The default here is the layout for families that no serving engine
  reads a Domino head on yet: the drafter's own checkpoint under `drafter/` (in its
  ecosystem's format) and the head beside it in `head.safetensors`. A family with an engine
  format of its own (DFlash: one model.safetensors the engines load) overrides the
  `bundle_*` methods.

Reserved token ids (a mask or parallel-draft token) are the adapter's
(`DrafterAdapter.reserved_token_ids`), because they may come from a checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Optional

HEAD_FILE = "head.safetensors"  # the Domino head, for layouts whose drafter format has no place for it
DRAFTER_DIR = "drafter"


class Family:
    """Base class of a drafter family. Subclasses set the class attributes (`model_module` names
    the module with `plan` and `build`); the bundle methods have working defaults (drafter/ +
    head file)."""

    name: ClassVar[str]  # the recipe's drafter.family
    display_name: ClassVar[str]  # in plans and model cards, e.g. "Medusa-1"
    schema: ClassVar[type]  # the drafter section of a recipe (torch-free pydantic model)
    export_formats: ClassVar[tuple[str, ...]] = ("native",)  # what `export --format` accepts
    bundle_layout: ClassVar[str] = "drafter+head"  # recorded in the bundle manifest
    drafter_weights_file: ClassVar[str] = "model.safetensors"  # drafter/<this> in a bundle
    # Integer/bool tensors of the drafter, {name: dtype} where present: they keep that dtype in
    # runs and bundles (only floating-point tensors take the export dtype; docs/design.md §3).
    exact_dtypes: ClassVar[dict[str, str]] = {}
    # The drafter's config names its target (speculators' verifier.name_or_path): engines that load
    # the verifier by that name cannot serve a drafter of a random target (export --engine vllm).
    names_verifier: ClassVar[bool] = False
    # The module (import path) whose `plan(drafter, tshape)` and `build(drafter, target)` the
    # defaults below call; imported on first use, so the family's torch code loads only then.
    model_module: ClassVar[str]

    def _model(self):
        import importlib

        return importlib.import_module(self.model_module)

    # ------------------------------------------------------------------ graft
    def plan(self, drafter, tshape):
        """-> adapters.plan.FamilyPlan, from configs alone (no weights read)."""
        return self._model().plan(drafter, tshape)

    def build(self, drafter, target):
        """-> (DrafterAdapter on `target`, {native name: tensor} of a Domino head found in the
        drafter's checkpoint, or {}). Weights are checked strictly."""
        return self._model().build(drafter, target)

    def checkpoint_head_fields(self, drafter) -> dict:
        """The head the drafter's checkpoint declares ({gru_hidden_dim, rank, pure_prefix_len}),
        from its config alone; {} when the format has no place for a head."""
        return {}

    # ---------------------------------------------------------------- bundles
    def bundle_files(self, format: str) -> list[str]:
        """Files of a bundle, besides manifest.json and README.md."""
        return [f"{DRAFTER_DIR}/{self.drafter_weights_file}", f"{DRAFTER_DIR}/config.json", HEAD_FILE]

    def plan_bundle(self, drafter, tshape, fam_plan, spec, *, format: str, dtype: str):
        """-> (config.json of the bundle's main file or None, {tensor name: shape}) from configs."""
        return None, {**fam_plan.backbone_tensors, **spec.tensor_shapes()}

    def bundle_contents(self, adapter, head, *, format: str, dtype: str):
        """-> ({file: {name: tensor}}, {file: config dict}): floating-point tensors cast to the
        export dtype, integer and bool ones (vocabulary maps) kept exactly (docs/design.md §3)."""
        from domino_graft.artifacts.tensors import cast_floating, check_tensors
        from domino_graft.target import TORCH_DTYPES

        t = TORCH_DTYPES[dtype]
        head_state = head.state_dict()
        check_tensors(head_state, head.spec.tensor_shapes(), source="export (in-memory Domino head)")
        drafter = cast_floating(adapter.backbone_state_dict(), t)
        clash = sorted(set(drafter) & set(head_state))
        if clash:  # the manifest keys tensors by name across both files
            raise ValueError(f"export: drafter tensor names {clash} collide with the Domino head's")
        weights = f"{DRAFTER_DIR}/{self.drafter_weights_file}"
        return ({weights: drafter, HEAD_FILE: cast_floating(head_state, t)},
                {f"{DRAFTER_DIR}/config.json": adapter.native_config()})

    def bundle_code_files(self, format: str) -> dict[str, Path]:
        """{file name in the bundle: source path} of code a format ships (remote code)."""
        return {}

    def bundle_extra_check(self, bundle_dir: Path, *, format: str, probe: dict) -> tuple[dict, list[str]]:
        """A format's own reload check beyond the project's loader (e.g. through transformers):
        -> (result entries for the manifest, problems). `probe` holds target, ids, feats,
        anchors, tokens, reference (the rounded in-memory logits) and compute (dtype name)."""
        return {}, []

    def drafter_summary(self, adapter) -> dict:
        """Family facts for the manifest's `drafter` entry (beyond family, slots, topology)."""
        return {}

    def card_rows(self, manifest: dict, config: dict) -> tuple[str, str]:
        """The model card's `drafter` and `format` table rows."""
        d = manifest["drafter"]
        return (f"| drafter | {self.display_name}, {d['num_slots']} proposals per step, "
                f"{d.get('topology', 'chain')} verification |",
                f"| format | `{DRAFTER_DIR}/`: a plain {self.display_name} checkpoint; `{HEAD_FILE}`: the Domino head |")

    def card_serve_lines(self, manifest: dict, *, bundle: str, target_ref: str) -> list[str]:
        """The model card's "Serve" section."""
        name = self.display_name
        return [
            f"No serving engine runs a Domino head on {name} drafters yet. `{DRAFTER_DIR}/` is a plain {name} "
            "checkpoint (serve it as the base drafter); the corrected drafter runs in domino-graft:",
            "",
            "```bash",
            f"domino-graft generate {bundle} ...",
            f"domino-graft bench {bundle}",
            "```",
        ]

    # ------------------------------------------------------ reading a bundle
    def bundle_implied_tensors(self, bundle_dir: Path, manifest: dict) -> tuple[dict, dict]:
        """-> (the drafter's config.json, {weights file: {name: shape}} the bundle must hold)."""
        from domino_graft.artifacts.files import read_json
        from domino_graft.head import HeadSpec

        config = read_json(bundle_dir / DRAFTER_DIR / "config.json", missing="file not found; the bundle is incomplete")
        # the drafter's own weights are checked by build(), which reads them from drafter/
        return config, {HEAD_FILE: HeadSpec(**manifest["head"]).tensor_shapes()}

    def bundle_recipe(self, recipe, bundle_dir: Path):
        """The recipe that rebuilds the bundle's drafter: the source run's, its weights read
        from drafter/ (as a run dir reloads from RUN/drafter/)."""
        return recipe.model_copy(update={"drafter": recipe.drafter.model_copy(
            update={"path": str(bundle_dir / DRAFTER_DIR)})})

    def bundle_head_file(self) -> Optional[str]:
        """The file the head is loaded from, or None when `build` finds it in the drafter's own."""
        return HEAD_FILE

    def __repr__(self) -> str:
        return f"<drafter family {self.name!r} ({type(self).__module__})>"
