"""Triton kernels of the Domino-head rollout, and their thin launch wrappers.

Imported lazily by `domino_rollout.py` (only when a CUDA tensor, or TRITON_INTERPRET=1,
asks for it), so importing `domino_graft.kernels` never needs Triton, and a test module can
set TRITON_INTERPRET before the @triton.jit decorators below run.

Ops (each has the same name in kernel, wrapper, test and benchmark):

* `gru_step`    S_j = GRUCell(table[x_{j-1}], S_{j-1}) for a slice of G per program. The input
                projection is a row of the precomputed table E_all·W_ih^T (exact for a bias-free
                GRU); the recurrent product W_hh·S_{j-1} arrives precomputed (`whh_gemv`, below).
                x_{j-1} is read from a token buffer, or reduced on the fly from the previous
                slot's argmax partials (stage 2 of that reduction, done redundantly by every
                program: a few hundred floats, cheaper than another launch). It also adds
                W1b[:, slice]·S_j[slice] into the slot's fp32 pre-activation zacc (initialised
                to W1a·H_j by one batched GEMM up front), so z = SiLU(W1·[H;S]) needs no kernel.
* `whh_gemv`    W_hh·S_j, which does not depend on the token about to be drafted: it runs as
                extra programs of slot j's scoring kernel (below), off the critical path.
* `w2_argmax`   logits = base + W2·SiLU(zacc) over a contiguous V range per program, fp32,
                never written out (unless sampling needs them); a running argmax per row
                leaves one (value, id) partial per program (stage 1 of the reduction).
* `pool_argmax` the same over a candidate pool: gathers the pool's W2 rows (ids from a top-k
                of the base logits) and base values.
* `argmax_finalize` stage 2 for the last slot: partials -> draft id.
* `bucket_max` / `radix_select` pool candidates without torch.topk (KernelConfig.pool_select
                "bucket" / "radix"; definitions in `reference.py`).
* `block_shared` SGLang's one pool per block (KernelConfig.pool_select "block_shared"): the max
                over the corrected slots here, the top-k by torch.topk (`reference.block_shared_ids`).

So a greedy step is two launches: gru_step(j) -> w2_argmax(j) (+ whh_gemv for step j+1).

PDL (`pdl=True` on a wrapper; KernelConfig.pdl): the kernel is launched with Hopper's
programmatic dependent launch, so it can be resident before its predecessor in the chain ends.
Every such kernel waits for its predecessor (griddepcontrol.wait) before it reads anything a
kernel wrote, and only then lets its own successor launch: a kernel that starts early can
therefore read, before its wait, only weights (never written) and data of kernels at least two
launches back. Greedy chains on sm_90+ only; never under the interpreter.

Ties: every reduction keeps the largest value and, among equal values, the lowest token id,
the same rule as `reference.argmax_lowest_id` (and torch.argmax).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BIG = tl.constexpr(2**31 - 1)  # "no id" for the min-id tie-break; larger than any vocabulary


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _tanh(x):
    # tanh via the logistic function (no libdevice: the interpreter has none). Absolute
    # error ~1e-7 in fp32, well inside the GRU's tolerance.
    return 2.0 * _sigmoid(2.0 * x) - 1.0


@triton.jit
def _gru_cell(gi_r, gi_z, gi_n, gh_r, gh_z, gh_n, h_old):
    """torch GRUCell, gate order (r, z, n), no biases; fp32 in and out."""
    r = _sigmoid(gi_r + gh_r)
    z = _sigmoid(gi_z + gh_z)
    n = _tanh(gi_n + r * gh_n)
    return (1.0 - z) * n + z * h_old


@triton.jit
def _pdl_enter(PDL: tl.constexpr):
    """The PDL handshake (module docstring): wait for the predecessor, then release the successor.
    (kernels/engine/pdl.py's `pdl_enter` for the engine's kernels; this file keeps its own because HF
    bundles ship it verbatim, importing nothing of the project: a family's bundle writer copies it.)"""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


def _launch_pdl(pdl: bool) -> dict:
    # the launch option only when asked: the default launch stays exactly what it was
    return {"launch_pdl": True} if pdl else {}


@triton.jit
def _reduce_partials(pval_ptr, pidx_ptr, b, bmask, NP, BLOCK_NP: tl.constexpr):
    """Stage 2 of the argmax: (value, id) partials [B, NP] -> best id per row.

    One load wave (BLOCK_NP >= NP): a loop over NP chunks put one L2 round trip per chunk on
    the critical path of every step.
    """
    n = tl.arange(0, BLOCK_NP)
    m2 = bmask[None, :] & (n < NP)[:, None]
    pv = tl.load(pval_ptr + b[None, :] * NP + n[:, None], mask=m2, other=float("-inf"))
    pi = tl.load(pidx_ptr + b[None, :] * NP + n[:, None], mask=m2, other=_BIG)
    best = tl.max(pv, 0)
    return tl.min(tl.where(pv == best[None, :], pi, _BIG), 0)


@triton.jit
def _whh_gemv(pid, h_ptr, whh_ptr, gh_ptr, B, G: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_GH: tl.constexpr,
              GH_BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """gh[b, rows] = W_hh[rows] · S[b] for BLOCK_GH of the 3G rows (fp32 out).

    Runs as extra programs of the previous slot's scoring kernel: W_hh·S_{j-1} does not depend
    on the token drafted at slot j-1, so it leaves the step's critical path (the GRU step that
    did it inline took 8.3 us at Qwen3-8B shapes, batch 1, on the H200: bench w2/gru sweeps).
    """
    b = tl.arange(0, BLOCK_B)
    bmask = b < B
    rows = pid * BLOCK_GH + tl.arange(0, BLOCK_GH)
    rmask = rows < 3 * G
    acc = tl.zeros((BLOCK_GH, BLOCK_B), dtype=tl.float32)
    for k0 in range(0, G, GH_BLOCK_K):
        kk = k0 + tl.arange(0, GH_BLOCK_K)
        kmask = kk < G
        h_t = tl.load(h_ptr + b[None, :] * G + kk[:, None], mask=bmask[None, :] & kmask[:, None], other=0.0)
        w = tl.load(whh_ptr + rows[:, None] * G + kk[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0,
                    eviction_policy="evict_last")  # read every step: keep it in L2 while W2 streams past
        acc += tl.dot(w, h_t, input_precision=DOT_PRECISION)
    tl.store(gh_ptr + b[None, :] * (3 * G) + rows[:, None], acc, mask=rmask[:, None] & bmask[None, :])


@triton.jit
def _whh_gemv_kernel(h_ptr, whh_ptr, gh_ptr, B, G: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_GH: tl.constexpr,
                     GH_BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr, PDL: tl.constexpr):
    _pdl_enter(PDL)
    _whh_gemv(tl.program_id(0), h_ptr, whh_ptr, gh_ptr, B, G, BLOCK_B, BLOCK_GH, GH_BLOCK_K, DOT_PRECISION)


# G and R are compile-time constants (one compile per head shape): with a runtime R the
# masks along r hid the 16-byte alignment and ptxas got 2-byte loads for W2 (PTX, sm_90).
#
# Layout note: every matrix product is computed transposed, weights as the left operand
# ([rows of W, k] @ [k, batch]), because the batch (1..32) is the small dimension: the weight
# tile then feeds the tensor cores as the large M side and the accumulators stay small.
# The first version (batch on the left) used 255 registers a thread and spilled (ptxas, sm_90).


@triton.jit
def _gru_step_kernel(
    tok_ptr, pval_ptr, pidx_ptr, NP, draft_ptr, draft_stride, draft_col,
    table_ptr, gh_ptr, h_prev_ptr, h_out_ptr, w1b_ptr, zacc_ptr,
    B, G: tl.constexpr, R: tl.constexpr,
    TOKEN_FROM_PARTIALS: tl.constexpr, HAS_GH: tl.constexpr, ADD_Z: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_NP: tl.constexpr, BLOCK_R: tl.constexpr,
    DOT_PRECISION: tl.constexpr, PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    b = tl.arange(0, BLOCK_B)
    bmask = b < B
    g = pid * BLOCK_G + tl.arange(0, BLOCK_G)
    gmask = g < G
    m2 = gmask[:, None] & bmask[None, :]
    # everything that does not depend on the token is loaded first, so its latency overlaps;
    # W1b (a weight) even before the PDL wait
    if ADD_Z:
        rr = tl.arange(0, BLOCK_R)
        rmask = rr < R
        w1b = tl.load(w1b_ptr + rr[:, None] * G + g[None, :], mask=rmask[:, None] & gmask[None, :], other=0.0)
    _pdl_enter(PDL)
    if HAS_GH:  # W_hh·S_{j-1}, precomputed by the previous scoring kernel; S_0 = 0 needs none
        gh = gh_ptr + b[None, :] * (3 * G) + g[:, None]
        gh_r = tl.load(gh, mask=m2, other=0.0)
        gh_z = tl.load(gh + G, mask=m2, other=0.0)
        gh_n = tl.load(gh + 2 * G, mask=m2, other=0.0)
        h_old = tl.load(h_prev_ptr + b[None, :] * G + g[:, None], mask=m2, other=0.0)
    if TOKEN_FROM_PARTIALS:
        tok = _reduce_partials(pval_ptr, pidx_ptr, b, bmask, NP, BLOCK_NP)
        # the previous slot's draft id: written once, by program 0
        tl.store(draft_ptr + b * draft_stride + draft_col, tok.to(tl.int64), mask=bmask & ((b * 0 + pid) == 0))
        tok = tl.where(bmask, tok, 0)  # padded rows: keep their (masked) table reads in bounds
    else:
        tok = tl.load(tok_ptr + b, mask=bmask, other=0)
    tok = tok.to(tl.int64)

    row = table_ptr + tok[None, :] * (3 * G) + g[:, None]
    gi_r = tl.load(row, mask=m2, other=0.0).to(tl.float32)
    gi_z = tl.load(row + G, mask=m2, other=0.0).to(tl.float32)
    gi_n = tl.load(row + 2 * G, mask=m2, other=0.0).to(tl.float32)
    if HAS_GH:
        h_new = _gru_cell(gi_r, gi_z, gi_n, gh_r, gh_z, gh_n, h_old.to(tl.float32))
    else:
        z = _sigmoid(gi_z)
        h_new = (1.0 - z) * _tanh(gi_n)
    h_new = tl.where(m2, h_new, 0.0).to(h_out_ptr.dtype.element_ty)  # [BLOCK_G, BLOCK_B], zero outside
    tl.store(h_out_ptr + b[None, :] * G + g[:, None], h_new, mask=m2)

    if ADD_Z:
        part = tl.dot(w1b, h_new, input_precision=DOT_PRECISION)  # [BLOCK_R, BLOCK_B]
        # relaxed: the kernel boundary orders these adds before their reader
        tl.atomic_add(zacc_ptr + b[None, :] * R + rr[:, None], part, mask=rmask[:, None] & bmask[None, :],
                      sem="relaxed")


@triton.jit
def _w2_score(pid, base_ptr, base_stride_b, zacc_ptr, w2_ptr, pval_ptr, pidx_ptr, logits_ptr,
              B, V, R: tl.constexpr, v_per_prog, NP, reverse,
              HAS_DELTA: tl.constexpr, WRITE_LOGITS: tl.constexpr,
              BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr, R_CHUNKS: tl.constexpr,
              DOT_PRECISION: tl.constexpr, PIN_W2: tl.constexpr, STREAM_W2: tl.constexpr):
    b = tl.arange(0, BLOCK_B)
    bmask = b < B
    best_val = tl.full((BLOCK_B,), float("-inf"), tl.float32)
    best_idx = tl.full((BLOCK_B,), _BIG, tl.int32)
    v_start = pid * v_per_prog
    v_end = tl.minimum(v_start + v_per_prog, V)
    n_tiles = tl.cdiv(tl.maximum(v_end - v_start, 0), BLOCK_V)
    for i in range(0, n_tiles):
        # reverse = 1 walks this program's rows last tile first. Alternating the direction from one
        # corrected step to the next starts each scan on the rows the previous scan read last, which
        # are still in L2 (W2 is larger than the L2, so a same-direction scan finds none of its
        # first rows there). The argmax merge below is order-free: the tokens do not change.
        v0 = v_start + (i + reverse * (n_tiles - 1 - 2 * i)) * BLOCK_V
        v = v0 + tl.arange(0, BLOCK_V)
        vmask = v < v_end
        m2 = vmask[:, None] & bmask[None, :]
        logits = tl.load(base_ptr + b[None, :] * base_stride_b + v[:, None], mask=m2, other=0.0,
                         eviction_policy="evict_first").to(tl.float32)  # [BLOCK_V, BLOCK_B]
        if HAS_DELTA:
            acc = tl.zeros((BLOCK_V, BLOCK_B), dtype=tl.float32)
            for c in tl.static_range(R_CHUNKS):
                rr = c * BLOCK_R + tl.arange(0, BLOCK_R)
                rmask = rr < R
                zp = tl.load(zacc_ptr + b[None, :] * R + rr[:, None], mask=rmask[:, None] & bmask[None, :], other=0.0)
                w_ptrs = w2_ptr + v[:, None].to(tl.int64) * R + rr[None, :]
                wmask = vmask[:, None] & rmask[None, :]
                if PIN_W2:  # this program's rows stay in L2 for the next step (see _w2_score_split)
                    w = tl.load(w_ptrs, mask=wmask, other=0.0, eviction_policy="evict_last")  # [BLOCK_V, BLOCK_R]
                elif STREAM_W2:
                    w = tl.load(w_ptrs, mask=wmask, other=0.0, eviction_policy="evict_first")
                else:  # the L2's own replacement: what was read last stays (the zig-zag scan wants that)
                    w = tl.load(w_ptrs, mask=wmask, other=0.0)
                z = (zp * _sigmoid(zp)).to(w.dtype)  # SiLU, then the weights' dtype for the dot
                acc += tl.dot(w, z, input_precision=DOT_PRECISION)
            logits += acc
        logits = tl.where(m2, logits, float("-inf"))
        if WRITE_LOGITS:
            tl.store(logits_ptr + v[:, None] * B + b[None, :], logits, mask=m2)  # [V, B]: the tile's own layout
        cmax = tl.max(logits, 0)
        cidx = tl.min(tl.where(logits == cmax[None, :], v[:, None], _BIG), 0)
        better = (cmax > best_val) | ((cmax == best_val) & (cidx < best_idx))
        best_val = tl.where(better, cmax, best_val)
        best_idx = tl.where(better, cidx, best_idx)
    tl.store(pval_ptr + b * NP + pid, best_val, mask=bmask)
    tl.store(pidx_ptr + b * NP + pid, best_idx, mask=bmask)


@triton.jit
def _w2_score_split(spid, pin_progs, base_ptr, base_stride_b, zacc_ptr, w2_ptr, pval_ptr, pidx_ptr, logits_ptr,
                    B, V, R: tl.constexpr, v_per_prog, NP, reverse,
                    HAS_DELTA: tl.constexpr, WRITE_LOGITS: tl.constexpr, HAS_PIN: tl.constexpr,
                    BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr, R_CHUNKS: tl.constexpr,
                    DOT_PRECISION: tl.constexpr, STREAM_W2: tl.constexpr):
    """Scoring program `spid`: the first `pin_progs` programs (the first rows of W2) load W2 with
    evict_last, the rest with evict_first (STREAM_W2) or the default policy. W2 (77.8 MB at Qwen3-8B shapes) is re-read at every
    corrected step but does not fit the H200's L2 (~50 MB): streamed whole, each step evicts what
    the next one needs; pinned in part, that part is served from L2 from the second step on."""
    if HAS_PIN:
        if spid < pin_progs:
            _w2_score(spid, base_ptr, base_stride_b, zacc_ptr, w2_ptr, pval_ptr, pidx_ptr, logits_ptr,
                      B, V, R, v_per_prog, NP, reverse, HAS_DELTA, WRITE_LOGITS, BLOCK_B, BLOCK_V, BLOCK_R,
                      R_CHUNKS, DOT_PRECISION, True, STREAM_W2)
        else:
            _w2_score(spid, base_ptr, base_stride_b, zacc_ptr, w2_ptr, pval_ptr, pidx_ptr, logits_ptr,
                      B, V, R, v_per_prog, NP, reverse, HAS_DELTA, WRITE_LOGITS, BLOCK_B, BLOCK_V, BLOCK_R,
                      R_CHUNKS, DOT_PRECISION, False, STREAM_W2)
    else:
        _w2_score(spid, base_ptr, base_stride_b, zacc_ptr, w2_ptr, pval_ptr, pidx_ptr, logits_ptr,
                  B, V, R, v_per_prog, NP, reverse, HAS_DELTA, WRITE_LOGITS, BLOCK_B, BLOCK_V, BLOCK_R,
                  R_CHUNKS, DOT_PRECISION, False, STREAM_W2)


@triton.jit
def _w2_argmax_kernel(
    base_ptr, base_stride_b, zacc_ptr, w2_ptr, pval_ptr, pidx_ptr, logits_ptr,
    h_ptr, whh_ptr, gh_ptr, NGH, pin_progs,
    B, V, R: tl.constexpr, v_per_prog, NP, G: tl.constexpr, reverse,
    HAS_DELTA: tl.constexpr, WRITE_LOGITS: tl.constexpr, HAS_GH: tl.constexpr, HAS_PIN: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr, R_CHUNKS: tl.constexpr,
    BLOCK_GH: tl.constexpr, GH_BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr, STREAM_W2: tl.constexpr,
    PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    _pdl_enter(PDL)
    if HAS_GH:
        # the first NGH programs compute the next step's W_hh·S (they start first, alongside the scan)
        if pid < NGH:
            _whh_gemv(pid, h_ptr, whh_ptr, gh_ptr, B, G, BLOCK_B, BLOCK_GH, GH_BLOCK_K, DOT_PRECISION)
        else:
            _w2_score_split(pid - NGH, pin_progs, base_ptr, base_stride_b, zacc_ptr, w2_ptr, pval_ptr, pidx_ptr,
                            logits_ptr, B, V, R, v_per_prog, NP, reverse, HAS_DELTA, WRITE_LOGITS, HAS_PIN, BLOCK_B,
                            BLOCK_V, BLOCK_R, R_CHUNKS, DOT_PRECISION, STREAM_W2)
    else:
        _w2_score_split(pid, pin_progs, base_ptr, base_stride_b, zacc_ptr, w2_ptr, pval_ptr, pidx_ptr, logits_ptr,
                        B, V, R, v_per_prog, NP, reverse, HAS_DELTA, WRITE_LOGITS, HAS_PIN, BLOCK_B, BLOCK_V,
                        BLOCK_R, R_CHUNKS, DOT_PRECISION, STREAM_W2)


@triton.jit
def _pool_score(pid, b, ids_ptr, vals_ptr, pool_stride_b, zacc_ptr, w2_ptr, pval_ptr, pidx_ptr, logits_ptr,
                P, R: tl.constexpr, p_per_prog, NP,
                WRITE_LOGITS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_R: tl.constexpr, R_CHUNKS: tl.constexpr):
    best_val = tl.full((1,), float("-inf"), tl.float32)
    best_idx = tl.full((1,), _BIG, tl.int32)
    p_start = pid * p_per_prog
    p_end = tl.minimum(p_start + p_per_prog, P)
    for p0 in range(p_start, p_end, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        pmask = p < p_end
        ids = tl.load(ids_ptr + b * pool_stride_b + p, mask=pmask, other=0)
        logits = tl.load(vals_ptr + b * pool_stride_b + p, mask=pmask, other=0.0).to(tl.float32)
        for c in tl.static_range(R_CHUNKS):
            rr = c * BLOCK_R + tl.arange(0, BLOCK_R)
            rmask = rr < R
            zp = tl.load(zacc_ptr + b * R + rr, mask=rmask, other=0.0)
            w = tl.load(w2_ptr + ids[:, None].to(tl.int64) * R + rr[None, :], mask=pmask[:, None] & rmask[None, :],
                        other=0.0)
            # round z to the weights' dtype like the full-vocab dot does, then accumulate in fp32
            z = (zp * _sigmoid(zp)).to(w.dtype).to(tl.float32)
            logits += tl.sum(w.to(tl.float32) * z[None, :], 1)
        logits = tl.where(pmask, logits, float("-inf"))
        if WRITE_LOGITS:
            tl.store(logits_ptr + b * P + p, logits, mask=pmask)
        cmax = tl.max(logits, 0)
        cidx = tl.min(tl.where(logits == cmax, ids.to(tl.int32), _BIG), 0)
        better = (cmax > best_val) | ((cmax == best_val) & (cidx < best_idx))
        best_val = tl.where(better, cmax, best_val)
        best_idx = tl.where(better, cidx, best_idx)
    o = tl.arange(0, 1)
    tl.store(pval_ptr + b * NP + pid + o, best_val)
    tl.store(pidx_ptr + b * NP + pid + o, best_idx)


@triton.jit
def _pool_argmax_kernel(
    ids_ptr, vals_ptr, pool_stride_b, zacc_ptr, w2_ptr, pval_ptr, pidx_ptr, logits_ptr,
    h_ptr, whh_ptr, gh_ptr, NGH,
    B, P, R: tl.constexpr, p_per_prog, NP, G: tl.constexpr,
    WRITE_LOGITS: tl.constexpr, HAS_GH: tl.constexpr, BLOCK_B: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_R: tl.constexpr, R_CHUNKS: tl.constexpr,
    BLOCK_GH: tl.constexpr, GH_BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr, PDL: tl.constexpr,
):
    # 1-D grid: [NGH W_hh programs][B x NP scoring programs]; rows gather different W2 rows, so
    # each scoring program serves one row
    pid = tl.program_id(0)
    _pdl_enter(PDL)
    if HAS_GH:
        if pid < NGH:
            _whh_gemv(pid, h_ptr, whh_ptr, gh_ptr, B, G, BLOCK_B, BLOCK_GH, GH_BLOCK_K, DOT_PRECISION)
        else:
            q = pid - NGH
            _pool_score(q % NP, q // NP, ids_ptr, vals_ptr, pool_stride_b, zacc_ptr, w2_ptr, pval_ptr, pidx_ptr,
                        logits_ptr, P, R, p_per_prog, NP, WRITE_LOGITS, BLOCK_P, BLOCK_R, R_CHUNKS)
    else:
        _pool_score(pid % NP, pid // NP, ids_ptr, vals_ptr, pool_stride_b, zacc_ptr, w2_ptr, pval_ptr, pidx_ptr,
                    logits_ptr, P, R, p_per_prog, NP, WRITE_LOGITS, BLOCK_P, BLOCK_R, R_CHUNKS)


@triton.jit
def _argmax_finalize_kernel(pval_ptr, pidx_ptr, NP, draft_ptr, draft_stride, draft_col, B,
                            BLOCK_B: tl.constexpr, BLOCK_NP: tl.constexpr, PDL: tl.constexpr):
    _pdl_enter(PDL)
    b = tl.arange(0, BLOCK_B)
    bmask = b < B
    tok = _reduce_partials(pval_ptr, pidx_ptr, b, bmask, NP, BLOCK_NP)
    tl.store(draft_ptr + b * draft_stride + draft_col, tok.to(tl.int64), mask=bmask)


@triton.jit
def _bucket_max_kernel(base_ptr, stride_b, stride_k, NK, V, P, SMAX, vals_ptr, ids_ptr,
                       BLOCK_P: tl.constexpr, BLOCK_S: tl.constexpr):
    """Pool candidates of one row (b, k): the max of each of P contiguous V buckets.

    Bucket p = [p·V // P, (p+1)·V // P): sizes differ by at most one, none is empty (V >= P).
    Exact ties inside a bucket go to the lowest id (the tile scan runs in increasing id order
    and only a strictly better value replaces the running best)."""
    row = tl.program_id(0)
    b = row // NK
    k = row % NK
    p = tl.program_id(1) * BLOCK_P + tl.arange(0, BLOCK_P)
    pmask = p < P
    start = (p.to(tl.int64) * V) // P
    end = ((p.to(tl.int64) + 1) * V) // P
    src = base_ptr + b.to(tl.int64) * stride_b + k.to(tl.int64) * stride_k
    best_val = tl.full((BLOCK_P,), float("-inf"), tl.float32)
    best_idx = tl.full((BLOCK_P,), _BIG, tl.int64)
    for s0 in range(0, SMAX, BLOCK_S):
        idx = start[:, None] + s0 + tl.arange(0, BLOCK_S)[None, :]
        m = pmask[:, None] & (idx < end[:, None])
        x = tl.load(src + idx, mask=m, other=float("-inf")).to(tl.float32)  # [BLOCK_P, BLOCK_S]
        cmax = tl.max(x, 1)
        cidx = tl.min(tl.where(m & (x == cmax[:, None]), idx, _BIG), 1)
        better = (cmax > best_val) | ((cmax == best_val) & (cidx < best_idx))
        best_val = tl.where(better, cmax, best_val)
        best_idx = tl.where(better, cidx, best_idx)
    out = row.to(tl.int64) * P + p
    tl.store(vals_ptr + out, best_val, mask=pmask)
    tl.store(ids_ptr + out, best_idx, mask=pmask)


@triton.jit
def _slot_max_kernel(base_ptr, stride_b, stride_k, NK, V, out_ptr, BLOCK_V: tl.constexpr):
    """out[b, v] = max over the NK slots of base[b, k, v], for one row b and one V tile: the
    score `block_shared` ranks (the max of equal-dtype values is exact, so it is the same number
    torch.amax gives)."""
    b = tl.program_id(0)
    v = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    vmask = v < V
    src = base_ptr + b.to(tl.int64) * stride_b + v
    best = tl.full((BLOCK_V,), float("-inf"), tl.float32)
    for k in range(0, NK):
        best = tl.maximum(best, tl.load(src + k * stride_k, mask=vmask, other=float("-inf")).to(tl.float32))
    tl.store(out_ptr + b.to(tl.int64) * V + v, best, mask=vmask)


# ----------------------------------------------------------------------------- wrappers


def _pow2(n: int, floor: int = 16) -> int:
    return max(floor, triton.next_power_of_2(int(n)))


def dot_precision(dtype: torch.dtype) -> str:
    # fp32 weights: true fp32 dots (Triton's default for fp32 is tf32, ~3e-4 relative).
    return "ieee" if dtype == torch.float32 else "tf32"


def _gh_args(gh, bsz, block_gh, gh_block_k):
    """(h, whh, out) -> kernel args for the fused W_hh·S programs; None -> disabled."""
    if gh is None:
        return dict(args=(None, None, None, 0), g=1, has=False, n=0, block_gh=16, block_k=16)
    h, whh, out = gh
    g = h.shape[1]
    n = triton.cdiv(3 * g, block_gh)
    return dict(args=(h, whh, out, n), g=g, has=True, n=n, block_gh=block_gh, block_k=min(gh_block_k, _pow2(g)))


def whh_gemv(*, h, whh, gh, block_gh=32, gh_block_k=256, num_warps=4, pdl=False):
    """gh [B, 3G] fp32 = S [B, G] · W_hh^T, alone (sampling mode's pure slots have no scoring kernel)."""
    bsz, g = h.shape
    _whh_gemv_kernel[(triton.cdiv(3 * g, block_gh),)](
        h, whh, gh, bsz, G=g, BLOCK_B=_pow2(bsz), BLOCK_GH=block_gh, GH_BLOCK_K=min(gh_block_k, _pow2(g)),
        DOT_PRECISION=dot_precision(whh.dtype), PDL=pdl, num_warps=num_warps, **_launch_pdl(pdl))


def gru_step(*, table, h_prev, h_out, gh=None, tok=None, partials=None, draft=None, draft_col=0,
             w1b=None, zacc=None, block_g=16, num_warps=None, pdl=False):
    """One GRU step for all rows; see the module docstring. Shapes: table [Vt, 3G], gh [B, 3G] fp32
    (W_hh·S_{j-1}; None when S_{j-1} = 0), h_prev/h_out [B, G] (weight dtype), tok [B] int,
    partials=(pval, pidx) [B, NP], draft [B, K] int64, w1b [r, G], zacc [B, r] fp32 (accumulated into)."""
    bsz, g = h_prev.shape
    from_partials = partials is not None
    pval, pidx = partials if from_partials else (h_prev, h_prev)
    np_ = pval.shape[1] if from_partials else 1
    add_z = zacc is not None
    r = w1b.shape[0] if add_z else 1
    block_b, block_np = _pow2(bsz), _pow2(np_, 2) if from_partials else 2
    if num_warps is None:
        # the one-wave partial tile is [BLOCK_NP, BLOCK_B] fp32 + int32: keep it <= 64 registers a thread
        num_warps = max(4, min(16, block_b * block_np * 2 // (64 * 32)))
    _gru_step_kernel[(triton.cdiv(g, block_g),)](
        tok if tok is not None else h_prev, pval, pidx, np_,
        draft if draft is not None else h_prev, draft.stride(0) if draft is not None else 0, draft_col,
        table, gh if gh is not None else h_prev, h_prev, h_out, w1b if add_z else h_prev,
        zacc if add_z else h_prev,
        bsz, G=g, R=r,
        TOKEN_FROM_PARTIALS=from_partials, HAS_GH=gh is not None, ADD_Z=add_z,
        BLOCK_B=block_b, BLOCK_G=block_g, BLOCK_NP=block_np, BLOCK_R=_pow2(r),
        DOT_PRECISION=dot_precision(table.dtype), PDL=pdl, num_warps=num_warps, **_launch_pdl(pdl),
    )


def w2_argmax(*, base, pval, pidx, zacc=None, w2=None, logits=None, gh=None, block_v=128, block_r=128,
              num_warps=8, num_stages=3, block_gh=32, gh_block_k=256, pin_programs=0, reverse=False, stream=True,
              pdl=False):
    """Fused base + W2·SiLU(zacc) and stage-1 argmax. base [B, V] (row stride free, last dim
    contiguous), zacc [B, r] fp32, w2 [V, r], pval/pidx [B, NP] (NP = scoring programs, set by the
    caller), logits [V, B] fp32 (optional, for sampling; note the layout), gh = (S [B, G], W_hh,
    out [B, 3G] fp32): also compute the next step's W_hh·S in extra programs. The first
    `pin_programs` scoring programs keep their W2 rows in L2 (evict_last); see `l2_pin_programs`.
    reverse: each program scans its rows last tile first (same result); stream: W2 loads marked
    evict_first (False: the L2's default policy, for a zig-zag of alternating `reverse`)."""
    bsz, v = base.shape
    np_ = pval.shape[1]
    has_delta = w2 is not None
    r = w2.shape[1] if has_delta else 1
    br = min(block_r, _pow2(r))
    if logits is not None or (has_delta and w2.element_size() > 2):
        # fp32 tiles or the extra logits store: 3 stages of [128, 256] tiles would need up to
        # 278 KB of shared memory, over sm_90's 227 KB (ptxas report); halve the tile, 2 stages
        block_v, num_stages = min(block_v, 64), min(num_stages, 2)
    if has_delta and w2.element_size() > 2:
        br = min(br, 64)  # fp32 "ieee" dots run on FMA units: [64, 256] tiles spilled 5-14 KB of stack
    v_per_prog = triton.cdiv(triton.cdiv(v, np_), block_v) * block_v
    ga = _gh_args(gh, bsz, block_gh, gh_block_k)
    wdt = w2.dtype if has_delta else (gh[1].dtype if gh is not None else torch.float32)
    _w2_argmax_kernel[(np_ + ga["n"],)](
        base, base.stride(0), zacc if has_delta else base, w2 if has_delta else base, pval, pidx,
        logits if logits is not None else pval,
        *(a if a is not None else pval for a in ga["args"][:3]), ga["args"][3], int(pin_programs),
        bsz, v, R=r, v_per_prog=v_per_prog, NP=np_, G=ga["g"], reverse=int(bool(reverse)),
        HAS_DELTA=has_delta, WRITE_LOGITS=logits is not None, HAS_GH=ga["has"],
        HAS_PIN=has_delta and pin_programs > 0,
        BLOCK_B=_pow2(bsz), BLOCK_V=block_v, BLOCK_R=br, R_CHUNKS=triton.cdiv(r, br),
        BLOCK_GH=ga["block_gh"], GH_BLOCK_K=ga["block_k"], DOT_PRECISION=dot_precision(wdt),
        STREAM_W2=bool(stream), PDL=pdl, num_warps=num_warps, num_stages=num_stages, **_launch_pdl(pdl),
    )


def w2_programs(vocab: int, block_v: int, target: int) -> int:
    """Scoring programs for `w2_argmax`: ~`target` (a multiple of the SM count), never more than tiles."""
    return max(1, min(target, triton.cdiv(vocab, block_v)))


def l2_pin_programs(fraction: float, programs: int) -> int:
    """Scoring programs (of `programs`, each a contiguous V range) whose W2 rows are pinned in L2:
    the first `fraction` of W2, rounded to whole programs."""
    return max(0, min(programs, round(float(fraction) * programs)))


def pool_argmax(*, ids, vals, zacc, w2, pval, pidx, logits=None, gh=None, block_p=32, block_r=128, num_warps=4,
                block_gh=32, gh_block_k=256, pdl=False):
    """Pool scoring: ids/vals [B, P] (the slot's candidates and their base logits; same strides),
    zacc [B, r] fp32, w2 [V, r]; pval/pidx [B, NP] with NP programs per row; gh as in w2_argmax."""
    bsz, p = ids.shape
    np_ = pval.shape[1]
    p_per_prog = triton.cdiv(triton.cdiv(p, np_), block_p) * block_p
    r = w2.shape[1]
    br = min(block_r, _pow2(r))
    ga = _gh_args(gh, bsz, block_gh, gh_block_k)
    _pool_argmax_kernel[(np_ * bsz + ga["n"],)](
        ids, vals, ids.stride(0), zacc, w2, pval, pidx, logits if logits is not None else pval,
        *(a if a is not None else pval for a in ga["args"][:3]), ga["args"][3],
        bsz, p, R=r, p_per_prog=p_per_prog, NP=np_, G=ga["g"],
        WRITE_LOGITS=logits is not None, HAS_GH=ga["has"], BLOCK_B=_pow2(bsz),
        BLOCK_P=block_p, BLOCK_R=br, R_CHUNKS=triton.cdiv(r, br),
        BLOCK_GH=ga["block_gh"], GH_BLOCK_K=ga["block_k"], DOT_PRECISION=dot_precision(w2.dtype),
        PDL=pdl, num_warps=num_warps, **_launch_pdl(pdl),
    )


def argmax_finalize(*, pval, pidx, draft, draft_col, pdl=False):
    bsz, np_ = pval.shape
    block_b, block_np = _pow2(bsz), _pow2(np_, 2)
    _argmax_finalize_kernel[(1,)](pval, pidx, np_, draft, draft.stride(0), draft_col, bsz,
                                  BLOCK_B=block_b, BLOCK_NP=block_np, PDL=pdl,
                                  num_warps=max(4, min(16, block_b * block_np * 2 // (64 * 32))), **_launch_pdl(pdl))


def _pool_outputs(base, pool: int, who: str):
    """Checks of a pool selection's input base [B, N, V] (made last-dim contiguous) and its
    outputs: (base, vals [B, N, pool] fp32, ids [B, N, pool] int64)."""
    bsz, n, v = base.shape
    if base.stride(-1) != 1:
        base = base.contiguous()
    if not 0 < pool <= v:
        raise ValueError(f"{who}: pool {pool} must be in 1..V={v}")
    vals = torch.empty(bsz, n, pool, device=base.device, dtype=torch.float32)
    ids = torch.empty(bsz, n, pool, device=base.device, dtype=torch.int64)
    return base, vals, ids


def bucket_max(base, pool: int, *, block_p: int = 16, block_s: int = 128, num_warps: int = 4):
    """Approximate top-`pool` candidates of base [B, N, V] (last dim contiguous, other strides
    free): the max of each of `pool` contiguous V buckets, ids ascending, in ONE launch.
    -> (vals [B, N, pool] fp32, ids [B, N, pool] int64). Same result as
    `reference.bucket_candidates` (the PyTorch definition), ties included."""
    base, vals, ids = _pool_outputs(base, pool, "bucket_max")
    bsz, n, v = base.shape
    if bsz * n == 0:
        return vals, ids
    smax = triton.cdiv(v, pool)  # the largest bucket
    bs = min(block_s, _pow2(smax, 2))
    _bucket_max_kernel[(bsz * n, triton.cdiv(pool, block_p))](
        base, base.stride(0), base.stride(1), n, v, pool, smax, vals, ids,
        BLOCK_P=block_p, BLOCK_S=bs, num_warps=num_warps)
    return vals, ids


def block_shared(base, pool: int, *, block_v: int = 1024, num_warps: int = 4):
    """SGLang's candidates for base [B, N, V] (the N corrected slots): ONE pool per row, the
    top-`pool` of each token's max over the N slots, repeated for every slot. -> (vals [B, N, pool]
    fp32: each slot's own base logits at the pool's ids, ids [B, N, pool] int64). Same result as
    `reference.block_shared_ids` (the PyTorch definition): the max runs here, the top-k is
    torch.topk on the same values in the same dtype, so the same set in the same order."""
    base, vals, ids = _pool_outputs(base, pool, "block_shared")
    bsz, n, v = base.shape
    if bsz * n == 0:
        return vals, ids
    best = torch.empty(bsz, v, device=base.device, dtype=torch.float32)
    _slot_max_kernel[(bsz, triton.cdiv(v, block_v))](base, base.stride(0), base.stride(1), n, v, best,
                                                     BLOCK_V=block_v, num_warps=num_warps)
    # back to the logits' dtype (exact: every max is one of its values), so torch.topk sees what the
    # reference's topk sees and breaks boundary ties alike
    shared = torch.topk(best.to(base.dtype), pool, dim=-1, sorted=False).indices
    ids.copy_(shared[:, None, :].expand(bsz, n, pool))
    vals.copy_(base.gather(-1, ids))
    return vals, ids


# ----------------------------------------------------------------------------- radix select
#
# "radix" pool candidates (`radix_select`): the exact top-P of each row by a two-level radix
# select on an order-preserving integer key, in four small launches over a [rows, chunks] grid
# (every program one chunk of one row: the whole GPU works on a batch-1 selection) plus one
# memset. Semantics: `reference.radix_candidates`.

RADIX_BITS = 12  # bins per level: 4096; two levels resolve the key's top 24 bits
RADIX_BINS = 1 << RADIX_BITS


@triton.jit
def _radix_key24(x):
    """fp32 -> int32 whose signed order is the float order (-0.0 just below +0.0), top 24 bits
    (arithmetic shift): exact for bf16/fp16 values, 15 mantissa bits of fp32."""
    i = x.to(tl.int32, bitcast=True)
    return tl.where(i < 0, i ^ 0x7FFFFFFF, i) >> 8


@triton.jit
def _radix_threshold(hist_ptr, need, NB: tl.constexpr):
    """Bin t of histogram [NB] where the count from the top first reaches `need`, and the count
    strictly above it."""
    i = tl.arange(0, NB)
    h = tl.load(hist_ptr + i)
    incl = tl.cumsum(h, 0, reverse=True)  # incl[i] = elements in bins >= i
    t = tl.max(tl.where(incl >= need, i, -1), 0)
    above = tl.sum(tl.where(i > t, h, 0), 0)
    return t, above


@triton.jit
def _radix_chunk(base_ptr, stride_b, stride_k, NK, V, BLOCK: tl.constexpr):
    """(row, chunk) of the [rows, chunks] grid -> (row, offsets, mask, 24-bit keys) of its chunk."""
    row = tl.program_id(0)
    src = base_ptr + (row // NK).to(tl.int64) * stride_b + (row % NK).to(tl.int64) * stride_k
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < V
    x = tl.load(src + offs, mask=m, other=0.0).to(tl.float32)
    return row, offs, m, x, _radix_key24(x)


@triton.jit
def _radix_hist_kernel(base_ptr, stride_b, stride_k, NK, V, hist_ptr, P, LEVEL2: tl.constexpr,
                       BLOCK: tl.constexpr, NB: tl.constexpr):
    """Level 1: histogram of the key's top 12 bits. Level 2: of the next 12 bits, over the elements
    in the level-1 boundary bin only. Per-chunk histograms added into hist[row] (zeroed before)."""
    row, offs, m, x, k24 = _radix_chunk(base_ptr, stride_b, stride_k, NK, V, BLOCK)
    h1_ptr = hist_ptr + row.to(tl.int64) * NB
    if LEVEL2:
        t1, _ = _radix_threshold(h1_ptr, P, NB)
        h = tl.histogram(k24 & (NB - 1), NB, mask=m & ((k24 >> 12) + NB // 2 == t1))
        out = h1_ptr + tl.num_programs(0).to(tl.int64) * NB  # hist[1, row]
    else:
        h = tl.histogram((k24 >> 12) + NB // 2, NB, mask=m)
        out = h1_ptr
    tl.atomic_add(out + tl.arange(0, NB), h, mask=h > 0)  # only the bins this chunk touches


@triton.jit
def _radix_count_kernel(base_ptr, stride_b, stride_k, NK, V, hist_ptr, P, thr_ptr, cnt_ptr, NCH,
                        BLOCK: tl.constexpr, NB: tl.constexpr):
    """The 24-bit threshold key T of the row (the P-th largest key), and this chunk's counts of
    keys > T and == T -> cnt[row, chunk, 0 / 1]."""
    row, offs, m, x, k24 = _radix_chunk(base_ptr, stride_b, stride_k, NK, V, BLOCK)
    h1_ptr = hist_ptr + row.to(tl.int64) * NB
    t1, above1 = _radix_threshold(h1_ptr, P, NB)
    t2, _ = _radix_threshold(h1_ptr + tl.num_programs(0).to(tl.int64) * NB, P - above1, NB)
    thr = (t1 - NB // 2) * NB + t2
    ch = tl.program_id(1)
    if ch == 0:
        tl.store(thr_ptr + row, thr)
    c = cnt_ptr + (row.to(tl.int64) * NCH + ch) * 2
    tl.store(c, tl.sum((m & (k24 > thr)).to(tl.int32), 0))
    tl.store(c + 1, tl.sum((m & (k24 == thr)).to(tl.int32), 0))


@triton.jit
def _radix_write_kernel(base_ptr, stride_b, stride_k, NK, V, P, thr_ptr, cnt_ptr, NCH, vals_ptr, ids_ptr,
                        BLOCK: tl.constexpr, BLOCK_C: tl.constexpr):
    """Compaction: the keys > T in increasing id order, then the keys == T in increasing id order
    while slots remain (P slots in all). Each chunk's offsets: exclusive prefix sums of the chunk
    counts, so the output order does not depend on scheduling."""
    row, offs, m, x, k24 = _radix_chunk(base_ptr, stride_b, stride_k, NK, V, BLOCK)
    ch = tl.program_id(1)
    thr = tl.load(thr_ptr + row)
    j = tl.arange(0, BLOCK_C)
    c = cnt_ptr + row.to(tl.int64) * NCH * 2 + j * 2
    n_above = tl.load(c, mask=j < NCH, other=0)
    n_eq = tl.load(c + 1, mask=j < NCH, other=0)
    total_above = tl.sum(n_above, 0)
    before_above = tl.sum(tl.where(j < ch, n_above, 0), 0)
    before_eq = tl.sum(tl.where(j < ch, n_eq, 0), 0)
    above = m & (k24 > thr)
    eq = m & (k24 == thr)
    pos_above = before_above + tl.cumsum(above.to(tl.int32), 0) - 1
    pos_eq = total_above + before_eq + tl.cumsum(eq.to(tl.int32), 0) - 1
    pos = tl.where(above, pos_above, pos_eq)
    keep = above | (eq & (pos_eq < P))
    out = row.to(tl.int64) * P + pos
    tl.store(vals_ptr + out, x, mask=keep)
    tl.store(ids_ptr + out, offs.to(tl.int64), mask=keep)


def radix_select(base, pool: int, *, block: int = 4096, num_warps: int = 8):
    """Top-`pool` candidates of base [B, N, V] (last dim contiguous, other strides free) by a
    two-level radix select -> (vals [B, N, pool] fp32, ids [B, N, pool] int64), the same as
    `reference.radix_candidates` (values, ids and order). Launches: a memset, two histogram
    passes, a count pass and the compaction, each over [B·N, cdiv(V, block)] programs; no host
    sync, static shapes (CUDA-graph capturable; the histograms are zeroed inside the graph)."""
    base, vals, ids = _pool_outputs(base, pool, "radix_select")
    bsz, n, v = base.shape
    rows = bsz * n
    if rows == 0:
        return vals, ids
    blk = min(int(block), _pow2(v))
    nch = triton.cdiv(v, blk)
    hist = torch.zeros(2, rows, RADIX_BINS, device=base.device, dtype=torch.int32)
    thr = torch.empty(rows, device=base.device, dtype=torch.int32)
    cnt = torch.empty(rows, nch, 2, device=base.device, dtype=torch.int32)
    grid = (rows, nch)
    src = (base, base.stride(0), base.stride(1), n, v)
    for level2 in (False, True):
        _radix_hist_kernel[grid](*src, hist, pool, LEVEL2=level2, BLOCK=blk, NB=RADIX_BINS, num_warps=num_warps)
    _radix_count_kernel[grid](*src, hist, pool, thr, cnt, nch, BLOCK=blk, NB=RADIX_BINS, num_warps=num_warps)
    _radix_write_kernel[grid](*src, pool, thr, cnt, nch, vals, ids, BLOCK=blk, BLOCK_C=_pow2(nch, 2),
                              num_warps=num_warps)
    return vals, ids
