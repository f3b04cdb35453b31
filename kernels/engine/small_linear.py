"""Triton kernels for ``y = x @ w.T`` whose rows never depend on each other: a decode step
(M = 1), a verify of 16 tokens (M = 16) and a batch of 64 verifies (M = 1,024) give a row the
same bits, with the bias and the residual add fused.

At batch 1 a decode step of an 8B model is a chain of matrix-vector products against bf16
weights ``W [N, K]`` (K contiguous); each is bound by reading ``W`` from HBM. On an H200 cuBLAS
runs several of Qwen3-8B's projections at 75-86 % of the read bandwidth and adds a split-K
reduction launch to some (per layer: qkv 15.8 us against a 12.0 us floor, o 10.7 + 1.7 us
against 8.0, down 28.0 + 1.7 us against 24.0); and cuBLAS picks its kernel (split-K or not) by M,
so a row's bits change with the batch (bench/results/linear_rows_probe_h200.json: o and down rows
differ between M <= 17 and M = 1,024). Here:

* ``small_linear(x, w, bias, residual)``: ``x @ w.T (+ bias) (+ residual)``, fp32 accumulation,
  rounded once to x.dtype. The residual in the epilogue makes a layer's ``x + o_proj(attn)`` /
  ``x + down(...)`` one launch.
* ``small_linear_swiglu(x, w_gate_up, bias)``: ``silu(x @ gate.T) * (x @ up.T)`` from the fused
  ``[2I, K]`` weight (gate rows, then up rows), the gate and up tiles of the same columns in one
  program, so the ``[M, 2I]`` intermediate never goes to memory.

Kernel. A program computes a ``[BLOCK_M, BLOCK_N]`` output tile: masked row loads, a loop over
its K range in BLOCK_K chunks with ``tl.dot`` into fp32. With ``SPLIT`` > 1 the K range of each
n-block is cut into SPLIT disjoint fixed ranges (``K_PER_SPLIT``, a multiple of BLOCK_K), the
programs write fp32 partials to a workspace ``[SPLIT, M, N]`` and a second small kernel sums them
in split order (fixed: deterministic, no atomics) and applies bias / residual / silu-mul / the
cast; with SPLIT == 1 the epilogue is in the main kernel (one launch). ``SPLIT_INLINE``: one
program walks the SPLIT ranges itself, each summed from zero, added in split order: the same
sum without the workspace, for many rows (where the partials would cost as much as the weight).
Program ids run over the M tiles fastest, then the splits, then the n-blocks: the M tiles of one
weight tile run side by side and all but the first read it from L2, not HBM.

Two tiers (``plan``). Few rows (M < ``WIDE_FROM_ROWS``): 16-row tiles (one MMA tile), the
split-K configs that stream the weight at the read bandwidth. Many rows: 64-256-row tiles
(Hopper's wgmma size), each weight tile read once per BLOCK_M rows instead of once per 16, with
the few-row config's SPLIT and K ranges, inline.

cuBLAS (``cublas_gives_same_bits``): a call of more than 16 rows without a residual whose plan has
SPLIT 1 runs on F.linear wherever F.linear has been seen to give this kernel's bits at that shape and
M (checked once on random rows, outside CUDA-graph captures); elsewhere the Triton tiers.

Bits. A row's output depends on its K ranges and their order only: each ``tl.dot`` adds its
BLOCK_K products into the fp32 accumulator 16 at a time (one MMA k-step) in K order, whatever
the tile's BLOCK_M / BLOCK_N / BLOCK_K and whichever MMA instruction runs it (mma.sync at 16
rows, wgmma at 64+). The K ranges are a function of (N, K) and the few-row config only (the
tuned table, the measured table or ``default_config``), never of M; M is not specialized on
(``do_not_specialize``). Measured on an H200: every many-rows tile of
bench/results/linear_rows_probe_h200.json gave the few-row tier's bits on all 1,024 rows, and
tests/kernels/test_small_linear.py (``-m gpu``) checks a row's bits at M = 1 ... 1,024 through the
engine's path. (Triton's CPU interpreter computes a dot with numpy, which rounds a row by its
place in the tile: there only closeness is checked.)

Rounding. Everything after the dot stays in fp32 and is rounded once: ``y = round(acc + b + r)``
and ``silu(g) * u = round(g * sigmoid(g) * u)`` with g, u the fp32 sums (bias included). The
eager engine rounds more often (``F.linear`` to bf16, then ``x + ...`` in bf16; ``F.silu(g) * u``
in bf16), so in bf16 the two differ by about an ulp; the references here are
``(x.float() @ w.float().T + b + r).to(dtype)`` and ``(F.silu(g.float()) * u.float()).to(dtype)``.

Fallback rule (``supported``): x and w on a CUDA device (or anywhere under TRITON_INTERPRET=1),
bf16 / fp16 / fp32 of the same dtype, ``w`` 2-D with unit stride along K; otherwise the caller
uses ``F.linear``.

Configs (``Config``: BLOCK_N, BLOCK_K, SPLIT, num_warps, num_stages, BLOCK_M, SPLIT_INLINE): an
explicit ``config=`` wins (its own K ranges), then ``plan``: the few-row config from the table
``tune()`` fills (keyed by ``(N, K)``, ``(N, K, "swiglu")`` for the fused MLP, with N the
weight's rows), the H200's ``MEASURED_SM90`` or ``default_config``; the many-rows tiles from
``WIDE`` (``register_config(..., wide=True)``), ``MEASURED_WIDE_SM90`` or ``default_wide_config``.
``tune`` times ``candidate_configs`` on the current GPU; call it once at engine setup, before any
CUDA-graph capture (it synchronizes, and it compiles the winners so the capture does not).

The reference is the torch math of ``small_linear_reference`` / ``small_linear_swiglu_reference``;
tests/kernels/test_small_linear.py checks the kernels against it in fp32 under TRITON_INTERPRET=1
on a CPU and in bf16 on a GPU; bench/linear_speed.py times the few-row tier against cuBLAS,
bench/linear_rows_probe.py the many-rows tier, bench/engine_batch.py the engine by batch size.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import statistics
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .pdl import launch_options, pdl_enter, use_pdl

BLOCK_M = 16  # rows per program: one MMA tile, the same for a 1-token step and a 16-token verify
REDUCE_BLOCK = 256  # columns per program of the split-K reduction
DEFAULT_SMS = 132  # an H200's SM count, used when no CUDA device is visible
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


# ---------------------------------------------------------------------------------- kernels


@triton.jit
def _epilogue(g, u, rm, rn, M, N, B, R, Y, s_rm, s_ym,
              HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, SWIGLU: tl.constexpr):
    """fp32 tile(s) -> (+ bias) (silu-mul | + residual) -> one rounding -> store."""
    mok = rm < M
    nok = rn < N
    ok = mok[:, None] & nok[None, :]
    if HAS_BIAS:
        g += tl.load(B + rn, mask=nok, other=0.0).to(tl.float32)[None, :]
        if SWIGLU:
            u += tl.load(B + N + rn, mask=nok, other=0.0).to(tl.float32)[None, :]
    if SWIGLU:
        y = g * tl.sigmoid(g) * u
    else:
        y = g
    if HAS_RES:
        y += tl.load(R + rm[:, None] * s_rm + rn[None, :], mask=ok, other=0.0).to(tl.float32)
    tl.store(Y + rm[:, None] * s_ym + rn[None, :], y.to(Y.dtype.element_ty), mask=ok)


@triton.jit
def _k_range(x_row, w_row, N, s_wn, lo, hi, mok, nok, rk, g, u,
             BLOCK_K: tl.constexpr, SWIGLU: tl.constexpr, PRECISION: tl.constexpr, EVEN_K: tl.constexpr):
    """g (u) += the tile's dot over K in [lo, hi), BLOCK_K at a time, in order."""
    for k0 in range(lo, hi, BLOCK_K):
        kk = k0 + rk
        if EVEN_K:  # every K step is whole: no mask along K (the same values, wider loads)
            xt = tl.load(x_row + kk[None, :], mask=mok[:, None], other=0.0)
            wt = tl.load(w_row + kk[None, :], mask=nok[:, None], other=0.0)
        else:
            kok = kk < hi
            xt = tl.load(x_row + kk[None, :], mask=mok[:, None] & kok[None, :], other=0.0)
            wt = tl.load(w_row + kk[None, :], mask=nok[:, None] & kok[None, :], other=0.0)
        g = tl.dot(xt, tl.trans(wt), g, input_precision=PRECISION)
        if SWIGLU:
            if EVEN_K:
                wu = tl.load(w_row + N * s_wn + kk[None, :], mask=nok[:, None], other=0.0)
            else:
                wu = tl.load(w_row + N * s_wn + kk[None, :], mask=nok[:, None] & kok[None, :], other=0.0)
            u = tl.dot(xt, tl.trans(wu), u, input_precision=PRECISION)
    return g, u


@triton.jit(do_not_specialize=["M"])
def _small_linear_kernel(X, W, B, R, Y, WS, M, N, K, s_xm, s_wn, s_rm, s_ym, K_PER_SPLIT,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                         SWIGLU: tl.constexpr, PRECISION: tl.constexpr, EVEN_K: tl.constexpr,
                         SPLIT_INLINE: tl.constexpr, PDL: tl.constexpr):
    # N: output columns (I for SWIGLU: gate rows n, up rows N + n of W)
    pdl_enter(PDL)  # kernels/engine/pdl.py: nothing is read before the predecessor has finished
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    pid_m = pid % num_m  # fastest: the M tiles of one weight tile run together (L2 reuse)
    rest = pid // num_m
    nsplit = 1 if SPLIT_INLINE else SPLIT  # inline: one program walks every split itself
    split = rest % nsplit
    pid_n = rest // nsplit
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    mok = rm < M
    nok = rn < N
    x_row = X + rm[:, None] * s_xm
    w_row = W + rn[:, None].to(tl.int64) * s_wn  # int64: N x K may pass 2**31 (a large vocabulary)
    if SPLIT_INLINE:
        # the split-K sum without the workspace: each K range summed from zero on its own, then the
        # ranges added in split order, as _reduce_kernel adds the partials: the same bits
        g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for s in range(0, SPLIT):
            lo = s * K_PER_SPLIT
            hi = tl.minimum(K, lo + K_PER_SPLIT)
            pg, pu = _k_range(x_row, w_row, N, s_wn, lo, hi, mok, nok, rk,
                              tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32),
                              tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), BLOCK_K, SWIGLU, PRECISION, EVEN_K)
            g += pg
            if SWIGLU:
                u += pu
        _epilogue(g, u, rm, rn, M, N, B, R, Y, s_rm, s_ym, HAS_BIAS, HAS_RES, SWIGLU)
    else:
        # this split's K range: fixed by (K, config), never by M
        lo = split * K_PER_SPLIT
        hi = tl.minimum(K, lo + K_PER_SPLIT)
        g, u = _k_range(x_row, w_row, N, s_wn, lo, hi, mok, nok, rk,
                        tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32),
                        tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), BLOCK_K, SWIGLU, PRECISION, EVEN_K)
        if SPLIT == 1:
            _epilogue(g, u, rm, rn, M, N, B, R, Y, s_rm, s_ym, HAS_BIAS, HAS_RES, SWIGLU)
        else:
            # partials [SPLIT, M, N] (SWIGLU: [SPLIT, M, 2N], gate columns then up columns), fp32
            ws_n = 2 * N if SWIGLU else N
            ok = mok[:, None] & nok[None, :]
            part = WS + (split * M + rm[:, None]) * ws_n + rn[None, :]
            tl.store(part, g, mask=ok)
            if SWIGLU:
                tl.store(part + N, u, mask=ok)


@triton.jit(do_not_specialize=["M"])
def _reduce_kernel(WS, B, R, Y, M, N, s_rm, s_ym,
                   BLOCK: tl.constexpr, SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                   SWIGLU: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    pid = tl.program_id(0)
    nb = tl.cdiv(N, BLOCK)
    m = pid // nb
    rm = m + tl.arange(0, 1)  # a [1, BLOCK] tile: one row
    rn = (pid % nb) * BLOCK + tl.arange(0, BLOCK)
    ok = (rm < M)[:, None] & (rn < N)[None, :]
    ws_n = 2 * N if SWIGLU else N
    g = tl.zeros([1, BLOCK], dtype=tl.float32)
    u = tl.zeros([1, BLOCK], dtype=tl.float32)
    for s in tl.static_range(SPLIT):  # split order: the same sum whatever M
        part = WS + (s * M + rm[:, None]) * ws_n + rn[None, :]
        g += tl.load(part, mask=ok, other=0.0)
        if SWIGLU:
            u += tl.load(part + N, mask=ok, other=0.0)
    _epilogue(g, u, rm, rn, M, N, B, R, Y, s_rm, s_ym, HAS_BIAS, HAS_RES, SWIGLU)


# ---------------------------------------------------------------------------------- configs


@dataclasses.dataclass(frozen=True)
class Config:
    """A launch configuration. BLOCK_N: output columns per program (for the SwiGLU kernel each
    program reads 2 x BLOCK_N weight rows, gate and up); BLOCK_K: K per loop step; SPLIT: K ranges
    per n-block (1: one launch; > 1: fp32 partials + a reduction launch)."""

    BLOCK_N: int = 64
    BLOCK_K: int = 128
    SPLIT: int = 1
    num_warps: int = 4
    num_stages: int = 4
    BLOCK_M: int = BLOCK_M  # rows per program: 16 for few rows; 64-256 for the many-rows tier
    SPLIT_INLINE: bool = False  # SPLIT > 1: one program sums the K ranges in order (no workspace)

    def validate(self, who: str = "small_linear") -> Config:
        def pow2(v: int) -> bool:
            return isinstance(v, int) and v > 0 and v & (v - 1) == 0

        for name in ("BLOCK_N", "BLOCK_K"):
            v = getattr(self, name)
            if not (pow2(v) and 16 <= v <= 1024):
                raise ValueError(f"{who}: config {name}={v!r} is not valid; valid: a power of two in 16..1024 "
                                 f"(tl.dot needs >= 16)")
        if not (pow2(self.BLOCK_M) and 16 <= self.BLOCK_M <= 256):
            raise ValueError(f"{who}: config BLOCK_M={self.BLOCK_M!r} is not valid; valid: a power of two in 16..256")
        if not (isinstance(self.SPLIT, int) and 1 <= self.SPLIT <= 64):
            raise ValueError(f"{who}: config SPLIT={self.SPLIT!r} is not valid; valid: an int in 1..64")
        if not (pow2(self.num_warps) and self.num_warps <= 16):
            raise ValueError(f"{who}: config num_warps={self.num_warps!r} is not valid; valid: 1, 2, 4, 8, 16")
        if not (isinstance(self.num_stages, int) and 1 <= self.num_stages <= 8):
            raise ValueError(f"{who}: config num_stages={self.num_stages!r} is not valid; valid: an int in 1..8")
        return self

    def k_per_split(self, k: int) -> int:
        """K per split: ceil(K / SPLIT) rounded up to BLOCK_K (the last splits may be short or empty)."""
        return triton.cdiv(triton.cdiv(k, self.SPLIT), self.BLOCK_K) * self.BLOCK_K

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


# (N, K) -> Config for small_linear; (N, K, "swiglu") -> Config for small_linear_swiglu (N = 2I).
# Filled by tune() / register_config(); consulted when config is None. One table per process:
# it holds the winners of the dtype last tuned.
TUNED: dict[tuple, Config] = {}


def _key(n: int, k: int, swiglu: bool) -> tuple:
    return (int(n), int(k), "swiglu") if swiglu else (int(n), int(k))


def register_config(n: int, k: int, config: Config, *, swiglu: bool = False, wide: bool = False) -> None:
    """Use ``config`` for weights [n, k] (n = 2I for the SwiGLU kernel) when no config is passed;
    wide=True: as the many-rows tier's tiles (plan(); used only with the few-row config's SPLIT)."""
    (WIDE if wide else TUNED)[_key(n, k, swiglu)] = config.validate("register_config")


def clear_configs() -> None:
    TUNED.clear()
    WIDE.clear()


@functools.cache
def _sms_of(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _num_sms() -> int:
    return _sms_of(torch.cuda.current_device()) if torch.cuda.is_available() else DEFAULT_SMS


@functools.lru_cache(maxsize=1024)
def default_config(n: int, k: int, *, swiglu: bool = False, dtype: torch.dtype = torch.bfloat16,
                   sms: int | None = None) -> Config:
    """The untuned choice for weights [n, k] (n = 2I for SwiGLU), a function of the shape only.

    BLOCK_K 128 (64 in fp32: the same bytes a step), 64 weight rows a program (BLOCK_N 64; 32
    for SwiGLU, whose program reads gate and up rows). SPLIT: the smallest power of two <= 8 that
    gives >= 2 waves of programs over the SMs while each split keeps >= 4 BLOCK_K steps. Shapes
    still short of one wave (small N and K) halve BLOCK_N down to 16. num_stages 4 (3 in fp32)."""
    sms = sms or _num_sms()
    n_out = n // 2 if swiglu else n
    block_k = 64 if dtype == torch.float32 else 128
    block_k = max(16, min(block_k, triton.next_power_of_2(max(1, k))))
    block_n = 32 if swiglu else 64
    split = 1
    while split < 8 and triton.cdiv(n_out, block_n) * split < 2 * sms and k // (2 * split) >= 4 * block_k:
        split *= 2
    while block_n > 16 and triton.cdiv(n_out, block_n) * split < sms:
        block_n //= 2
    return Config(BLOCK_N=block_n, BLOCK_K=block_k, SPLIT=split, num_warps=4,
                  num_stages=3 if dtype == torch.float32 else 4)


# (BLOCK_N, BLOCK_K, num_warps, num_stages): about 32-64 KB of weight in flight per program
_TILES = ((16, 256, 4, 4), (32, 128, 4, 4), (32, 256, 4, 3), (64, 128, 4, 4), (64, 256, 4, 3), (128, 128, 4, 3))
MAX_CANDIDATES = 24
TUNE_SKIPPED: list[tuple] = []  # (shape, config, error) of the candidates the last tune() could not run


def candidate_configs(n: int, k: int, *, swiglu: bool = False, dtype: torch.dtype = torch.bfloat16,
                      sms: int | None = None, limit: int = MAX_CANDIDATES) -> list[Config]:
    """The configs ``tune`` times for weights [n, k]: the tiles of ``_TILES`` (BLOCK_K no larger
    than K rounded up to a power of two) x SPLIT in {1, 2, 4, 8} (a split keeps >= 2 BLOCK_K
    steps), the ``limit`` whose program count is nearest 2 waves, and ``default_config``."""
    sms = sms or _num_sms()
    n_out = n // 2 if swiglu else n
    kmax = max(16, triton.next_power_of_2(max(1, k)))
    found = []
    for bn, bk, warps, stages in _TILES:
        if bk > kmax:
            continue
        for split in (1, 2, 4, 8):
            if split > 1 and k // split < 2 * bk:
                continue
            programs = triton.cdiv(n_out, bn) * split
            found.append((abs(math.log2(programs / (2 * sms))), len(found), Config(bn, bk, split, warps, stages)))
    ranked = [c for _, _, c in sorted(found, key=lambda t: t[:2])]
    base = default_config(n, k, swiglu=swiglu, dtype=dtype, sms=sms)
    out = [base] + [c for c in ranked if c != base]
    return out[:max(1, limit)]


# bench/linear_speed.py's winners on an H200 (bench/results/linear_speed_h200.json, code ca927d8, bf16):
# per weight shape the least total time over M = 1 and M = 16 (one config whatever M: see "Bits").
# Against cuBLAS in that run (us, M = 1 + M = 16): o 24.5 vs 26.9, down 56.0 vs 60.1, gate/up with
# SiLU·mul 98.3 vs 110.9 (cuBLAS + a SiLU·mul launch), LM head 563 vs 601; q/k/v 32.5 vs 31.3.
MEASURED_SM90: dict[tuple, Config] = {
    (6144, 4096): Config(64, 256, 1, 4, 3),  # Qwen3-8B q/k/v
    (4096, 4096): Config(64, 128, 4, 4, 4),  # Qwen3-8B o
    (24576, 4096, "swiglu"): Config(32, 128, 1, 4, 4),  # Qwen3-8B gate/up
    (4096, 12288): Config(64, 128, 4, 4, 4),  # Qwen3-8B down
    (151936, 4096): Config(128, 128, 1, 4, 3),  # Qwen3-8B LM head
    (960, 576): Config(16, 256, 1, 4, 4),  # SmolLM2-135M q/k/v
    (576, 576): Config(16, 256, 1, 4, 4),  # SmolLM2-135M o
    (3072, 576, "swiglu"): Config(32, 128, 1, 4, 4),  # SmolLM2-135M gate/up
    (576, 1536): Config(16, 256, 1, 4, 4),  # SmolLM2-135M down
}
_measured: dict[tuple, Config] = {}  # MEASURED_SM90 once use_measured_configs() found a Hopper GPU

# The many-rows tier (plan()): from this many rows on a call runs WIDE tiles. Its SPLIT and K ranges
# are the few-row config's, so the bits do not change at the switch (GPU test: a row's bits at
# M = 1..1024). WIDE: set by register_config(..., wide=True); MEASURED_WIDE_SM90: H200 winners.
WIDE_FROM_ROWS = 64
WIDE: dict[tuple, Config] = {}


def _wide(bn: int, bk: int, warps: int, stages: int, bm: int, split: int = 1, inline: bool = False) -> Config:
    return Config(bn, bk, split, warps, stages, BLOCK_M=bm, SPLIT_INLINE=inline)


# A small model's projections at 64-255 rows (a verify of 4-16 tokens at B = 4-16): 64 x 16 tiles. There the
# 16-row tier runs 4+ M tiles of N / 16 programs (SmolLM2's q/k/v: 240, more than 132 SMs) and the probe's
# 64 x 64 tiles leave 9-24 programs each walking all of K; in SmolLM2's graphed forward on an H100 these tiles
# (with cuBLAS off for q/k/v: CUBLAS_MIN_WEIGHT_BYTES) took 1.07-1.17 ms at 64-128 rows against 1.18-1.30
# (experiments/linear_tiers.py, bench/results/linear_tiers_h100/), and lost at 32 rows and from 256.
_SMALL_MID = _wide(16, 64, 4, 4, 64)

# bench/linear_rows_probe.py's winners on an H200 (bench/results/linear_rows_probe_h200.json.gz, bf16), by
# the rows of a call: (from_rows, tiles) ascending, each the fastest tile at the probe's M = from_rows
# among tiles that keep the few-row K ranges (every candidate gave the few-row tier's bits on all 1,024
# rows, so the tile may change with M). One tile for every M cost up to 1.9x at M = 64 (o: 27.6 vs 14.8 us).
MEASURED_WIDE_SM90: dict[tuple, tuple[tuple[int, Config], ...]] = {
    (6144, 4096): ((64, _wide(64, 64, 4, 4, 64)), (128, _wide(64, 128, 8, 3, 128)),  # qkv
                   (256, _wide(64, 64, 4, 4, 64)), (512, _wide(128, 64, 4, 3, 64)), (1024, _wide(128, 64, 8, 4, 128))),
    (4096, 4096): ((64, _wide(64, 64, 4, 4, 64, 4)), (128, _wide(64, 64, 4, 4, 128, 4)),  # o
                   (256, _wide(256, 64, 8, 4, 128, 4)), (512, _wide(128, 64, 8, 4, 128, 4, True))),
    (24576, 4096, "swiglu"): ((64, _wide(64, 64, 4, 4, 64)), (128, _wide(128, 64, 8, 4, 128)),  # gate_up
                              (256, _wide(64, 128, 8, 3, 128)), (512, _wide(128, 64, 8, 4, 128))),
    (4096, 12288): ((64, _wide(64, 64, 4, 4, 64, 4)), (128, _wide(128, 128, 8, 3, 128, 4)),  # down
                    (256, _wide(256, 64, 8, 4, 128, 4)), (512, _wide(128, 64, 8, 4, 128, 4, True))),
    (151936, 4096): ((64, _wide(128, 64, 4, 3, 64)), (128, _wide(128, 128, 8, 3, 128)),  # lm_head
                     (256, _wide(128, 64, 8, 3, 256)), (512, _wide(256, 64, 8, 4, 128)),
                     (1024, _wide(128, 64, 8, 3, 256))),
    # SmolLM2's: 64 x 16 tiles below 256 rows (`_SMALL_MID`), then the probe's
    (960, 576): ((64, _SMALL_MID), (256, _wide(64, 64, 4, 4, 64)), (1024, _wide(128, 64, 8, 4, 64))),  # smollm2_qkv
    (576, 576): ((64, _SMALL_MID), (256, _wide(64, 64, 4, 4, 64)), (1024, _wide(128, 64, 8, 4, 64))),  # smollm2_o
    (3072, 576, "swiglu"): ((64, _SMALL_MID), (256, _wide(64, 64, 4, 4, 64)),  # smollm2_gate_up
                            (512, _wide(64, 64, 4, 4, 128)), (1024, _wide(128, 64, 8, 3, 128))),
    (576, 1536): ((64, _SMALL_MID), (256, _wide(64, 64, 4, 4, 64)), (1024, _wide(128, 64, 8, 4, 64))),  # smollm2_down
    (49152, 576): ((64, _wide(128, 64, 4, 3, 64)), (256, _wide(128, 64, 8, 3, 128))),  # smollm2_lm_head
}
_measured_wide: dict[tuple, tuple[tuple[int, Config], ...]] = {}


def use_measured_configs(device=None) -> bool:
    """Consult MEASURED_SM90 (for 16-bit weights) on a compute-capability-9.0 GPU; -> whether it applies."""
    if not torch.cuda.is_available():
        return False
    if torch.cuda.get_device_capability(device) != (9, 0):
        return False
    _measured.update(MEASURED_SM90)
    _measured_wide.update(MEASURED_WIDE_SM90)
    return True


def lookup_config(n: int, k: int, *, swiglu: bool = False, dtype: torch.dtype = torch.bfloat16) -> Config:
    """The few-row config small_linear uses for weights [n, k] when none is passed: tuned, else
    measured on this GPU's architecture (16-bit weights), else default. It fixes a row's bits
    (its SPLIT and K ranges) at every number of rows."""
    key = _key(n, k, swiglu)
    found = TUNED.get(key) or (_measured.get(key) if dtype in (torch.bfloat16, torch.float16) else None)
    return found or default_config(n, k, swiglu=swiglu, dtype=dtype)


def default_wide_config(base: Config, k: int, *, swiglu: bool = False) -> Config:
    """The many-rows tiles for a weight whose few-row config is ``base``: BLOCK_M 128 (wgmma-sized),
    BLOCK_N 128 (64 for SwiGLU: two accumulators), BLOCK_K 64 where it divides base's K range,
    base's SPLIT (the K ranges, hence the bits, stay base's)."""
    kps = base.k_per_split(k)
    block_k = 64 if kps % 64 == 0 else base.BLOCK_K
    return Config(BLOCK_N=64 if swiglu else 128, BLOCK_K=block_k, SPLIT=base.SPLIT, num_warps=8, num_stages=3,
                  BLOCK_M=128, SPLIT_INLINE=True)


def plan(n: int, k: int, rows: int, *, swiglu: bool = False, dtype: torch.dtype = torch.bfloat16,
         who: str = "plan") -> tuple[Config, int]:
    """(the tiles, the K range per split) for ``rows`` rows of weights [n, k].

    The K ranges are always the few-row config's (``lookup_config``): a row's summation order, so
    its bits, are the same at 1 row and at 1,024. From ``WIDE_FROM_ROWS`` rows on, the tiles are
    the many-rows tier's (``WIDE``; ``MEASURED_WIDE_SM90``'s entry for the most rows <= ``rows``;
    else ``default_wide_config``): a weight tile is read once per BLOCK_M rows instead of once per 16."""
    base = lookup_config(n, k, swiglu=swiglu, dtype=dtype).validate(f"{who} (tuned table)")
    kps = base.k_per_split(k)
    if rows < WIDE_FROM_ROWS:
        return base, kps
    key = _key(n, k, swiglu)
    wide = WIDE.get(key)
    if wide is None and dtype in (torch.bfloat16, torch.float16):
        wide = next((c for lo, c in reversed(_measured_wide.get(key, ())) if rows >= lo), None)
    if wide is None or wide.SPLIT != base.SPLIT or kps % wide.BLOCK_K:
        wide = default_wide_config(base, k, swiglu=swiglu)
    return wide.validate(f"{who} (many-rows table)"), kps


# cuBLAS where it gives these bits. The probe (linear_rows_probe_h200.json.gz) found cuBLAS's rows the
# same at every probed M for the SPLIT-1 shapes (Qwen3-8B q/k/v and LM head, all of SmolLM2's), and
# bench/linear_speed.py found them equal to this kernel's (max_abs_diff_vs_cublas 0.0): both sum K in
# order, 16 at a time. Where so, cuBLAS runs many rows faster (q/k/v at M = 512: 34.7 vs 48.3 us; the
# LM head: 945 vs 1,175 us). So a call of more than CUBLAS_FROM_ROWS - 1 rows without a residual,
# through a SPLIT-1 plan, goes to F.linear once F.linear has given this kernel's bits on random rows at
# that (shape, rows, dtype, alignment): checked on the first such call outside a CUDA-graph capture
# (the graphs' eager warm-up runs make it), kept in _CUBLAS_SAME. Unchecked, or different: this kernel.
# A row's bits therefore never depend on which of the two ran it. DOMINO_GRAFT_CUBLAS_ROWS=0: never.
CUBLAS_ROWS = os.environ.get("DOMINO_GRAFT_CUBLAS_ROWS") != "0"  # read once: the check runs on every call
CUBLAS_FROM_ROWS = BLOCK_M + 1  # one 16-row tile and below: this kernel is the faster (the LM head: 278 vs 298 us)
# and only for weights this large: a smaller one's call takes a few microseconds, and cuBLAS's kernel, which does
# not join the PDL chain (kernels/engine/pdl.py), cost more than it saved (SmolLM2's q/k/v [960, 576] at 64-128 rows,
# H100: experiments/linear_tiers.py; its LM head, 56 MB, and every Qwen3-8B weight stay on cuBLAS)
CUBLAS_MIN_WEIGHT_BYTES = 8 << 20
_CUBLAS_SAME: dict[tuple, bool] = {}


def _aligned(t: torch.Tensor | None) -> bool:
    return t is None or t.data_ptr() % 16 == 0


def cublas_gives_same_bits(x2: torch.Tensor, w: torch.Tensor, bias, cfg: Config, kps: int) -> bool:
    """Whether F.linear may run this call of x2 ``[M, K]`` (module comment above): checked once per
    (w's shape and strides, M, dtypes, alignment) on seeded random rows against ``_launch``."""
    m, k = x2.shape
    if (m < CUBLAS_FROM_ROWS or cfg.SPLIT != 1 or INTERPRETED or not x2.is_cuda or not x2.is_contiguous()
            or w.numel() * w.element_size() < CUBLAS_MIN_WEIGHT_BYTES
            or x2.dtype not in (torch.bfloat16, torch.float16) or (bias is not None and bias.dtype != x2.dtype)
            or not CUBLAS_ROWS):
        return False  # (an fp32 bias beside 16-bit x: F.linear refuses mixed dtypes)
    key = (tuple(w.shape), w.stride(0), m, x2.dtype, None if bias is None else bias.dtype,
           _aligned(x2) and _aligned(w) and _aligned(bias), x2.device.index)
    same = _CUBLAS_SAME.get(key)
    if same is None:
        if torch.cuda.is_current_stream_capturing():  # a check synchronizes: not inside a capture
            return False
        gen = torch.Generator(device=x2.device).manual_seed(m)
        probe = torch.randn((m, k), generator=gen, device=x2.device).to(x2.dtype)
        try:
            same = bool(torch.equal(F.linear(probe, w, bias), _launch(probe, w, bias, None, cfg, w.shape[0], False, kps)))
        except RuntimeError:  # cuBLAS could not run it (memory, a layout it refuses): the kernel does
            same = False
        _CUBLAS_SAME[key] = same
    return same


# ---------------------------------------------------------------------------------- wrappers


def supported(x: torch.Tensor, w: torch.Tensor, *, max_rows: int | None = None) -> bool:
    """Whether small_linear can run (True) or the caller falls back to F.linear (False):
    x, w on CUDA (any device under TRITON_INTERPRET=1), the same dtype among bf16/fp16/fp32, w 2-D
    with unit stride along K matching x's last dim, and at most ``max_rows`` rows (None: any)."""
    if not (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor)):
        return False
    if not (INTERPRETED or (x.is_cuda and w.is_cuda)) or x.device != w.device:
        return False
    if x.dtype not in DTYPES or w.dtype != x.dtype or w.dim() != 2 or x.dim() < 1:
        return False
    if x.shape[-1] != w.shape[1] or w.stride(1) != 1:
        return False
    return max_rows is None or x.numel() // max(1, x.shape[-1]) <= max_rows


def _check(who: str, x, w, bias, residual, n_out: int, n_bias: int):
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise ValueError(f"{who}: x must be a tensor [..., K], got {type(x).__name__}"
                         f"{'' if not isinstance(x, torch.Tensor) else ' of shape ' + str(tuple(x.shape))}")
    if x.dtype not in DTYPES:
        raise ValueError(f"{who}: x dtype {x.dtype} is not supported; valid: bfloat16, float16, float32")
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        raise ValueError(f"{who}: w must be a 2-D tensor [N, K], got "
                         f"{tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__}")
    k = x.shape[-1]
    if w.shape[1] != k:
        raise ValueError(f"{who}: w shape {tuple(w.shape)} does not match x's last dim K={k}; valid: [N, {k}]")
    if w.dtype != x.dtype:
        raise ValueError(f"{who}: w dtype {w.dtype} differs from x dtype {x.dtype}; valid: the same dtype")
    if w.stride(1) != 1:
        raise ValueError(f"{who}: w strides {tuple(w.stride())} are not row-major; valid: unit stride along K "
                         f"(w.contiguous())")
    if w.device != x.device:
        raise ValueError(f"{who}: w is on {w.device} and x on {x.device}; valid: the same device")
    if not (INTERPRETED or x.is_cuda):
        raise ValueError(f"{who}: x is on {x.device}; valid: a CUDA device, or any under TRITON_INTERPRET=1 "
                         f"(else use F.linear)")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (n_bias,):
            raise ValueError(f"{who}: bias shape {tuple(getattr(bias, 'shape', ()))} is not valid; valid: ({n_bias},)")
        if bias.dtype not in (x.dtype, torch.float32) or bias.device != x.device:
            raise ValueError(f"{who}: bias dtype {bias.dtype} on {bias.device} is not valid; valid: {x.dtype} or "
                             f"float32 on {x.device}")
    if residual is not None:
        want = tuple(x.shape[:-1]) + (n_out,)
        if not isinstance(residual, torch.Tensor) or tuple(residual.shape) != want:
            raise ValueError(f"{who}: residual shape {tuple(getattr(residual, 'shape', ()))} is not valid; "
                             f"valid: {want} (x's leading dims, N)")
        if residual.dtype != x.dtype or residual.device != x.device:
            raise ValueError(f"{who}: residual dtype {residual.dtype} on {residual.device} is not valid; valid: "
                             f"{x.dtype} on {x.device}")


def _rows(t: torch.Tensor, width: int) -> torch.Tensor:
    t = t.reshape(-1, width)
    return t if t.stride(-1) == 1 or t.shape[0] == 0 else t.contiguous()


def _launch(x2: torch.Tensor, w: torch.Tensor, bias, r2, cfg: Config, n_out: int, swiglu: bool,
            k_per_split: int | None = None) -> torch.Tensor:
    """One call: cfg's tiles over k_per_split-wide K ranges (default: cfg's own, ``cfg.k_per_split``).
    The K ranges and SPLIT alone fix a row's summation; the tiles only say who computes it."""
    m, k = x2.shape
    y = torch.empty((m, n_out), dtype=x2.dtype, device=x2.device)
    if m == 0 or n_out == 0:
        return y
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    b = bias if bias is not None else y
    r = r2 if r2 is not None else y
    s_rm = r2.stride(0) if r2 is not None else 0
    split = cfg.SPLIT
    inline = split > 1 and cfg.SPLIT_INLINE
    kps = cfg.k_per_split(k) if k_per_split is None else int(k_per_split)
    ws = y if split == 1 or inline else torch.empty((split, m, 2 * n_out if swiglu else n_out), dtype=torch.float32,
                                                    device=x2.device)
    pdl = use_pdl(x2)
    flags = {"HAS_BIAS": bias is not None, "HAS_RES": r2 is not None, "SWIGLU": swiglu, "PDL": pdl,
             **launch_options(pdl)}
    grid = (triton.cdiv(n_out, cfg.BLOCK_N) * (1 if inline else split) * triton.cdiv(m, cfg.BLOCK_M),)
    _small_linear_kernel[grid](
        x2, w, b, r, y, ws, m, n_out, k, x2.stride(0), w.stride(0), s_rm, y.stride(0), kps,
        BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K, SPLIT=split,
        PRECISION="ieee" if x2.dtype == torch.float32 else "tf32",  # fp32 stays fp32, not TF32
        # each K range whole BLOCK_K steps; the few-row tier keeps its masked loads (its measured configs)
        EVEN_K=cfg.BLOCK_M > BLOCK_M and kps % cfg.BLOCK_K == 0 and k % cfg.BLOCK_K == 0,
        SPLIT_INLINE=inline, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **flags,
    )
    if split > 1 and not inline:
        _reduce_kernel[(m * triton.cdiv(n_out, REDUCE_BLOCK),)](
            ws, b, r, y, m, n_out, s_rm, y.stride(0), BLOCK=REDUCE_BLOCK, SPLIT=split, num_warps=2, **flags)
    return y


def small_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                 residual: torch.Tensor | None = None, *, config: Config | None = None) -> torch.Tensor:
    """x ``[..., K]``, w ``[N, K]`` (unit stride along K, x's dtype: bf16 / fp16 / fp32), bias
    ``[N]`` (x's dtype or fp32), residual ``[..., N]`` -> ``x @ w.T + bias + residual`` ``[..., N]``
    in x.dtype: fp32 accumulation, one rounding. Any number of rows runs (``plan``: two tiers); see
    ``supported`` for when it is worth it. config: None -> the tuned table, else default_config."""
    n = w.shape[0] if isinstance(w, torch.Tensor) and w.dim() == 2 else -1
    _check("small_linear", x, w, bias, residual, n, n)
    k = x.shape[-1]
    x2 = _rows(x, k)
    cfg, kps = ((config.validate("small_linear"), None) if config is not None
                else plan(n, k, x2.shape[0], dtype=x.dtype, who="small_linear"))
    if residual is None and config is None and cublas_gives_same_bits(x2, w, bias, cfg, kps):
        return F.linear(x2, w, bias).reshape(*x.shape[:-1], n)
    r2 = _rows(residual, n) if residual is not None else None
    y = _launch(x2, w, bias, r2, cfg, n, swiglu=False, k_per_split=kps)
    return y.reshape(*x.shape[:-1], n)


def small_linear_swiglu(x: torch.Tensor, w_gate_up: torch.Tensor, bias: torch.Tensor | None = None, *,
                        config: Config | None = None) -> torch.Tensor:
    """x ``[..., K]``, w_gate_up ``[2I, K]`` (gate rows, then up rows; one fused weight), bias
    ``[2I]`` or None -> ``silu(g) * u`` ``[..., I]`` with ``g, u = x @ w_gate_up.T + bias`` split
    in halves, all in fp32 and rounded once to x.dtype (``(F.silu(g.float()) * u.float())``)."""
    two_i = w_gate_up.shape[0] if isinstance(w_gate_up, torch.Tensor) and w_gate_up.dim() == 2 else -1
    _check("small_linear_swiglu", x, w_gate_up, bias, None, two_i // 2, two_i)
    if two_i % 2:
        raise ValueError(f"small_linear_swiglu: w_gate_up shape {tuple(w_gate_up.shape)} has an odd number of rows; "
                         f"valid: [2I, K] (gate rows, then up rows)")
    k = x.shape[-1]
    x2 = _rows(x, k)
    cfg, kps = ((config.validate("small_linear_swiglu"), None) if config is not None
                else plan(two_i, k, x2.shape[0], swiglu=True, dtype=x.dtype, who="small_linear_swiglu"))
    y = _launch(x2, w_gate_up, bias, None, cfg, two_i // 2, swiglu=True, k_per_split=kps)
    return y.reshape(*x.shape[:-1], two_i // 2)


# ---------------------------------------------------------------------------------- references


def small_linear_reference(x, w, bias=None, residual=None):
    """The spec: fp32 math, one rounding to x.dtype."""
    y = x.float() @ w.float().T
    if bias is not None:
        y = y + bias.float()
    if residual is not None:
        y = y + residual.float()
    return y.to(x.dtype)


def small_linear_swiglu_reference(x, w_gate_up, bias=None):
    gu = x.float() @ w_gate_up.float().T
    if bias is not None:
        gu = gu + bias.float()
    g, u = gu.chunk(2, dim=-1)
    return (F.silu(g) * u).to(x.dtype)


# ---------------------------------------------------------------------------------- tuning


def _cuda_time_us(fn: Callable[[], object], reps: int = 7, inner: int = 10, warmup: int = 2) -> float:
    """Median over ``reps`` of (CUDA-event time of ``inner`` back-to-back calls) / inner, in us."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / inner)
    return statistics.median(times)


def weight_copies(weight_bytes: int, l2_bytes: int, cap: int = 64) -> int:
    """How many copies of a weight to cycle through so that back-to-back calls read it from HBM,
    as in a model whose every layer has its own weights: enough to cover twice the L2."""
    return max(1, min(cap, -(-2 * int(l2_bytes) // max(1, int(weight_bytes)))))


def _l2_bytes(device) -> int:
    if torch.device(device).type == "cuda":
        return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20))
    return 0


def _tune(shapes: Iterable[tuple], dtype: torch.dtype, device, m: int, candidates_fn, time_fn,
          seed: int = 0) -> dict[tuple, Config]:
    device = torch.device(device)
    gen = torch.Generator(device).manual_seed(seed)
    won = {}
    skipped = TUNE_SKIPPED
    skipped.clear()
    for shape in shapes:
        n, k, *rest = shape
        swiglu = bool(rest) and rest[0] == "swiglu"
        if rest and not swiglu:
            raise ValueError(f"tune: shape {shape!r} is not valid; valid: (N, K) or (N, K, 'swiglu')")
        cands = list(candidates_fn(n, k, swiglu)) if callable(candidates_fn) else list(candidates_fn)
        for c in cands:
            c.validate("tune")
        # random inputs (never zeros), scaled like activations and weights
        x = torch.randn((m, k), generator=gen, device=device).to(dtype)
        copies = weight_copies(n * k * x.element_size(), _l2_bytes(device))
        ws = [(torch.randn((n, k), generator=gen, device=device) / math.sqrt(k)).to(dtype) for _ in range(copies)]
        op = small_linear_swiglu if swiglu else small_linear
        ref = (small_linear_swiglu_reference if swiglu else small_linear_reference)(x, ws[0]).float()
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        best, best_t = None, float("inf")
        for c in cands:
            try:
                y = op(x, ws[0], config=c).float()
                if not torch.allclose(y, ref, atol=tol * max(1.0, ref.abs().max().item()), rtol=tol):
                    skipped.append((tuple(shape), c, "wrong result"))  # a miscompiled candidate never wins
                    continue
                state = {"i": 0}

                def call(c=c, state=state, x=x, ws=ws, op=op):  # cycles through the weight copies
                    state["i"] = (state["i"] + 1) % len(ws)
                    return op(x, ws[state["i"]], config=c)

                t = time_fn(call, c, len(ws))
            except Exception as e:  # noqa: BLE001  out of shared memory, a compiler error: skip the candidate
                skipped.append((tuple(shape), c, f"{type(e).__name__}: {e}"[:200]))
                continue
            if t < best_t:
                best, best_t = c, t
        if best is None:
            best = default_config(n, k, swiglu=swiglu, dtype=dtype)
        key = _key(n, k, swiglu)
        TUNED[key] = best
        won[tuple(shape)] = best
        del ws
    return won


def tune(shapes: Iterable[tuple], dtype: torch.dtype = torch.bfloat16, device=None, m: int = 16,
         candidates: Iterable[Config] | None = None) -> dict[tuple, Config]:
    """Time candidate configs for each weight shape on the current CUDA device and store the
    fastest in ``TUNED`` (small_linear then uses it for that (N, K) when config is None).

    shapes: (N, K) for small_linear, (N, K, "swiglu") for small_linear_swiglu (N = 2I). Random
    inputs of ``m`` rows (the config must not depend on M, so one M decides for all); each
    candidate is checked against the fp32 reference first, then timed with CUDA events (2
    warm-up calls, the median of 7 reps of max(10, copies) back-to-back calls cycling through
    enough weight copies to cover twice the L2, so each call reads HBM as a layer of a model
    does); a candidate that fails to compile or is wrong is skipped (``TUNE_SKIPPED`` lists them).
    candidates: one list for every shape, else ``candidate_configs(n, k)`` (<= 24). Returns
    {shape: winner}. Call once at engine setup, before capturing CUDA graphs (it synchronizes and
    compiles). Cost: a compile per new config (~0.5-1 s each with a cold Triton cache; the plain
    kernel's compiles are shared by every (N, K) divisible by 16), then ~10 ms of timing each."""
    device = torch.device(device if device is not None else "cuda")
    if device.type != "cuda" or not torch.cuda.is_available():
        raise ValueError(f"tune: device {device} is not a CUDA device; valid: a visible CUDA device (timing uses "
                         f"CUDA events); on a CPU use register_config or pass config=")
    if dtype not in DTYPES:
        raise ValueError(f"tune: dtype {dtype} is not supported; valid: bfloat16, float16, float32")
    cands = list(candidates) if candidates is not None else (
        lambda n, k, swiglu: candidate_configs(n, k, swiglu=swiglu, dtype=dtype))
    with torch.cuda.device(device):
        return _tune(shapes, dtype, device, m, cands,
                     lambda fn, _config, copies: _cuda_time_us(fn, inner=max(10, copies)))
