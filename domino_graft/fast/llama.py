"""An own forward for the Llama family (llama, mistral, qwen2, qwen3), on a static cache.

Built from a loaded Hugging Face model by *sharing* its parameter tensors (nothing is
copied), so the HF model stays usable beside it and both see the same weights. The math
mirrors transformers' modules op for op (RMSNorm in fp32 then cast, RoPE from the model's
own ``inv_freq`` buffer, Qwen3's per-head q/k norms, SwiGLU), which keeps fp32 logits equal
to HF's to ~1e-6. What differs is the machinery:

* K/V go into a preallocated ``StaticKVCache`` at explicit positions ``pos..pos+T-1``;
* positions are a device tensor ``[B]`` (an int or a host list is accepted too), so one CUDA
  graph serves every position (graphs.py);
* attention reads only the first ``kv_len`` cache positions (a static bucket chosen by the
  caller) under an explicit mask: query i of row b sees key positions ``<= pos[b] + i``;
* GQA without materialising repeated K/V: the ``n_heads / n_kv_heads`` query heads of one KV
  head are folded into the query-length axis of one ``scaled_dot_product_attention`` call;
* q/k/v and gate/up run as one matmul each over a fused weight. The HF modules' parameters
  are rebound to views of the fused tensor (``fuse_linears``), so there is still one copy of
  every weight: at batch 1 a step is a chain of small kernels, and two fewer per sub-block
  is measured time (docs/design.md §5);
* ``compile()`` compiles the per-layer math once for every layer (or, ``scope="model"``, the
  whole forward as one graph);
* ``use_kernels("triton")`` (the CUDA default, ``prepare_for_cuda_decoding``) splits each layer
  around two Triton launches, norm + RoPE + cache write and an attention bounded by the positions
  on the device (kernels/engine/decode_attention.py); the torch math above stays their reference.

The torch math is llama_math.py and the layer split around the kernels llama_split.py; this
module reads the config, fuses the weights and holds FastLM.

Layer ids follow the project's convention: 0-based decoder-layer outputs, -1 = the final
post-norm state.

Gemma-3 (sliding-window layers, two RoPEs, its own norms) has its own math in gemma3.py on the
same cache and machinery; ``FastLM.from_hf`` dispatches to it. Anything else outside this family
of architectures (sliding windows in use, dynamic RoPE scaling, other activations, ...) raises
``UnsupportedModel``: callers fall back to HF.
"""

from __future__ import annotations

import os

from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence, Union

import torch
import torch.nn.functional as F

from .llama_math import decoder_layer, epilogue, prologue, run_model
from .llama_split import (attention_kernels, epilogue_add, layer_in, layer_out, linear_kernels, run_model_linears,
                          run_model_split, triton_kernels_unsupported)
from .static_cache import StaticKVCache

SUPPORTED_MODEL_TYPES = ("llama", "qwen3", "qwen2", "mistral", "gemma3_text")  # gemma3_text: gemma3.py
# RoPE types whose frequencies are fixed at load time (HF precomputes inv_freq and one
# attention scaling factor); "dynamic" / "longrope" change them with the sequence length.
STATIC_ROPE_TYPES = ("default", "linear", "llama3")

Pos = Union[int, Sequence[int], torch.Tensor, None]


class UnsupportedModel(ValueError):
    """This model cannot run on the fast engine; use the Hugging Face forward instead."""


@dataclass(frozen=True)
class FastConfig:
    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_type: str
    tie_word_embeddings: bool

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads


# weights of one decoder layer, in this order (None where the architecture has none)
LAYER_FIELDS = ("in_norm", "wqkv", "bqkv", "wo", "bo", "q_norm", "k_norm", "post_norm", "wgu", "bgu", "wd", "bd")


# --------------------------------------------------------------------------- fused weights
def _adjacent(ts: Sequence[torch.Tensor]) -> Optional[torch.Tensor]:
    """One tensor over `ts` when they already lie back to back in one storage (a fused
    weight made earlier), else None."""
    first = ts[0]
    for a, b in zip(ts, ts[1:]):
        if not (a.is_contiguous() and b.is_contiguous() and a.dtype == b.dtype and a.device == b.device
                and a.shape[1:] == b.shape[1:]
                and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
                and a.data_ptr() + a.numel() * a.element_size() == b.data_ptr()):
            return None
    rows = sum(t.shape[0] for t in ts)
    return first.detach().as_strided((rows, *first.shape[1:]), first.stride())


def fuse_linears(mods: Sequence[torch.nn.Module], attr: str) -> Optional[torch.Tensor]:
    """The `attr` ("weight" / "bias") tensors of `mods` as one tensor concatenated along dim 0,
    with each module's parameter rebound to its slice of it: one copy of the weights, which
    the HF modules and the fast forward both read. None when no module has the attribute."""
    ts = [getattr(m, attr, None) for m in mods]
    if all(t is None for t in ts):
        return None
    if any(t is None for t in ts):
        raise UnsupportedModel(f"fast engine: some projections of one block have a {attr} and some do not")
    with torch.no_grad():
        fused = _adjacent(ts)
        if fused is not None:
            return fused
        fused = torch.cat([t.detach() for t in ts], dim=0)
        start = 0
        for m, t in zip(mods, ts):
            n = t.shape[0]
            setattr(m, attr, torch.nn.Parameter(fused[start:start + n], requires_grad=t.requires_grad))
            start += n
    return fused


def prepare_for_cuda_decoding(lm: "FastLM") -> "FastLM":
    """The engine's CUDA setup of a FastLM (solo and batched targets alike): the Triton attention
    kernels under the graphs (with compiled pieces around them they took 0.98 vs 1.17 ms per SmolLM2
    step and 4.83 vs 5.30 ms per Qwen3-8B step against the compiled per-layer math with an additive
    mask, at 15aab6c: bench/results/engine_h200.json compiled_layer_triton vs compiled_layer_fmask); no
    kv bucket reaches the compiled code, so each T compiles once. A head size the kernels do not take gets
    the compiled per-layer math with an additive mask. With the attention kernels every norm and
    projection runs as a kernel too (use_linears("triton"): 4.57 vs 4.88 ms per Qwen3-8B step and
    1.00 vs 1.05 ms per SmolLM2 step in the same H200 call, engine_h200.json *_linears), and a row's
    bits no longer depend on the batch size or T; DOMINO_GRAFT_LINEARS=torch keeps cuBLAS."""
    try:
        lm.use_kernels("triton")
    except UnsupportedModel:
        lm.float_mask = True
    linears = os.environ.get("DOMINO_GRAFT_LINEARS", "triton")
    if linears != "torch" and lm.kernels == "triton":
        try:
            lm.use_linears(linears)
        except UnsupportedModel:
            pass  # an architecture without the small_linear forward keeps cuBLAS
        else:
            from domino_graft.kernels.engine.small_linear import use_measured_configs

            use_measured_configs(lm.device)
    return lm.compile()


# ------------------------------------------------------------------------- config reading
def _rope_params(cfg) -> tuple[str, dict]:
    params = getattr(cfg, "rope_parameters", None)
    if isinstance(params, dict) and "full_attention" in params:  # per-layer-type rope
        raise UnsupportedModel("fast engine: per-layer-type RoPE parameters are not supported")
    if not params:
        params = getattr(cfg, "rope_scaling", None) or {}
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    return str(rope_type), dict(params)


# model_type -> (its FastLM subclass, its check_supported): architectures with a forward of their
# own module, which registers itself on import (gemma3.py; the package's __init__ imports it), so
# this module never imports them
ARCHITECTURES: dict[str, tuple[type, Callable]] = {}


def check_supported(cfg, max_len: int) -> None:
    """Raise UnsupportedModel with the reason when this config is outside the fast path."""
    mt = getattr(cfg, "model_type", None)
    if mt in ARCHITECTURES:
        return ARCHITECTURES[mt][1](cfg, max_len)
    if mt not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModel(f"fast engine: model_type {mt!r} is not supported; supported: "
                               f"{', '.join(SUPPORTED_MODEL_TYPES)} (use the Hugging Face forward)")
    act = getattr(cfg, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise UnsupportedModel(f"fast engine: hidden_act {act!r} is not supported; supported: silu")
    rope_type, _ = _rope_params(cfg)
    if rope_type not in STATIC_ROPE_TYPES:
        raise UnsupportedModel(f"fast engine: RoPE type {rope_type!r} is not supported; supported: "
                               f"{', '.join(STATIC_ROPE_TYPES)} (use the Hugging Face forward)")
    window = getattr(cfg, "sliding_window", None)
    uses_window = getattr(cfg, "use_sliding_window", True)  # qwen2/qwen3 carry a switch
    layer_types = getattr(cfg, "layer_types", None) or ()
    if any(t != "full_attention" for t in layer_types) or (window and uses_window and window < max_len):
        raise UnsupportedModel(f"fast engine: sliding-window attention (window {window}) shorter than "
                               f"max_len {max_len} is not supported")
    for flag in ("final_logit_softcapping", "attn_logit_softcapping"):
        if getattr(cfg, flag, None):
            raise UnsupportedModel(f"fast engine: {flag} is not supported")
    if int(getattr(cfg, "pretraining_tp", 1) or 1) != 1:
        raise UnsupportedModel("fast engine: pretraining_tp > 1 is not supported")


def _weight(mod) -> Optional[torch.Tensor]:
    return None if mod is None else mod.weight


def _bias(mod) -> Optional[torch.Tensor]:
    return None if mod is None else getattr(mod, "bias", None)


class FastLM:
    """The fast target forward over a static KV cache.

    ``forward(ids [B, T], pos)`` -> ``(logits [B, T', V], {layer_id: hidden [B, T, H]})`` and
    writes K/V at ``pos..pos+T-1``; afterwards ``cache.lengths[:B] == pos + T``. Roll back a
    rejection with ``cache.set_lengths(keep)`` (or just pass the next ``pos`` explicitly).
    """

    def __init__(self, cfg: FastConfig, *, embed: torch.Tensor, layers: list[tuple], norm: torch.Tensor,
                 lm_head: torch.Tensor, inv_freq: torch.Tensor, rope_scaling: float, cache: StaticKVCache):
        self.cfg, self.embed, self.layers, self.norm, self.lm_head = cfg, embed, layers, norm, lm_head
        self.inv_freq, self.rope_scaling, self.cache = inv_freq, float(rope_scaling), cache
        self.device, self.dtype = embed.device, embed.dtype
        self.max_len, self.max_batch = cache.max_len, cache.max_batch
        self._arange = torch.arange(self.max_len, device=self.device)
        self._rows = torch.arange(self.max_batch, device=self.device)[:, None]
        self._model_fn: Callable = run_model
        self.compiled: Optional[str] = None  # the compile scope, once compiled
        self.float_mask = False  # additive attention mask (prologue); set before the first forward
        self.kernels = "torch"  # the attention sub-block: see use_kernels
        self.linears = "torch"  # the projections: see use_linears
        self._split_pieces: dict = {}

    # ------------------------------------------------------------------ building
    @classmethod
    def from_hf(cls, model, max_batch: int = 1, max_len: int = 2048) -> "FastLM":
        """Wrap a loaded HF causal LM (llama / mistral / qwen2 / qwen3; gemma3_text through
        gemma3.Gemma3LM); shares its tensors."""
        cfg = model.config
        other = ARCHITECTURES.get(getattr(cfg, "model_type", None))
        if other is not None and cls is FastLM:
            return other[0].from_hf(model, max_batch, max_len)
        check_supported(cfg, max_len)
        inner = model.model
        rotary = getattr(inner, "rotary_emb", None)
        if rotary is None or getattr(rotary, "inv_freq", None) is None:
            raise UnsupportedModel("fast engine: the model has no rotary_emb.inv_freq buffer")
        rope_type, _ = _rope_params(cfg)
        heads = cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        if heads % kv_heads:
            raise UnsupportedModel(f"fast engine: {heads} heads are not a multiple of {kv_heads} KV heads")
        fc = FastConfig(model_type=cfg.model_type, num_layers=len(inner.layers), hidden_size=cfg.hidden_size,
                        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, vocab_size=cfg.vocab_size,
                        rms_norm_eps=float(cfg.rms_norm_eps), rope_type=rope_type,
                        tie_word_embeddings=model.get_output_embeddings().weight is inner.embed_tokens.weight)
        layers = []
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            qn, kn = getattr(a, "q_norm", None), getattr(a, "k_norm", None)
            if (qn is None) != (fc.model_type != "qwen3"):
                raise UnsupportedModel(f"fast engine: {fc.model_type} layer with unexpected q/k norms")
            qkv, gate_up = (a.q_proj, a.k_proj, a.v_proj), (m.gate_proj, m.up_proj)
            layers.append((
                layer.input_layernorm.weight, fuse_linears(qkv, "weight"), fuse_linears(qkv, "bias"),
                a.o_proj.weight, _bias(a.o_proj), _weight(qn), _weight(kn), layer.post_attention_layernorm.weight,
                fuse_linears(gate_up, "weight"), fuse_linears(gate_up, "bias"), m.down_proj.weight,
                _bias(m.down_proj),
            ))
        embed = inner.embed_tokens.weight
        cache = StaticKVCache(fc.num_layers, max_batch, kv_heads, max_len, head_dim, dtype=embed.dtype,
                              device=embed.device)
        return cls(fc, embed=embed, layers=layers, norm=inner.norm.weight,
                   lm_head=model.get_output_embeddings().weight, inv_freq=rotary.inv_freq,
                   rope_scaling=getattr(rotary, "attention_scaling", 1.0), cache=cache)

    def compile(self, scope: str = "layer", **kwargs) -> "FastLM":
        """torch.compile the forward. scope "layer" (the default): one compiled function serves
        every layer (the weights are arguments) plus the prologue and epilogue; "model": the
        whole forward as one graph, so inductor may fuse across layers. On an H200 at Qwen3-8B
        shapes "model" took 10x the compile time for a 2% faster step and a 10% slower verify
        (bench/results/engine_h200.json, own_compiled vs own_compiled_layer).
        Positions are tensors, so nothing recompiles per position; each (B, T, kv_len, capture)
        shape compiles once."""
        import torch._dynamo

        if scope not in ("model", "layer"):
            raise ValueError(f"compile scope {scope!r}; valid: model, layer")
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        opts = dict(fullgraph=True, dynamic=False)
        opts.update(kwargs)
        m = self._math()
        if self.linears != "torch":
            if scope != "layer":
                raise ValueError(f"compile scope {scope!r} with linears {self.linears!r}; valid: layer")
            # nothing left to compile: the norms, the projections and the attention are kernels
            self._split_pieces = {}
        elif self.kernels != "torch":
            if scope != "layer":
                raise ValueError(f"compile scope {scope!r} with kernels {self.kernels!r}; valid: layer (the "
                                 "kernels run between the compiled pieces)")
            # the pieces around the kernels; none depends on kv_len, so no bucket recompiles
            self._split_pieces = {k: torch.compile(m[k], **opts) for k in ("l_in", "l_out")}
            self._split_pieces["epi"] = torch.compile(m["split_epi"], **opts)
        elif scope == "model":
            self._model_fn = torch.compile(m["run"], **opts)
        else:
            pieces = {k: torch.compile(m[k], **opts) for k in ("pro", "layer_fn", "epi")}
            run = m["run"]
            self._model_fn = lambda *args, **kw: run(*args, **kw, **pieces)
        self.compiled = scope
        return self

    def _math(self) -> dict:
        """The functions of this architecture's forward that compile() compiles: the whole one
        ("run"), its per-layer pieces ("pro", "layer_fn", "epi") and the pieces around the attention
        kernels ("l_in", "l_out", "split_epi"). Gemma3LM gives its own."""
        return dict(run=run_model, pro=prologue, layer_fn=decoder_layer, epi=epilogue, l_in=layer_in,
                    l_out=layer_out, split_epi=epilogue_add)

    def use_kernels(self, name: str) -> "FastLM":
        """How a layer's attention sub-block runs. "torch" (the default): run_model's per-layer math
        (one SDPA over a mask, kv_len a static bucket). "triton": the forward split around two
        Triton kernels (kernels/engine/decode_attention.py: norm + RoPE + cache write, attention that
        reads the positions on the device) with each layer's last residual add deferred into the
        next layer's norm; "reference": the same split with the kernels' torch math (a CPU check
        of the split). Call before compile()."""
        if name != "torch":
            attention_kernels(name)  # fails here on an unknown name or a missing Triton
            why = triton_kernels_unsupported(self.cfg.head_dim) if name == "triton" else None
            if why:
                raise UnsupportedModel(why)
        if self.compiled:
            raise ValueError("use_kernels() after compile(): choose the kernels first")
        self.kernels = name
        return self

    def project_logits(self, h: torch.Tensor) -> torch.Tensor:
        """The LM head over final post-norm states h [..., H], through the same projection the
        forward uses (small_linear under use_linears, so a row's logits stay independent of the
        batch; F.linear otherwise): for callers that pick rows out of the hidden state first."""
        if self.linears != "torch":
            return linear_kernels(self.linears)[0](h, self.lm_head)
        return F.linear(h, self.lm_head)

    def use_linears(self, name: str) -> "FastLM":
        """How the projections run. "torch" (the default): F.linear (cuBLAS) inside the compiled
        pieces. "triton": kernels/engine/small_linear.py for every projection and the LM head at any
        number of rows, with the residual adds and SiLU·mul in their epilogues; a row's bits then
        depend only on that row (its K ranges are fixed per weight shape: kernels/engine/small_linear.py,
        "Bits"), not on the batch size or T, so a row decoded in a batch is the row decoded alone. "reference": the same forward
        with the kernels' torch math (a CPU check). Needs use_kernels first (the split forward);
        call before compile()."""
        if name not in ("torch", "triton", "reference"):
            raise ValueError(f"linear kernels {name!r}; valid: torch, triton, reference")
        if name != "torch":
            if self.kernels == "torch":
                raise ValueError("use_linears() needs use_kernels('triton' or 'reference') first: the projections "
                                 "run between the attention kernels")
            linear_kernels(name)  # fails here on a missing Triton
        if self.compiled:
            raise ValueError("use_linears() after compile(): choose the kernels first")
        self.linears = name
        return self

    @property
    def weight_bytes(self) -> int:
        """Bytes of the weights one forward reads (the embedding table only when it is the LM head)."""
        seen, total = set(), 0
        for t in [w for layer in self.layers for w in layer] + [self.norm, self.lm_head]:
            if t is not None and t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
        return total

    # ------------------------------------------------------------------ forward
    def host_positions(self, pos: Pos, b: int) -> Optional[list[int]]:
        """The positions as host ints when they are known without a device sync."""
        if pos is None:
            h = self.cache.host_lengths
            return None if h is None else list(h[:b])
        if isinstance(pos, int):
            return [pos] * b
        if isinstance(pos, torch.Tensor):
            if pos.device.type != "cpu":
                return None
            return pos.expand(b).tolist() if pos.dim() == 0 else pos.tolist()
        vals = [int(p) for p in pos]
        if len(vals) != b:
            raise ValueError(f"pos: {len(vals)} positions for a batch of {b}")
        return vals

    def pos_tensor(self, pos: Pos, b: int) -> torch.Tensor:
        if pos is None:
            return self.cache.lengths[:b]
        if isinstance(pos, torch.Tensor):
            p = pos.to(self.device, torch.long)
            return p.expand(b) if p.dim() == 0 else p
        if isinstance(pos, int):
            return torch.full((b,), pos, dtype=torch.long, device=self.device)
        return torch.tensor([int(p) for p in pos], dtype=torch.long, device=self.device)

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, pos: Pos = None, *, capture: Iterable[int] = (),
                kv_len: Optional[int] = None, logits_to_keep: int = 0, update_lengths: bool = True,
                use_compiled: bool = True):
        """ids ``[B, T]`` at positions pos..pos+T-1 (pos: int, B host ints, a ``[B]`` tensor,
        or None = the cache's lengths). kv_len: how many cache positions attention reads
        (static; default: exactly max(pos) + T when the positions are host-known, else
        max_len). logits_to_keep: 0 = logits for all T tokens, n = the last n only.
        use_compiled=False runs the eager math even after compile() (a prefill, say, whose
        shape would otherwise compile once more). Returns (logits, {layer id: hidden state})."""
        if ids.dim() != 2:
            raise ValueError(f"ids: shape {tuple(ids.shape)}; expected [B, T]")
        b, t = ids.shape
        if b > self.max_batch:
            raise ValueError(f"batch {b} > max_batch {self.max_batch}")
        capture = tuple(capture)
        for lid in capture:
            if not -1 <= lid < self.cfg.num_layers:
                raise ValueError(f"capture layer id {lid} out of range: valid 0..{self.cfg.num_layers - 1} or -1")
        host = self.host_positions(pos, b)
        if host is not None:
            end = max(host) + t
            if min(host) < 0 or end > self.max_len:
                raise ValueError(f"positions {min(host)}..{end - 1} outside the cache (max_len {self.max_len})")
            kv_len = end if kv_len is None else kv_len
            if kv_len < end:
                raise ValueError(f"kv_len {kv_len} < max(pos) + T = {end}")
        kv_len = self.max_len if kv_len is None else min(int(kv_len), self.max_len)
        p = self.pos_tensor(pos, b)
        q_pos = p[:, None] + self._arange[:t]  # [B, T]
        kcs, vcs = self.cache.k, self.cache.v
        if b != self.max_batch:
            kcs, vcs = [k[:b] for k in kcs], [v[:b] for v in vcs]
        c = self.cfg
        logits, hs = self._run(ids, p, q_pos, self._rows[:b], kcs, vcs, capture, kv_len, int(logits_to_keep),
                               use_compiled)
        order = [i for i in range(c.num_layers) if i in capture] + ([-1] if -1 in capture else [])
        hidden = dict(zip(order, hs))
        if update_lengths:
            self.cache.lengths[:b].copy_(p + t)
            if host is not None and self.cache.host_lengths is not None:
                self.cache.host_lengths[:b] = [x_ + t for x_ in host]
            else:
                self.cache.host_lengths = None
        return logits, hidden

    __call__ = forward

    def _run(self, ids, p, q_pos, rows, kcs, vcs, capture: tuple, kv_len: int, keep: int, use_compiled: bool):
        """The architecture's forward over the prepared positions: (logits, captured hiddens)."""
        c = self.cfg
        if self.linears != "torch":
            _, rope_attention = attention_kernels(self.kernels)
            linear, swiglu, norm = linear_kernels(self.linears)
            return run_model_linears(ids, p.contiguous(), kcs, vcs, self.embed, self.layers, self.norm, self.lm_head,
                                     self.inv_freq, self.rope_scaling, capture, c.num_heads, c.num_kv_heads,
                                     c.head_dim, c.rms_norm_eps, kv_len, keep, rope_attention, linear, swiglu, norm)
        if self.kernels != "torch":
            _, rope_attention = attention_kernels(self.kernels)
            pieces = self._split_pieces if use_compiled else {}
            return run_model_split(ids, p.contiguous(), kcs, vcs, self.embed, self.layers, self.norm, self.lm_head,
                                   self.inv_freq, self.rope_scaling, capture, c.num_heads, c.num_kv_heads,
                                   c.head_dim, c.rms_norm_eps, kv_len, keep, rope_attention, **pieces)
        fn = self._model_fn if use_compiled else run_model
        return fn(ids, q_pos, self._arange[:kv_len], rows, kcs, vcs, self.embed, self.layers, self.norm,
                  self.lm_head, self.inv_freq, self.rope_scaling, self.dtype, capture, c.num_heads, c.num_kv_heads,
                  c.head_dim, c.rms_norm_eps, kv_len, keep, self.float_mask)

    # ------------------------------------------------------------------ helpers
    @torch.no_grad()
    def greedy(self, prompt: torch.Tensor, max_new_tokens: int, step: Optional[Callable] = None) -> list[int]:
        """Target-alone greedy decoding of one prompt ``[1, n]`` (prefill, then T=1 steps through
        `step(ids, pos)`, by default this forward; a GraphRunner works too)."""
        step = step or self.forward
        n = prompt.shape[1]
        logits, _ = self.forward(prompt, 0, logits_to_keep=1, use_compiled=False)
        tok = logits[:, -1].argmax(-1)
        out = [int(tok)]
        for i in range(max_new_tokens - 1):
            logits, _ = step(tok[:, None], n + i)
            tok = logits[:, -1].argmax(-1)
            out.append(int(tok))
        return out
