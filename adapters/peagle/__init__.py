"""P-EAGLE (speculators 0.9.0 `peagle`, served by vLLM 0.33): parallel EAGLE-3, K tokens per forward
after a mask token, with its own embeddings and an LM head over a draft vocabulary (`d2t`/`t2d`
maps); the Domino head grafted on its per-slot hidden states. Facts and sources: docs/peagle.md.

The model code is adapters/peagle/model.py, imported on first use: this module stays torch-free so
that `validate` never loads torch. The bundle is the default layout: `drafter/` is a speculators
P-EAGLE checkpoint (config.json + model.safetensors, d2t/t2d included) and `head.safetensors` the
Domino head. `bundle_contents` guards the vocabulary maps through the export dtype cast.
"""

from __future__ import annotations

from ..family import Family
from .schema import PEagleDrafter

VOCAB_MAP_KEYS = ("d2t", "t2d")


class PEagleFamily(Family):
    name = "peagle"
    display_name = "P-EAGLE"
    schema = PEagleDrafter
    model_module = f"{__name__}.model"

    def bundle_contents(self, adapter, head, *, format: str, dtype: str):
        """The default layout, with d2t/t2d checked through the cast to the export dtype.

        The core's bundle verifier wants every tensor of a file in the manifest's one dtype, so
        the maps cannot stay int64/bool here (speculators' dtypes). They are written as exact
        floats instead (t2d as 0/1; d2t's offsets are integers, exact in fp32 below 2^24), and
        `build` turns them back into int64/bool. An export dtype that would round an offset
        (bf16 keeps integers exactly only up to 256, fp16 up to 2048) is refused: vLLM would
        read the rounded map and draft wrong ids without a word."""
        tensors, configs = super().bundle_contents(adapter, head, format=format, dtype=dtype)
        maps = adapter.vocab_maps()
        if maps:
            weights = tensors[f"drafter/{self.drafter_weights_file}"]
            for name in VOCAB_MAP_KEYS:
                exact = maps[name].to(weights[name].dtype).to(maps[name].dtype)
                if not bool((exact == maps[name]).all()):
                    bad = int((exact != maps[name]).sum())
                    raise ValueError(
                        f"export: tensor {name!r} loses {bad} of its {maps[name].numel()} values in {dtype} (draft "
                        f"vocabulary offsets up to {int(maps[name].abs().max())}); valid: --dtype fp32, which keeps "
                        "d2t exact (a rounded d2t drafts wrong target ids in every engine)")
        return tensors, configs

    def drafter_summary(self, adapter):
        cfg = adapter.cfg
        return {"num_layers": cfg.num_hidden_layers, "target_layer_ids": list(cfg.target_layer_ids),
                "mask_token_id": cfg.mask_token_id, "draft_vocab_size": cfg.draft_vocab_size,
                "vocab_maps": cfg.draft_vocab_size != cfg.vocab_size}


FAMILY = PEagleFamily()
