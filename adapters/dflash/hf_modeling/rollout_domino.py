"""Domino-head rollout and lossless speculative decoding for the hf bundle (remote code).

Self-contained: torch only here. The fused greedy rollout runs the Triton kernels shipped next
to this file (`triton_rollout_domino.py`, domino-graft's kernels/head/triton_rollout.py verbatim)
when triton imports and the tensors are on CUDA (or TRITON_INTERPRET=1 on the CPU); everywhere
else, and for every sampled rollout, the PyTorch reference below runs. Either way the output of
`spec_generate` is the target's: greedy drafts are only proposals that the target verifies, and
sampled drafts are verified by speculative sampling against the exact q they were drawn from.

Conventions (domino-graft docs/design.md §2):
* slot j = 1..K reads S_j = GRUCell(E(x_{j-1}), S_{j-1}), S_0 = 0, x_0 = the anchor, x_j = d_j;
* final_j = base_j for j <= pure_draft_prefix_len, else base_j + W2·SiLU(W1·[H_j; S_j]);
* greedy d_j = argmax final_j; sampling q_j = softmax(top_p(final_j / T)), d_j ~ q_j.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

# ---------------------------------------------------------------------------- sampling
def warp(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """logits [..., V] -> fp32 probabilities after temperature then top-p, with the semantics of
    transformers' TemperatureLogitsWarper + TopPLogitsWarper (what `target.generate` samples from)."""
    x = logits.float() / float(temperature)
    if top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=False)
        cum = sorted_x.softmax(-1).cumsum(-1)
        drop_sorted = cum <= (1.0 - top_p)
        drop_sorted[..., -1:] = False  # the most likely token always stays
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return x.softmax(-1)


def _draw(probs: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    """One id per row of probs [N, V] (a CPU generator also serves CUDA tensors)."""
    if generator is not None and generator.device != probs.device:
        return torch.multinomial(probs.cpu(), 1, generator=generator).to(probs.device).squeeze(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _uniform(generator: Optional[torch.Generator], device) -> float:
    dev = generator.device if generator is not None else device
    return float(torch.rand((), generator=generator, device=dev))


# ---------------------------------------------------------------------------- reference rollout
@torch.no_grad()
def reference_rollout(model, hidden: torch.Tensor, base: torch.Tensor, anchor: torch.Tensor, embed_tokens,
                      *, temperature: float = 0.0, top_p: float = 1.0,
                      generator: Optional[torch.Generator] = None):
    """The head's rollout, slot by slot. hidden [B, K, H] = H_1..H_K, base [B, K, V], anchor [B].

    Returns (draft [B, K] int64, q [B, K, V] fp32 or None): q_j is the distribution d_j was drawn
    from (None when greedy)."""
    w_ih, w_hh = model.prefix_gru.weight_ih_l0, model.prefix_gru.weight_hh_l0
    state = torch.zeros(anchor.shape[0], w_hh.shape[1], device=w_hh.device, dtype=w_hh.dtype)
    sampling = temperature > 0
    prev, out, qs = anchor, [], []
    for j in range(1, hidden.shape[1] + 1):
        state = torch.gru_cell(embed_tokens(prev).to(state.dtype), state, w_ih, w_hh, None, None)
        logits = base[:, j - 1]
        if j > model.pure_draft_prefix_len:
            x = torch.cat([hidden[:, j - 1].to(state.dtype), state], dim=-1)
            logits = logits + model.embed_proj(x).to(logits.dtype)
        if sampling:
            q = warp(logits, temperature, top_p)
            prev = _draw(q, generator)
            qs.append(q)
        else:
            prev = logits.argmax(-1)
        out.append(prev)
    return torch.stack(out, dim=1), (torch.stack(qs, dim=1) if sampling else None)


# ---------------------------------------------------------------------------- fused rollout
def triton_unavailable_reason(device: torch.device) -> Optional[str]:
    """None when the fused rollout can run on `device`, else why not. On the CPU the kernels run only
    in Triton's interpreter, i.e. when triton was imported under TRITON_INTERPRET=1 (read from how
    the shipped kernels were compiled, not from the environment, which may have changed since)."""
    if device.type not in ("cuda", "cpu"):
        return f"no Triton path for device {device.type!r}"
    try:
        # `from .name import`: the form transformers' remote-code loader sees (and copies the file)
        from .triton_rollout_domino import _gru_step_kernel  # imports triton
    except Exception as exc:  # no triton, or an incompatible one: the reference serves
        return f"the shipped Triton kernels do not import ({type(exc).__name__}: {exc})"
    interpreted = type(_gru_step_kernel).__name__ == "InterpretedFunction"
    if device.type == "cpu" and not interpreted:
        return ("CPU tensors: the kernels run on the CPU only in Triton's interpreter (TRITON_INTERPRET=1 "
                "set before triton is first imported)")
    if device.type == "cuda" and interpreted:
        return "triton was imported under TRITON_INTERPRET=1 (the interpreter runs CPU tensors only)"
    return None


class FusedGreedyRollout:
    """Greedy rollout through the shipped kernels (full vocabulary, fp32 accumulation): per slot
    one `gru_step` (table lookup E·W_ih^T, W1b·S added into the slot's z) and one `w2_argmax`
    (base + W2·SiLU(z) and a running argmax, logits never written; it also computes W_hh·S for
    the next step). Weights are re-derived when the head's parameters change."""

    def __init__(self, model, embedding_weight: torch.Tensor):
        self.model = model
        self.embedding_weight = embedding_weight
        self._key = None
        self._prep = None

    def _prepared(self):
        m = self.model
        params = (m.prefix_gru.weight_ih_l0, m.prefix_gru.weight_hh_l0, m.embed_proj[0].weight, m.embed_proj[2].weight)
        key = tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in (*params, self.embedding_weight))
        if key != self._key:
            w_ih, w_hh, w1, w2 = (p.detach() for p in params)
            h = w1.shape[1] - w_hh.shape[1]
            table = (self.embedding_weight.detach().to(w_ih.device, torch.float32) @ w_ih.float().t()).to(w_ih.dtype)
            self._prep = dict(table=table.contiguous(), whh=w_hh.contiguous(), w1a=w1[:, :h].contiguous(),
                              w1b=w1[:, h:].contiguous(), w2=w2.contiguous())
            self._key = key
        return self._prep

    @torch.no_grad()
    def __call__(self, hidden: torch.Tensor, base: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
        from .triton_rollout_domino import argmax_finalize, gru_step, w2_argmax, w2_programs

        p = self._prepared()
        device = base.device
        wdt = p["whh"].dtype
        bsz, k, vocab = base.shape
        g, r = p["whh"].shape[1], p["w2"].shape[1]
        pure = min(int(self.model.pure_draft_prefix_len), k)
        base = base.contiguous()
        anchor = anchor.to(torch.int64).contiguous()
        sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 2
        states = torch.empty(k + 1, bsz, g, device=device, dtype=wdt)
        zacc = torch.empty(k, bsz, r, device=device, dtype=torch.float32)
        if k > pure:
            zacc[pure:] = F.linear(hidden[:, pure:].to(wdt), p["w1a"]).transpose(0, 1)
        block_v = 64
        n_prog = w2_programs(vocab, block_v, 2 * sms)
        pval = torch.empty(bsz, n_prog, device=device, dtype=torch.float32)
        pidx = torch.empty(bsz, n_prog, device=device, dtype=torch.int32)
        gh = torch.empty(bsz, 3 * g, device=device, dtype=torch.float32)
        draft = torch.empty(bsz, k, device=device, dtype=torch.int64)
        for j in range(1, k + 1):
            corrected = j > pure
            step = dict(table=p["table"], h_prev=states[j - 1], h_out=states[j], block_g=32, gh=gh if j > 1 else None)
            if corrected:
                step.update(w1b=p["w1b"], zacc=zacc[j - 1])
            if j == 1:
                gru_step(tok=anchor, **step)
            else:
                gru_step(partials=(pval, pidx), draft=draft, draft_col=j - 2, **step)
            nxt = dict(gh=(states[j], p["whh"], gh) if j < k else None, block_gh=32, gh_block_k=256)
            head = dict(zacc=zacc[j - 1], w2=p["w2"], block_r=256) if corrected else {}
            w2_argmax(base=base[:, j - 1], pval=pval, pidx=pidx, block_v=block_v, num_warps=4, num_stages=2,
                         **head, **nxt)
        argmax_finalize(pval=pval, pidx=pidx, draft=draft, draft_col=k - 1)
        return draft


# ---------------------------------------------------------------------------- the target
def decoder_layers(target):
    """The target's decoder layers (transformers causal LMs: model.layers under the base model)."""
    for owner in (getattr(target, "model", None), getattr(target, "base_model", None), target):
        layers = getattr(owner, "layers", None)
        if isinstance(layers, torch.nn.ModuleList):
            return layers
    raise ValueError(f"spec_generate: cannot find the decoder layers of {type(target).__name__}")


def target_logits(target, hidden: torch.Tensor) -> torch.Tensor:
    logits = target.get_output_embeddings()(hidden.to(target.get_output_embeddings().weight.dtype))
    cap = getattr(target.config, "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


class TargetRunner:
    """Target forwards with a DynamicCache, capturing the decoder-layer outputs `layer_ids`
    (0-based outputs, `hidden_states[id + 1]` in transformers) with forward hooks, which never
    confuse the last layer's output with the post-norm state."""

    def __init__(self, target, layer_ids):
        from transformers import DynamicCache

        self.target = target
        self.layers = decoder_layers(target)
        self.layer_ids = list(layer_ids)
        bad = [i for i in self.layer_ids if not 0 <= i < len(self.layers)]
        if bad:
            raise ValueError(f"spec_generate: target_layer_ids {self.layer_ids} name layer {bad[0]}, but the target "
                             f"has {len(self.layers)} decoder layers")
        try:
            self.cache = DynamicCache(config=target.config)
        except TypeError:  # older transformers
            self.cache = DynamicCache()

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor):
        """ids [1, T] at the positions after the cache -> (logits [1, T, V] fp32, features [1, T, n·H])."""
        captured = {}
        handles = []
        for lid in self.layer_ids:
            def hook(_m, _i, out, lid=lid):
                captured[lid] = out[0] if isinstance(out, tuple) else out
            handles.append(self.layers[lid].register_forward_hook(hook))
        try:
            before = self.cache.get_seq_length()
            # the cache positionally: transformers 5 renamed past_key_values to `cache`, and either
            # keyword would vanish into **kwargs on the other version; the 4th slot is the same in both
            out = self.target(ids, None, None, self.cache, use_cache=True)
        finally:
            for h in handles:
                h.remove()
        if self.cache.get_seq_length() != before + ids.shape[1]:
            raise RuntimeError(f"spec_generate: {type(self.target).__name__}.forward did not extend the "
                               "DynamicCache passed as its 4th argument (past_key_values / cache)")
        return out.logits.float(), torch.cat([captured[i] for i in self.layer_ids], dim=-1)

    def crop(self, length: int) -> None:
        """Keep the first `length` positions. A negative argument (drop that many) means the same
        in every transformers version; a positive one is a length in 4.x and refused in 5.x."""
        drop = self.cache.get_seq_length() - length
        if drop > 0:
            self.cache.crop(-drop)


# ---------------------------------------------------------------------------- verification
def accept_greedy(draft: torch.Tensor, logits: torch.Tensor) -> list[int]:
    """draft [K], logits [K+1, V] of the verify forward -> the tokens emitted (accepted + bonus)."""
    want = logits.argmax(-1)
    n = 0
    while n < draft.shape[0] and int(draft[n]) == int(want[n]):
        n += 1
    return [int(t) for t in draft[:n]] + [int(want[n])]


def accept_sampled(draft: torch.Tensor, q: torch.Tensor, logits: torch.Tensor, temperature: float, top_p: float,
                   generator: Optional[torch.Generator]) -> list[int]:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): d_j is kept with
    probability min(1, p_j(d_j) / q_j(d_j)); the first rejection draws from norm(max(p_j - q_j, 0));
    all kept, the bonus is drawn from p_{K+1}. The emitted tokens are distributed exactly as the
    target's own sampling (p = warp(target logits)), whatever the drafter, given the exact q."""
    p = warp(logits, temperature, top_p)  # [K+1, V]
    out = []
    for j in range(draft.shape[0]):
        d = int(draft[j])
        pj, qj = p[j, d].item(), q[j, d].item()
        if qj > 0 and _uniform(generator, logits.device) * qj < pj:  # u < p/q, without dividing
            out.append(d)
            continue
        residual = (p[j] - q[j]).clamp_min(0)
        total = residual.sum()
        out.append(int(_draw((residual / total if total > 0 else p[j])[None], generator)[0]))
        return out
    out.append(int(_draw(p[-1:], generator)[0]))
    return out


# ---------------------------------------------------------------------------- spec_generate
def _eos_ids(target) -> set:
    """The ids `target.generate` stops at: its generation config's (the model config's without one)."""
    cfg = getattr(target, "generation_config", None) or target.config
    eos = getattr(cfg, "eos_token_id", None)
    return set(eos if isinstance(eos, (list, tuple)) else ([] if eos is None else [eos]))


@torch.no_grad()
def spec_generate(model, target, input_ids: torch.Tensor, max_new_tokens: int, temperature: float = 0.0,
                  top_p: float = 1.0, *, generator: Optional[torch.Generator] = None, rollout: str = "auto",
                  return_stats: bool = False):
    """Draft with `model` (a DominoDraftModel), verify with `target` (a transformers causal LM of the
    same vocabulary), batch 1. Returns [1, len(prompt) + new] like `target.generate`: greedy
    (temperature 0) token for token what `target.generate(do_sample=False)` returns; temperature > 0
    samples exactly from the target's warped distribution (speculative sampling with the exact q).

    The last verified token is the anchor x_0 of each block [x_0, MASK x K]: the prompt is
    prefilled without its last token, and each verify forward runs [x_0, d_1..d_K] on the
    target's DynamicCache, cropped to the accepted length. Stops at max_new_tokens or an EOS id
    of the target's generation config. rollout: "auto" (greedy: the fused kernels on CUDA when
    triton imports, else the reference), "torch", or "triton" (greedy; raises when the kernels
    cannot run; on the CPU they need Triton's interpreter)."""
    if input_ids.ndim == 1:
        input_ids = input_ids[None]
    if input_ids.shape[0] != 1:
        raise ValueError(f"spec_generate: batch 1 only, got input_ids of shape {tuple(input_ids.shape)}")
    if input_ids.shape[1] < 1:
        raise ValueError("spec_generate: input_ids is empty")
    if rollout not in ("auto", "torch", "triton"):
        raise ValueError(f"spec_generate: rollout {rollout!r}: valid: auto, torch, triton")
    device = target.get_input_embeddings().weight.device
    ids = input_ids.to(device)
    v_target = target.get_output_embeddings().weight.shape[0]
    if v_target != model.config.vocab_size:
        raise ValueError(f"spec_generate: the target's vocabulary ({v_target}) is not the drafter's "
                         f"({model.config.vocab_size})")
    sampling = float(temperature) > 0
    embed = target.get_input_embeddings()
    fused = None
    if not sampling and rollout != "torch":
        # "auto" takes the kernels on CUDA only (the interpreter is a test tool, not a CPU fast path)
        reason = triton_unavailable_reason(device) if rollout == "triton" or device.type == "cuda" else "CPU tensors"
        if reason is None:
            fused = getattr(model, "_fused_rollout", None)
            if fused is None or fused.embedding_weight is not embed.weight:
                fused = model._fused_rollout = FusedGreedyRollout(model, embed.weight)
        elif rollout == "triton":
            raise RuntimeError(f"spec_generate(rollout='triton'): {reason}")
    eos = _eos_ids(target)
    runner = TargetRunner(target, model.target_layer_ids)
    k, bs = model.num_proposals, model.block_size
    feats = runner(ids[:, :-1])[1] if ids.shape[1] > 1 else None  # verified positions 0..n-2
    if feats is None:
        feats = torch.zeros(1, 0, len(model.target_layer_ids) * target.config.hidden_size, device=device,
                            dtype=embed.weight.dtype)
    seq = [int(t) for t in ids[0]]
    n_prompt = len(seq)
    steps = 0
    while len(seq) - n_prompt < max_new_tokens:
        a = len(seq) - 1  # the anchor's position: every position before it is verified and cached
        anchor = torch.tensor([seq[-1]], device=device)
        block = torch.full((1, bs), int(model.mask_token_id), dtype=torch.long, device=device)
        block[0, 0] = anchor[0]
        pos = torch.arange(a + bs, device=device)[None]
        hidden = model.proposal_hidden(model(embed(block), feats[:, :a], pos))
        base = target_logits(target, hidden)
        if fused is not None:
            draft, q = fused(hidden, base, anchor), None
        else:
            draft, q = reference_rollout(model, hidden, base, anchor, embed, temperature=float(temperature),
                                         top_p=float(top_p), generator=generator)
        logits, new_feats = runner(torch.cat([anchor[:, None], draft], dim=1))  # positions a .. a+K
        if sampling:
            out = accept_sampled(draft[0], q[0], logits[0], float(temperature), float(top_p), generator)
        else:
            out = accept_greedy(draft[0], logits[0])
        accepted = len(out) - 1
        runner.crop(a + 1 + accepted)  # keep x_0 and the accepted drafts; the bonus is the next anchor
        feats = torch.cat([feats, new_feats[:, : accepted + 1].to(feats.dtype)], dim=1)
        steps += 1
        stop = False
        for t in out[: max_new_tokens - (len(seq) - n_prompt)]:
            seq.append(t)
            if t in eos:
                stop = True
                break
        if stop:
            break
    result = torch.tensor([seq], device=input_ids.device, dtype=input_ids.dtype)
    if return_stats:
        return result, {"steps": steps, "new_tokens": len(seq) - n_prompt,
                        "tau": (len(seq) - n_prompt) / max(steps, 1), "rollout": "triton" if fused else "torch"}
    return result
