"""The persistent pool rollout: every greedy step of a `triton_pool` rollout in ONE launch.

A software grid barrier (`_grid_barrier`) replaces the launch boundary between the GRU phase and
the scoring phase of every step, so the kernel's programs must all be co-resident (at most one
per SM). Under TRITON_INTERPRET programs run one after another and a barrier with two programs
could never pass, so the interpreter runs it with ONE program (block_g = G), whose barriers pass
at once: CI checks every step of the kernel there, and the GPU tests its barriers. It shares
`triton_rollout`'s @triton.jit device functions (`_gru_cell`, `_reduce_partials`, `_pool_score`).

Measured on the H200 (head_latency's "pool_persistent_probe", commit 1d66318; docs/kernels.md): token for
token equal to the multi-launch path, but slower (0.432 vs 0.224 ms at Qwen3-8B shapes, batch 1).
Off by default (KernelConfig.pool_persistent). Not because of the barriers: one costs 0.74-1.05 us
(barrier_probe, commit 1d66318), 30 of them ~0.024 ms; the phases between them take ~10 us
each, against ~3-4 us for the multi-launch kernels' same work (each program walks its W_hh rows
in dependent chunks every step: few loads in flight).

How a program waits at a barrier after arriving is a choice (`BARRIERS`,
KernelConfig.pool_persistent_barrier): "rmw" (tl.atomic_add(bar, 0) acquire reads, one thread
reading for the CTA; the default, and the code measured above), "volatile" (volatile loads by
every thread, then one acquire read) or "ld_acquire" (inline-PTX acquire loads by every thread).
barrier_probe (commit 1d66318) measured them on the H200: ld_acquire 0.74 us, rmw 0.79 us, volatile
1.05 us per barrier; whole rollouts within 1.3% of each other, so the default stays rmw.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_rollout import _gru_cell, _pool_score, _pow2, _reduce_partials


BARRIERS = {"rmw": 0, "volatile": 1, "ld_acquire": 2}  # barrier name -> _grid_barrier's SPIN


@triton.jit
def _ld_acquire_gpu(ptr):
    """ld.acquire.gpu of the int32 at `ptr`, issued by every thread (inline PTX, the pattern of
    PyTorch's symmetric-memory Triton helpers). GPU only: the interpreter cannot run PTX."""
    return tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptr],
                                     dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _grid_barrier(bar_ptr, err_ptr, target, failed, MAX_SPIN: tl.constexpr, SPIN: tl.constexpr):
    """Software grid barrier of a persistent kernel: every program adds 1 to a counter that is
    never reset during the launch (barrier n waits for n x programs), then spins until the
    counter reaches its target. The CTA barriers around it and the acq_rel arrival plus an
    acquire read of the counter at gpu scope make the writes of every program before the barrier
    visible to every program after it (the pattern of cooperative groups' grid.sync). Bounded:
    after MAX_SPIN reads it sets *err_ptr and returns failed=1, and a failed program never spins
    again, so a launch whose programs are not all co-resident ends (with garbage drafts and the
    flag set) instead of hanging.

    SPIN (`BARRIERS`) picks how a program reads the counter while it waits:
    0 "rmw": tl.atomic_add(bar, 0, acquire), which Triton (3.6 and 3.9, PTX for sm_90) emits as
      an ld.acquire.gpu by one thread whose value reaches the others through shared memory
      between two CTA barriers, at every read.
    1 "volatile": volatile loads by every thread (no shared memory, no CTA barrier in the loop),
      then one read as in "rmw".
    2 "ld_acquire": ld.acquire.gpu loads by every thread (inline PTX), nothing afterwards. Each
      thread decides on its own reads, so warps could disagree on a timeout read at the
      MAX_SPIN limit (the flag is written by a scalar atomic, which one thread runs).
    One acquire read of a value >= target is all the ordering needs: a program arrives at
    barrier n only after passing barrier n-1, so the first n x programs arrivals in the
    counter's modification order are those at barriers 1..n, and every write after the launch's
    zeroing is an RMW, so a value >= target lies in the release sequence of each of them."""
    tl.debug_barrier()
    cnt = tl.atomic_add(bar_ptr, 1, sem="acq_rel", scope="gpu") + 1
    spins = 0
    if SPIN == 0:
        while (cnt < target) & (spins < MAX_SPIN) & (failed == 0):
            cnt = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
            spins += 1
    elif SPIN == 1:
        while (cnt < target) & (spins < MAX_SPIN) & (failed == 0):
            cnt = tl.load(bar_ptr, volatile=True)
            spins += 1
        # A volatile load orders nothing, so one acquire read after the loop (enough: see above).
        # By coherence it reads no older value than the loop's last load in the same thread, so
        # it sees what ended the loop; its value also decides the timeout.
        cnt = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    else:
        while (cnt < target) & (spins < MAX_SPIN) & (failed == 0):
            cnt = _ld_acquire_gpu(bar_ptr)
            spins += 1
    timed_out = cnt < target
    if timed_out:
        tl.atomic_xchg(err_ptr, 1, sem="relaxed", scope="gpu")
    tl.debug_barrier()
    return tl.where(timed_out, 1, failed)


@triton.jit
def _pool_rollout_persistent_kernel(
    toks_ptr, table_ptr, whh_ptr, w1b_ptr, w2_ptr, ids_ptr, vals_ptr, pool_stride_b, pool_stride_c,
    zacc_ptr, states_ptr, pval_ptr, pidx_ptr, draft_ptr, draft_stride, bar_ptr, err_ptr,
    B, K, PURE, P, p_per_prog, NPROG,
    G: tl.constexpr, R: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_R: tl.constexpr, R_CHUNKS: tl.constexpr, BLOCK_NP: tl.constexpr, BLOCK_KC: tl.constexpr,
    WHH_RESIDENT: tl.constexpr, BLOCK_GK: tl.constexpr,
    MAX_SPIN: tl.constexpr, SPIN: tl.constexpr,
):
    """All K steps of a greedy pool rollout in one launch; see `pool_rollout_persistent`.

    Program `pid` owns GRU rows g = pid·BLOCK_G.. of S (and the same rows of the three gates of
    W_hh, so the W_hh·S_j it computes for step j+1 is its own and stays in registers) and the
    pool slice pid·p_per_prog.. of every row. Per step j: phase A (the token x_{j-1} from the
    previous step's partials, the GRU for its rows, S_j rows stored, W1b[:, rows]·S_j[rows]
    atomically added into zacc_j); barrier; phase B (its pool slice scored with SiLU(zacc_j) ->
    one (value, id) partial per row; W_hh[rows]·S_j for step j+1); barrier. Buffers are per step
    (states [K+1, B, G], partials [K+1, B, NPROG]) so that no program overwrites what a slower
    one still reads, and every cross-program read is the first touch of its address."""
    pid = tl.program_id(0)
    b = tl.arange(0, BLOCK_B)
    bmask = b < B
    g = pid * BLOCK_G + tl.arange(0, BLOCK_G)
    gmask = g < G
    m2 = gmask[:, None] & bmask[None, :]
    rr = tl.arange(0, BLOCK_R)
    rmask = rr < R
    w1b = tl.load(w1b_ptr + rr[:, None] * G + g[None, :], mask=rmask[:, None] & gmask[None, :],
                  other=0.0).to(tl.float32)  # [BLOCK_R, BLOCK_G]: read once, kept for all steps
    h = tl.zeros((BLOCK_G, BLOCK_B), dtype=tl.float32)  # S_{j-1}[rows], as rounded to the state dtype
    gh_r = tl.zeros((BLOCK_G, BLOCK_B), dtype=tl.float32)  # W_hh·S_{j-1} for these rows (S_0 = 0)
    gh_z = tl.zeros((BLOCK_G, BLOCK_B), dtype=tl.float32)
    gh_n = tl.zeros((BLOCK_G, BLOCK_B), dtype=tl.float32)
    if WHH_RESIDENT:  # this program's W_hh rows for every step, in the weight dtype (half the registers)
        kg = tl.arange(0, BLOCK_GK)
        wres = whh_ptr + g[:, None] * G + kg[None, :]
        wres_m = gmask[:, None] & (kg < G)[None, :]
        whh_r = tl.load(wres, mask=wres_m, other=0.0)  # [BLOCK_G, BLOCK_GK]
        whh_z = tl.load(wres + G * G, mask=wres_m, other=0.0)
        whh_n = tl.load(wres + 2 * G * G, mask=wres_m, other=0.0)
    failed = pid * 0
    nbar = pid * 0
    for j in range(1, K + 1):
        # ---- phase A: x_{j-1}, then S_j for this program's rows
        if j - 1 <= PURE:  # the anchor or a pure slot's draft (plain base argmax, computed up front)
            tok = tl.load(toks_ptr + b * (PURE + 1) + (j - 1), mask=bmask, other=0).to(tl.int64)
        else:
            tok = _reduce_partials(pval_ptr + (j - 1) * B * NPROG, pidx_ptr + (j - 1) * B * NPROG, b, bmask,
                                   NPROG, BLOCK_NP)
            tl.store(draft_ptr + b * draft_stride + (j - 2), tok.to(tl.int64), mask=bmask & ((b * 0 + pid) == 0))
            tok = tl.where(bmask, tok, 0).to(tl.int64)
        row = table_ptr + tok[None, :] * (3 * G) + g[:, None]
        gi_r = tl.load(row, mask=m2, other=0.0).to(tl.float32)
        gi_z = tl.load(row + G, mask=m2, other=0.0).to(tl.float32)
        gi_n = tl.load(row + 2 * G, mask=m2, other=0.0).to(tl.float32)
        h_new = _gru_cell(gi_r, gi_z, gi_n, gh_r, gh_z, gh_n, h)  # at j = 1 (h, gh = 0) the S_0 = 0 formula
        h_new = tl.where(m2, h_new, 0.0).to(states_ptr.dtype.element_ty)
        tl.store(states_ptr + j * B * G + b[None, :] * G + g[:, None], h_new, mask=m2)
        h = h_new.to(tl.float32)
        if j > PURE:
            part = tl.sum(w1b[:, :, None] * h[None, :, :], 1)  # [BLOCK_R, BLOCK_B]
            tl.atomic_add(zacc_ptr + (j - 1) * B * R + b[None, :] * R + rr[:, None], part,
                          mask=rmask[:, None] & bmask[None, :], sem="relaxed")
        nbar += 1
        failed = _grid_barrier(bar_ptr, err_ptr, nbar * NPROG, failed, MAX_SPIN, SPIN)
        # ---- phase B: score this program's pool slice; W_hh[rows]·S_j for the next step
        if j > PURE:
            c = j - PURE - 1
            for bb in range(B):
                _pool_score(pid, bb, ids_ptr + c * pool_stride_c, vals_ptr + c * pool_stride_c, pool_stride_b,
                            zacc_ptr + (j - 1) * B * R, w2_ptr, pval_ptr + j * B * NPROG, pidx_ptr + j * B * NPROG,
                            pval_ptr, P, R, p_per_prog, NPROG, False, BLOCK_P, BLOCK_R, R_CHUNKS)
        if WHH_RESIDENT:  # the products from the resident rows, one batch row at a time: temporaries
            if j < K:        # stay [BLOCK_G, BLOCK_GK] whatever the batch (a [G, B, GK] one would spill)
                for bb in tl.static_range(BLOCK_B):
                    s_b = tl.load(states_ptr + j * B * G + bb * G + kg, mask=(kg < G) & ((kg * 0 + bb) < B),
                                  other=0.0).to(tl.float32)  # S_j of batch row bb, [BLOCK_GK]
                    col = b[None, :] == bb
                    gh_r = tl.where(col, tl.sum(whh_r.to(tl.float32) * s_b[None, :], 1)[:, None], gh_r)
                    gh_z = tl.where(col, tl.sum(whh_z.to(tl.float32) * s_b[None, :], 1)[:, None], gh_z)
                    gh_n = tl.where(col, tl.sum(whh_n.to(tl.float32) * s_b[None, :], 1)[:, None], gh_n)
        else:
            if j < K:
                acc_r = tl.zeros((BLOCK_G, BLOCK_B), dtype=tl.float32)
                acc_z = tl.zeros((BLOCK_G, BLOCK_B), dtype=tl.float32)
                acc_n = tl.zeros((BLOCK_G, BLOCK_B), dtype=tl.float32)
                for k0 in range(0, G, BLOCK_KC):
                    kk = k0 + tl.arange(0, BLOCK_KC)
                    kmask = kk < G
                    s_all = tl.load(states_ptr + j * B * G + b[:, None] * G + kk[None, :],
                                    mask=bmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)  # [BLOCK_B, BLOCK_KC]
                    wrow = whh_ptr + g[:, None] * G + kk[None, :]
                    wm = gmask[:, None] & kmask[None, :]
                    w_r = tl.load(wrow, mask=wm, other=0.0).to(tl.float32)
                    w_z = tl.load(wrow + G * G, mask=wm, other=0.0).to(tl.float32)
                    w_n = tl.load(wrow + 2 * G * G, mask=wm, other=0.0).to(tl.float32)
                    acc_r += tl.sum(w_r[:, None, :] * s_all[None, :, :], 2)
                    acc_z += tl.sum(w_z[:, None, :] * s_all[None, :, :], 2)
                    acc_n += tl.sum(w_n[:, None, :] * s_all[None, :, :], 2)
                gh_r, gh_z, gh_n = acc_r, acc_z, acc_n
        nbar += 1
        failed = _grid_barrier(bar_ptr, err_ptr, nbar * NPROG, failed, MAX_SPIN, SPIN)
    tok = _reduce_partials(pval_ptr + K * B * NPROG, pidx_ptr + K * B * NPROG, b, bmask, NPROG, BLOCK_NP)
    tl.store(draft_ptr + b * draft_stride + (K - 1), tok.to(tl.int64), mask=bmask & ((b * 0 + pid) == 0))



PERSISTENT_MAX_SPIN = 1 << 20  # counter reads (~1 s of "rmw" reads) before a barrier gives up (sets the error flag)


def persistent_programs(g: int, sms: int, min_block_g: int = 4):
    """(programs, block_g) of the persistent pool rollout: one program per BLOCK_G rows of S, at
    most one per SM, so that all programs are co-resident (the grid barrier needs it)."""
    block_g = max(min_block_g, triton.next_power_of_2(triton.cdiv(g, max(1, sms))))
    return triton.cdiv(g, block_g), block_g


def pool_rollout_persistent(*, toks, table, whh, w1b, w2, ids, vals, zacc, states, pval, pidx, draft, bar, err,
                            pure, block_g, block_p=16, block_kc=128, num_warps=4, max_spin=PERSISTENT_MAX_SPIN,
                            barrier: str = "rmw", whh_resident: bool = False):
    """The greedy pool rollout's K GRU steps and K - pure pool scorings in ONE launch (under
    TRITON_INTERPRET with one program only, block_g >= G: programs run one after another there,
    and a grid barrier of several could not pass).

    toks [B, pure+1] int64: the anchor and the pure slots' drafts (draft[:, :pure] holds them
    too); ids/vals [B, K-pure, P] (same strides); zacc [K, B, r] fp32 holding W1a·H_j; states
    [K+1, B, G] (weight dtype); pval/pidx [K+1, B, NPROG]; bar/err int32 [1], zeroed by the
    caller before every launch (err != 0 afterwards: a barrier timed out, the drafts are void).
    barrier: how programs wait at the grid barriers (a `BARRIERS` name; see `_grid_barrier`).
    whh_resident: each program loads its W_hh rows once and keeps them for all K steps
    (KernelConfig.pool_persistent_whh_resident) instead of re-reading them every step."""
    if barrier not in BARRIERS:
        raise ValueError(f"pool_rollout_persistent: barrier {barrier!r}: valid: {', '.join(BARRIERS)}")
    bsz, n_c, p = ids.shape
    if ids.stride() != vals.stride():
        raise ValueError("pool_rollout_persistent: ids and vals must share strides")
    k = zacc.shape[0]
    g = whh.shape[1]
    r = w2.shape[1]
    nprog = pval.shape[2]
    if k <= pure or n_c != k - pure:
        raise ValueError(f"pool_rollout_persistent: K={k}, pure={pure}, {n_c} pooled slots")
    p_per_prog = triton.cdiv(triton.cdiv(p, nprog), block_p) * block_p
    block_r = _pow2(r, 2)
    _pool_rollout_persistent_kernel[(nprog,)](
        toks, table, whh, w1b, w2, ids, vals, ids.stride(0), ids.stride(1),
        zacc, states, pval, pidx, draft, draft.stride(0), bar, err,
        bsz, k, pure, p, p_per_prog, nprog,
        G=g, R=r, BLOCK_B=_pow2(bsz, 1), BLOCK_G=block_g, BLOCK_P=block_p, BLOCK_R=block_r, R_CHUNKS=1,
        BLOCK_NP=_pow2(nprog, 2), BLOCK_KC=min(block_kc, _pow2(g)), MAX_SPIN=max_spin, SPIN=BARRIERS[barrier],
        WHH_RESIDENT=bool(whh_resident), BLOCK_GK=_pow2(g),
        num_warps=num_warps,
    )
