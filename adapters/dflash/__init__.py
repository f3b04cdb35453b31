"""DFlash (z-lab) block-diffusion drafter; bundles in the engines' DFlash+Domino format.

The drafter is adapters/dflash/model.py and its adapter (plan, build) adapters/dflash/adapter.py,
the bundle layout adapters/dflash/bundle.py,
the transformers remote code a `--format hf` bundle ships adapters/dflash/hf_modeling/.
All imported on first use: this module stays torch-free so that `validate` never loads torch.
"""

from __future__ import annotations

from ..family import Family
from .schema import DFlashDrafter


class DFlashFamily(Family):
    name = "dflash"
    display_name = "DFlash"
    schema = DFlashDrafter
    export_formats = ("native", "hf")
    bundle_layout = "dflash"
    model_module = f"{__name__}.adapter"

    def checkpoint_head_fields(self, drafter) -> dict:
        from .adapter import checkpoint_head_fields

        return checkpoint_head_fields(drafter)

    # One model.safetensors (backbone + head) and a config.json the serving engines read.
    def bundle_files(self, format):
        from .bundle import bundle_files

        return bundle_files(format)

    def plan_bundle(self, drafter, tshape, fam_plan, spec, *, format, dtype):
        from .bundle import plan_bundle

        return plan_bundle(drafter, tshape, spec, format=format, dtype=dtype)

    def bundle_contents(self, adapter, head, *, format, dtype):
        from .bundle import bundle_contents

        return bundle_contents(adapter, head, format=format, dtype=dtype)

    def bundle_code_files(self, format):
        from .bundle import code_files

        return code_files(format)

    def bundle_extra_check(self, bundle_dir, *, format, probe):
        from .bundle import transformers_check

        return transformers_check(bundle_dir, format=format, probe=probe)

    def drafter_summary(self, adapter):
        cfg = adapter.cfg
        return {"block_size": cfg.block_size, "shift_label": cfg.shift_label,
                "target_layer_ids": list(cfg.target_layer_ids)}

    def card_rows(self, manifest, config):
        from .bundle import card_rows

        return card_rows(manifest, config)

    def card_serve_lines(self, manifest, *, bundle, target_ref):
        from .bundle import serve_lines

        return serve_lines(manifest, bundle=bundle, target_ref=target_ref)

    def bundle_implied_tensors(self, bundle_dir, manifest):
        from .bundle import implied_tensors

        return implied_tensors(bundle_dir)

    def bundle_recipe(self, recipe, bundle_dir):
        # Everything about the drafter and head comes from the bundle's config.json; only the
        # seeds and the target are taken from the recipe.
        from domino_graft.recipe import Head

        drafter = self.schema.model_validate({"family": self.name, "path": str(bundle_dir)})
        head = Head(seed=recipe.head.seed, zero_init_w2=recipe.head.zero_init_w2)
        return recipe.model_copy(update={"drafter": drafter, "head": head})

    def bundle_head_file(self):
        return None  # the head is in model.safetensors, found by build()


FAMILY = DFlashFamily()
