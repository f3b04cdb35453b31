"""Chain verification of one drafted block against one target forward (batched over rows).

Both functions take the target's output over [x_0, d_1..d_K] (K+1 positions: position i
predicts the token after it) and return, per row, how many drafts were accepted (n_acc)
and the token the target emits after them (the correction at the first rejected slot, or
the bonus from position K when every draft was accepted). Emitted tokens are therefore
d_1..d_{n_acc}, next: always n_acc + 1 >= 1 tokens per target forward.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..sampling import sample, warp


def verify_greedy(target_logits: torch.Tensor, drafts: torch.Tensor):
    """target_logits [B, K+1, V], drafts [B, K] -> (n_acc [B], next [B]).

    Accept the longest prefix where draft == target argmax; the next token is the target's
    argmax right after it, exactly what target-only greedy decoding would emit there."""
    best = target_logits.argmax(-1)  # [B, K+1]
    k = drafts.shape[1]
    n_acc = (drafts == best[:, :k]).long().cumprod(-1).sum(-1)
    nxt = best.gather(1, n_acc[:, None]).squeeze(1)
    return n_acc, nxt


def verify_sampling(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, generator: Optional[torch.Generator]):
    """Standard speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

    p [B, K+1, V]: the target's warped distributions at the K+1 positions; q [B, K, V]: the
    distributions the drafts were drawn from (warped the same way). Accept d_j with
    probability min(1, p_j(d_j) / q_j(d_j)); at the first rejection emit a draw from
    norm(max(0, p_j - q_j)); if all K are accepted emit a draw from p_{K+1}. The emitted
    sequence is then distributed exactly as target-only sampling."""
    b, k = drafts.shape
    rows = torch.arange(b, device=drafts.device)
    pd = p[:, :k].gather(-1, drafts[..., None]).squeeze(-1)
    qd = q.gather(-1, drafts[..., None]).squeeze(-1)
    u = torch.rand(b, k, device=p.device, generator=generator, dtype=p.dtype)
    # u < p/q, multiplied out: q(d) > 0 for any d actually drawn from q.
    accept = u * qd < pd
    n_acc = accept.long().cumprod(-1).sum(-1)
    at = n_acc.clamp(max=k - 1)
    p_rej, q_rej = p[rows, at], q[rows, at]
    residual = (p_rej - q_rej).clamp_min(0)
    mass = residual.sum(-1, keepdim=True)
    # mass == 0 means p == q at that slot, where rejection has probability 0; p is then
    # the right (and only well-defined) distribution to fall back on.
    residual = torch.where(mass > 0, residual / mass.clamp_min(torch.finfo(mass.dtype).tiny), p_rej)
    dist = torch.where((n_acc == k)[:, None], p[:, k], residual)
    return n_acc, sample(dist, generator)


def _fused_rule(sampling, logits: torch.Tensor):
    """kernels/head/verify_sampled.py's rule where decoding takes it (its `fits`: a temperature-only warp, the
    switch not off), else None. CUDA only: under TRITON_INTERPRET=1 the kernels would also run on a CPU, far slower."""
    if not logits.is_cuda:
        return None
    try:
        from domino_graft.kernels.head import verify_sampled as fused
    except ImportError:  # no Triton: the torch rule
        return None
    return fused.verify_sampled if fused.fits(sampling.temperature, sampling.top_k, sampling.top_p, logits) else None


def verify_chain(target_logits: torch.Tensor, drafts: torch.Tensor, q: Optional[torch.Tensor], sampling,
                 generator: Optional[torch.Generator]):
    """Either rule by `sampling` (a sampling.Sampling): greedy, or speculative sampling with the
    target's logits [B, K+1, V] warped exactly as target-only sampling warps them (the one
    `warp()`); q [B, K, V] is the rollout's (None when greedy). -> (n_acc [B], next [B]).
    A temperature-only warp on CUDA runs the same rule fused (kernels/head/verify_sampled.py: four launches
    where the torch rule takes ~20 kernels a step; its uniforms: u [B, K], then w [B] for the draw);
    DOMINO_GRAFT_VERIFY_SAMPLED=0 keeps the torch rule."""
    if sampling.greedy:
        return verify_greedy(target_logits, drafts)
    fused = _fused_rule(sampling, target_logits)
    if fused is not None:
        b, k = drafts.shape
        u = torch.rand(b, k, device=target_logits.device, generator=generator)
        w = torch.rand(b, device=target_logits.device, generator=generator)
        return fused(target_logits, q.float(), drafts, sampling.temperature, u, w)
    p = warp(target_logits, sampling.temperature, sampling.top_k, sampling.top_p)
    return verify_sampling(p, q, drafts, generator)
