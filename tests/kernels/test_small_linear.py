"""kernels/engine/small_linear.py (few-row ``x @ w.T`` with a fused bias / residual / SwiGLU epilogue)
against its torch reference (``small_linear_reference`` / ``small_linear_swiglu_reference``),
its input checks, its config table and tune()'s selection; bench/linear_speed.py's pure parts.

CPU (default): Triton's interpreter (TRITON_INTERPRET=1, set before triton is imported), fp32,
small awkward shapes (N, K not multiples of the blocks), M from 1 to 40 (one to three 16-row
tiles), SPLIT 1 and > 1 (empty splits included). GPU (`-m gpu`): bf16 against F.linear, a row's
bits with M = 1 and inside M = 16, split-K determinism, tune() timing.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

_CUDA = torch.cuda.is_available()
if not _CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton")

from domino_graft.kernels.engine import small_linear as S  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
needs_interpreter = pytest.mark.skipif(not INTERPRETED, reason="CPU kernel tests run in Triton's interpreter")
ATOL = 2e-5  # fp32 with another summation order, values of order 1
REPO = Path(__file__).resolve().parents[2]

N, K = 40, 72  # not multiples of any block size
CONFIGS = [
    S.Config(BLOCK_N=16, BLOCK_K=32, SPLIT=1, num_warps=4, num_stages=2),
    S.Config(BLOCK_N=32, BLOCK_K=16, SPLIT=3, num_warps=4, num_stages=3),  # 3 splits of 32: the last short
    S.Config(BLOCK_N=64, BLOCK_K=16, SPLIT=8, num_warps=2, num_stages=1),  # 8 splits of 16: the last empty
]


def _close(a, b, atol=ATOL, what=""):
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    err = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
    assert err <= atol, f"{what}: max abs err {err:.3g} > {atol}"


def _problem(m, n, k, seed, dtype=torch.float32, device="cpu", lead=None):
    g = torch.Generator(device).manual_seed(seed)
    shape = (m,) if lead is None else lead
    x = torch.randn((*shape, k), generator=g, device=device).to(dtype)
    w = (torch.randn((n, k), generator=g, device=device) / k ** 0.5).to(dtype)
    b = torch.randn(n, generator=g, device=device).to(dtype)
    r = torch.randn((*shape, n), generator=g, device=device).to(dtype)
    return x, w, b, r


@needs_interpreter
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"bn{c.BLOCK_N}-bk{c.BLOCK_K}-s{c.SPLIT}")
@pytest.mark.parametrize("m", [1, 3, 16, 17, 40])
def test_small_linear_equals_reference(m, cfg):
    x, w, b, r = _problem(m, N, K, seed=m)
    for bias, res in ((None, None), (b, None), (None, r), (b, r)):
        out = S.small_linear(x, w, bias, res, config=cfg)
        ref = S.small_linear_reference(x, w, bias, res)
        _close(out, ref, what=f"M={m} {cfg} bias={bias is not None} residual={res is not None}")


@needs_interpreter
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"bn{c.BLOCK_N}-bk{c.BLOCK_K}-s{c.SPLIT}")
@pytest.mark.parametrize("m", [1, 3, 16, 17, 40])
def test_small_linear_swiglu_equals_reference(m, cfg):
    x, w, b, _ = _problem(m, 2 * N, K, seed=100 + m)
    for bias in (None, b):
        out = S.small_linear_swiglu(x, w, bias, config=cfg)
        ref = S.small_linear_swiglu_reference(x, w, bias)
        assert out.shape == (m, N)
        _close(out, ref, what=f"swiglu M={m} {cfg} bias={bias is not None}")


@needs_interpreter
def test_default_config_leading_dims_and_strided_inputs():
    """config=None (default_config), x [2, 3, K] -> [2, 3, N], and non-contiguous x / residual."""
    S.clear_configs()
    x, w, b, r = _problem(0, 50, 100, seed=5, lead=(2, 3))
    _close(S.small_linear(x, w, b, r), S.small_linear_reference(x, w, b, r), what="[2, 3, K] default config")
    xt = torch.randn((100, 6)).t()  # [6, 100] with stride (1, 6)
    rt = torch.randn((50, 6)).t()
    _close(S.small_linear(xt, w, residual=rt), S.small_linear_reference(xt, w, residual=rt), what="strided x")
    wide = torch.randn((50, 130))[:, :100]  # rows with a stride of 130, unit along K
    _close(S.small_linear(xt, wide), S.small_linear_reference(xt, wide), what="row-strided w")
    wg = torch.randn((64, 100)) / 10
    _close(S.small_linear_swiglu(x, wg), S.small_linear_swiglu_reference(x, wg), what="swiglu [2, 3, K]")
    assert S.small_linear(torch.randn(0, 100), w).shape == (0, 50)
    assert S.small_linear(torch.randn(2, 0, 100), w).shape == (2, 0, 50)


@needs_interpreter
def test_fp16_with_an_fp32_bias_and_split_is_repeatable():
    """fp16 (the interpreter's tl.dot is wrong for bf16: numpy has no bf16), bias in fp32, split 3:
    within fp16's one rounding of the fp32 reference, and the same bits on a second call."""
    x, w, b, r = _problem(5, N, K, seed=9, dtype=torch.float16)
    b = b.float()
    cfg = CONFIGS[1]
    a = S.small_linear(x, w, b, r, config=cfg)
    assert a.dtype == torch.float16
    _close(a, S.small_linear_reference(x, w, b, r), atol=4e-3, what="fp16")
    assert torch.equal(a, S.small_linear(x, w, b, r, config=cfg)), "split-K changed between calls"


def _bad():
    return _problem(3, N, K, seed=1)


@needs_interpreter
@pytest.mark.parametrize("case,match", [
    ("k", r"small_linear: w shape \(40, 71\) does not match x's last dim K=72; valid: \[N, 72\]"),
    ("wdim", r"small_linear: w must be a 2-D tensor \[N, K\], got \(40, 72, 1\)"),
    ("dtype", r"small_linear: x dtype torch.int64 is not supported; valid: bfloat16, float16, float32"),
    ("wdtype", r"small_linear: w dtype torch.float64 differs from x dtype torch.float32"),
    ("colmajor", r"small_linear: w strides \(1, 40\) are not row-major; valid: unit stride along K"),
    ("bias", r"small_linear: bias shape \(41,\) is not valid; valid: \(40,\)"),
    ("biasdtype", r"small_linear: bias dtype torch.float16 on cpu is not valid"),
    ("res", r"small_linear: residual shape \(3, 39\) is not valid; valid: \(3, 40\)"),
    ("resdtype", r"small_linear: residual dtype torch.float64 on cpu is not valid"),
    ("config", r"small_linear: config BLOCK_N=24 is not valid; valid: a power of two in 16..1024"),
    ("split", r"small_linear: config SPLIT=0 is not valid; valid: an int in 1..64"),
    ("warps", r"small_linear: config num_warps=3 is not valid"),
    ("notensor", r"small_linear: x must be a tensor \[..., K\], got list"),
])
def test_bad_inputs_are_refused(case, match):
    x, w, b, r = _bad()
    kw = {}
    if case == "k":
        w = w[:, :71].contiguous()
    elif case == "wdim":
        w = w[:, :, None]
    elif case == "dtype":
        x = x.long()
    elif case == "wdtype":
        w = w.double()
    elif case == "colmajor":
        w = w.t().contiguous().t()
    elif case == "bias":
        b = torch.randn(41)
    elif case == "biasdtype":
        b = b.half()
    elif case == "res":
        r = r[:, :39]
    elif case == "resdtype":
        r = r.double()
    elif case == "config":
        kw["config"] = S.Config(BLOCK_N=24)
    elif case == "split":
        kw["config"] = S.Config(SPLIT=0)
    elif case == "warps":
        kw["config"] = S.Config(num_warps=3)
    elif case == "notensor":
        x = [1.0]
    with pytest.raises(ValueError, match=match):
        S.small_linear(x, w, b if case.startswith("bias") else None, r if case.startswith("res") else None, **kw)


@needs_interpreter
def test_bad_swiglu_inputs_and_cpu_without_interpreter_are_refused(monkeypatch):
    x = torch.randn(2, K)
    with pytest.raises(ValueError, match=r"small_linear_swiglu: w_gate_up shape \(81, 72\) has an odd number of rows"):
        S.small_linear_swiglu(x, torch.randn(81, K))
    with pytest.raises(ValueError, match=r"small_linear_swiglu: bias shape \(40,\) is not valid; valid: \(80,\)"):
        S.small_linear_swiglu(x, torch.randn(80, K), torch.randn(40))
    monkeypatch.setattr(S, "INTERPRETED", False)
    with pytest.raises(ValueError, match="small_linear: x is on cpu; valid: a CUDA device, or any under TRITON_INTERP"):
        S.small_linear(x, torch.randn(N, K))
    assert not S.supported(x, torch.randn(N, K))


@needs_interpreter
def test_supported_is_the_fallback_rule():
    w = torch.randn(N, K)
    assert S.supported(torch.randn(1, K), w)
    assert S.supported(torch.randn(4, 16, K), w)  # 64 rows
    assert S.supported(torch.randn(4096, K), w)  # many rows: the many-rows tier
    assert not S.supported(torch.randn(65, K), w, max_rows=64)  # a caller's own limit
    assert not S.supported(torch.randn(1, K).double(), w.double())
    assert not S.supported(torch.randn(1, K), w.half())
    assert not S.supported(torch.randn(1, K + 1), w)
    assert not S.supported(torch.randn(1, K), w.t().contiguous().t())
    assert not S.supported(torch.randn(1, K), w[None])


def test_config_table_is_used_and_an_explicit_config_wins():
    n, k = 48, 40
    S.clear_configs()
    try:
        assert S.lookup_config(n, k) == S.default_config(n, k)
        cfg = S.Config(BLOCK_N=16, BLOCK_K=16, SPLIT=2, num_warps=2, num_stages=1)
        S.register_config(n, k, cfg)
        assert S.lookup_config(n, k) == cfg
        assert S.lookup_config(n, k, swiglu=True) == S.default_config(n, k, swiglu=True)  # its own key
        with pytest.raises(ValueError, match="register_config: config BLOCK_K=8 is not valid"):
            S.register_config(n, k, S.Config(BLOCK_K=8))
        # a broken table entry is what small_linear runs when config is None ...
        S.TUNED[(n, k)] = S.Config(BLOCK_N=48)
        x, w = torch.randn(2, k), torch.randn(n, k)
        if INTERPRETED:
            with pytest.raises(ValueError, match=r"small_linear \(tuned table\): config BLOCK_N=48 is not valid"):
                S.small_linear(x, w)
            # ... and an explicit config replaces it
            _close(S.small_linear(x, w, config=CONFIGS[0]), S.small_linear_reference(x, w), what="explicit config")
        S.TUNED[(2 * n, k, "swiglu")] = S.Config(num_stages=0)
        if INTERPRETED:
            with pytest.raises(ValueError, match=r"small_linear_swiglu \(tuned table\): config num_stages=0"):
                S.small_linear_swiglu(x, torch.randn(2 * n, k))
    finally:
        S.clear_configs()


def test_plan_keeps_the_few_row_k_ranges_at_every_row_count():
    """plan(): below WIDE_FROM_ROWS the few-row config; from there the many-rows tiles with the
    few-row config's SPLIT and K range (what fixes a row's bits), a registered wide config only
    when it keeps them."""
    S.clear_configs()
    try:
        for n, k, sw in [(6144, 4096, False), (4096, 4096, False), (24576, 4096, True), (4096, 12288, False),
                         (960, 576, False), (40, 72, False)]:
            base = S.lookup_config(n, k, swiglu=sw)
            for rows in (1, 16, S.WIDE_FROM_ROWS - 1, S.WIDE_FROM_ROWS, 1024):
                cfg, kps = S.plan(n, k, rows, swiglu=sw)
                assert kps == base.k_per_split(k) and cfg.SPLIT == base.SPLIT and kps % cfg.BLOCK_K == 0
                assert (cfg == base) == (rows < S.WIDE_FROM_ROWS), (n, k, rows, cfg)
        base = S.lookup_config(4096, 4096)
        keeps = S.Config(BLOCK_N=64, BLOCK_K=64, SPLIT=base.SPLIT, num_warps=4, num_stages=3, BLOCK_M=64)
        S.register_config(4096, 4096, keeps, wide=True)
        assert S.plan(4096, 4096, 512)[0] == keeps
        S.register_config(4096, 4096, S.Config(SPLIT=base.SPLIT * 2, BLOCK_M=64), wide=True)  # other K ranges
        assert S.plan(4096, 4096, 512)[0] == S.default_wide_config(base, 4096)
        with pytest.raises(ValueError, match="config BLOCK_M=8 is not valid; valid: a power of two in 16..256"):
            S.register_config(4096, 4096, S.Config(BLOCK_M=8), wide=True)
    finally:
        S.clear_configs()


def test_measured_many_rows_tables_keep_the_k_ranges_and_go_by_rows(monkeypatch):
    """MEASURED_WIDE_SM90: per shape, tiles by rows (ascending from WIDE_FROM_ROWS), each keeping the
    measured few-row config's SPLIT and K range; plan() takes the entry for the most rows <= M."""
    monkeypatch.setattr(S, "_measured", dict(S.MEASURED_SM90))
    monkeypatch.setattr(S, "_measured_wide", dict(S.MEASURED_WIDE_SM90))
    S.clear_configs()
    for key, table in S.MEASURED_WIDE_SM90.items():
        n, k, swiglu = key[0], key[1], len(key) == 3
        base = S.lookup_config(n, k, swiglu=swiglu)
        starts = [lo for lo, _ in table]
        assert starts == sorted(set(starts)) and starts[0] == S.WIDE_FROM_ROWS, key
        for lo, cfg in table:
            cfg.validate()
            assert cfg.SPLIT == base.SPLIT and base.k_per_split(k) % cfg.BLOCK_K == 0, (key, lo, cfg)
        for rows in (S.WIDE_FROM_ROWS, 100, 200, 511, 512, 700, 1024, 4096):
            want = [c for lo, c in table if lo <= rows][-1]
            assert S.plan(n, k, rows, swiglu=swiglu) == (want, base.k_per_split(k)), (key, rows)


def test_cublas_is_never_asked_on_a_cpu_or_for_few_rows():
    """cublas_gives_same_bits: only CUDA, more than one 16-row tile, SPLIT 1 (else the Triton tiers)."""
    x, w = _problem(64, N, K, seed=0)[:2]
    cfg, kps = S.plan(N, K, 64)
    assert not S.cublas_gives_same_bits(x, w, None, cfg, kps)
    assert not S.cublas_gives_same_bits(x[:S.CUBLAS_FROM_ROWS - 1], w, None, S.Config(), 128)


@needs_interpreter
@pytest.mark.parametrize("m", [S.WIDE_FROM_ROWS - 1, S.WIDE_FROM_ROWS + 3])
def test_many_rows_tier_equals_reference(m):
    """Both tiers (either side of WIDE_FROM_ROWS) against the fp32 reference, plain + residual and
    SwiGLU, K not a multiple of the blocks (masked K) and a multiple (EVEN_K)."""
    for k in (K, 128):
        x, w, b, r = _problem(m, N, k, seed=m + k)
        _close(S.small_linear(x, w, b, r), S.small_linear_reference(x, w, b, r), what=f"m={m} k={k}")
        # SPLIT_INLINE: one program sums the K ranges in order (the workspace path's sum, no workspace)
        inline = S.Config(BLOCK_N=16, BLOCK_K=16, SPLIT=3, BLOCK_M=32, SPLIT_INLINE=True)
        _close(S.small_linear(x, w, b, r, config=inline), S.small_linear_reference(x, w, b, r), what="inline")
        wg = _problem(1, 2 * N, k, seed=5)[1]
        _close(S.small_linear_swiglu(x, wg), S.small_linear_swiglu_reference(x, wg), what=f"swiglu m={m} k={k}")
        _close(S.small_linear_swiglu(x, wg, config=inline), S.small_linear_swiglu_reference(x, wg), what="swiglu inline")


def test_default_config_and_candidates_depend_on_the_shape_only():
    """The heuristic at the H200's 132 SMs (documented in default_config), and the candidate
    lists: <= 24 valid configs, default first, no duplicates."""
    c = S.Config
    assert S.default_config(6144, 4096, sms=132) == c(64, 128, 4, 4, 4)  # qkv: 96 n-blocks x 4
    assert S.default_config(4096, 4096, sms=132) == c(64, 128, 8, 4, 4)  # o: 64 x 8
    assert S.default_config(4096, 12288, sms=132) == c(64, 128, 8, 4, 4)  # down
    assert S.default_config(24576, 4096, swiglu=True, sms=132) == c(32, 128, 1, 4, 4)  # gate_up: 384 programs
    assert S.default_config(151936, 4096, sms=132) == c(64, 128, 1, 4, 4)  # lm_head
    assert S.default_config(960, 576, sms=132) == c(16, 128, 1, 4, 4)  # small K: no split, narrower tiles
    assert S.default_config(40, 20, dtype=torch.float32, sms=132) == c(16, 32, 1, 4, 3)
    for n, k, sw in [(6144, 4096, False), (4096, 4096, False), (4096, 12288, False), (24576, 4096, True),
                     (151936, 4096, False), (960, 576, False), (576, 1536, False), (40, 72, False)]:
        cands = S.candidate_configs(n, k, swiglu=sw, sms=132)
        assert 1 <= len(cands) <= S.MAX_CANDIDATES
        assert cands[0] == S.default_config(n, k, swiglu=sw, sms=132)
        assert len(set(cands)) == len(cands)
        for cfg in cands:
            cfg.validate()
            assert cfg.SPLIT == 1 or k // cfg.SPLIT >= 2 * cfg.BLOCK_K


def test_tune_refuses_a_cpu_device():
    with pytest.raises(ValueError, match="tune: device cpu is not a CUDA device"):
        S.tune([(64, 64)], torch.float32, "cpu")


@needs_interpreter
def test_tune_selection_with_a_fake_timer():
    """_tune (tune without CUDA events): each candidate is checked against the reference and
    timed; the fastest that works wins and goes into the table; one that raises (as a compile
    failure would) is skipped."""
    cands = [S.Config(16, 16, 1, 4, 1), S.Config(32, 32, 2, 4, 1), S.Config(16, 32, 1, 2, 1)]
    fake = {cands[0]: 5.0, cands[1]: 1.0, cands[2]: 3.0}
    timed = []

    def time_fn(call, cfg, copies):
        assert copies == 1  # no L2 on the CPU
        call()  # runs the kernel under the interpreter
        timed.append(cfg)
        if cfg == cands[1]:
            raise RuntimeError("out of resources (simulated)")
        return fake[cfg]

    S.clear_configs()
    try:
        won = S._tune([(40, 24), (64, 24, "swiglu")], torch.float32, "cpu", 3, lambda n, k, sw: cands, time_fn)
        assert won == {(40, 24): cands[2], (64, 24, "swiglu"): cands[2]}
        assert timed == cands + cands
        assert S.TUNED[(40, 24)] == cands[2] and S.TUNED[(64, 24, "swiglu")] == cands[2]
        assert S.lookup_config(40, 24) == cands[2]
        assert [(sk[1], sk[2][:12]) for sk in S.TUNE_SKIPPED] == [(cands[1], "RuntimeError")] * 2
        with pytest.raises(ValueError, match=r"tune: shape \(40, 24, 'gelu'\) is not valid; valid: \(N, K\) or"):
            S._tune([(40, 24, "gelu")], torch.float32, "cpu", 3, cands, time_fn)
        with pytest.raises(ValueError, match="tune: config BLOCK_K=8 is not valid"):
            S._tune([(40, 24)], torch.float32, "cpu", 3, [S.Config(BLOCK_K=8)], time_fn)
    finally:
        S.clear_configs()


def test_weight_copies_cover_twice_the_l2():
    assert S.weight_copies(50 << 20, 50 << 20) == 2
    assert S.weight_copies(200 << 20, 50 << 20) == 1
    assert S.weight_copies(1 << 20, 50 << 20) == 64  # capped
    assert S.weight_copies(1 << 20, 0) == 1


# ------------------------------------------------------------------------------ bench script


def _bench():
    spec = importlib.util.spec_from_file_location("linear_speed", REPO / "bench" / "linear_speed.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("linear_speed", mod)
    spec.loader.exec_module(mod)
    return mod


def test_bench_shapes_and_arguments(capsys):
    b = _bench()
    q = b.model_shapes("qwen3_8b")
    assert q == {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
                 "lm_head": (151936, 4096)}
    assert b.model_shapes("smollm2_135m") == {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576),
                                              "down": (576, 1536)}
    a = b.parse_args(["--out", "x.json", "--shapes", "smollm2_135m", "--m", "1,4,16"])
    assert a.out == "x.json" and a.shapes == ["smollm2_135m"] and a.m == [1, 4, 16]
    with pytest.raises(SystemExit):
        b.parse_args(["--shapes", "llama_70b"])
    with pytest.raises(SystemExit) as e:
        b.parse_args(["--help"])
    assert e.value.code == 0 and "--out" in capsys.readouterr().out
    # bytes moved and bandwidth: W, x and y once, bf16
    assert b.bytes_moved(4096, 4096, 16, 2) == 2 * (4096 * 4096 + 16 * 4096 + 16 * 4096)
    assert b.gbps(1e9, 1e6) == pytest.approx(1.0)  # 1 GB in 1 s


def test_bench_winner_is_one_config_for_every_m():
    """pick_winners: the least total over the M values among configs timed at every M (the engine
    uses one config whatever M), beside each M's own fastest; failed / skipped entries drop out."""
    b = _bench()
    a, c, d = ({"BLOCK_N": bn} for bn in (16, 32, 64))

    def row(m, times, cublas=10.0):
        cfgs = [{"config": cfg, "us": t} if t is not None else {"config": cfg, "skipped": True}
                for cfg, t in times]
        best = min((x for x in cfgs if "us" in x), key=lambda x: x["us"])
        return {"model": "q", "layer": "o", "op": "linear", "n": 8, "k": 8, "m": m, "cublas": {"us": cublas},
                "configs": cfgs, "best": best}

    rows = [row(1, [(a, 5.0), (c, 4.0), (d, 1.0)]), row(16, [(a, 5.0), (c, 7.0), (d, None)], cublas=12.0)]
    w = b.pick_winners(rows)["q/o/linear"]
    assert w["config_all_m"] == a and w["us_sum_all_m"] == 10.0  # c: 11; d was not timed at M = 16
    assert w["per_m"] == {"1": d, "16": a} and w["cublas_us_sum_all_m"] == 22.0 and w["m"] == [1, 16]


# ------------------------------------------------------------------------------ GPU


def _bf16_close(a, b, rtol, atol, what):
    torch.testing.assert_close(a.float(), b.float(), rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("n,k,split", [(6144, 4096, 1), (4096, 4096, 8), (4096, 12288, 4), (960, 576, 1)])
def test_gpu_bf16_matches_f_linear(n, k, split):
    """bf16: within half an ulp of the fp32 reference (one rounding), and within bf16 tolerance of
    the eager math (F.linear, then + r / silu * mul: rounded more often)."""
    F = torch.nn.functional
    dev = torch.device("cuda")
    for m in (1, 16):
        x, w, b, r = _problem(m, n, k, seed=m, dtype=torch.bfloat16, device=dev)
        cfg = S.Config(BLOCK_N=64, BLOCK_K=128, SPLIT=split)
        out = S.small_linear(x, w, b, r, config=cfg)
        assert out.dtype == torch.bfloat16 and out.shape == (m, n)
        _bf16_close(out, S.small_linear_reference(x, w, b, r), 2 ** -7, 1e-3, "vs the fp32 reference")
        _bf16_close(out, F.linear(x, w, b) + r, 2 ** -6, 3e-2, "vs F.linear + r")
        wg = _problem(m, 2 * n, k, seed=7, dtype=torch.bfloat16, device=dev)[1]
        sw = S.small_linear_swiglu(x, wg, config=S.Config(BLOCK_N=32, SPLIT=split))
        _bf16_close(sw, S.small_linear_swiglu_reference(x, wg), 2 ** -7, 1e-3, "swiglu vs the fp32 reference")
        g, u = F.linear(x, wg).chunk(2, dim=-1)
        _bf16_close(sw, F.silu(g) * u, 2 ** -5, 3e-2, "swiglu vs eager")


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("split", [1, 4])
def test_gpu_a_rows_bits_do_not_depend_on_m(split):
    """bf16: row j alone (M = 1) gives the bits of row j inside M = 16 and M = 40, for the plain
    and the SwiGLU kernel, with one K range or four; and repeated calls give the same bits.
    GPU only: the CPU interpreter's numpy matmul rounds a row by its place in the tile."""
    dev = torch.device("cuda")
    x, w, b, r = _problem(40, 4096, 4096, seed=3, dtype=torch.bfloat16, device=dev)
    wg = _problem(1, 2 * 1024, 4096, seed=4, dtype=torch.bfloat16, device=dev)[1]
    cfg = S.Config(BLOCK_N=64, BLOCK_K=128, SPLIT=split)
    full = S.small_linear(x[:16], w, b, r[:16], config=cfg)
    more = S.small_linear(x, w, b, r, config=cfg)
    sfull = S.small_linear_swiglu(x[:16], wg, config=cfg)
    assert torch.equal(full, S.small_linear(x[:16], w, b, r[:16], config=cfg)), "not deterministic"
    for j in (0, 5, 15):
        one = S.small_linear(x[j:j + 1], w, b, r[j:j + 1], config=cfg)
        assert torch.equal(one[0], full[j]) and torch.equal(one[0], more[j]), f"row {j}: bits depend on M"
        assert torch.equal(S.small_linear_swiglu(x[j:j + 1], wg, config=cfg)[0], sfull[j]), f"swiglu row {j}"


# M values the issue names: across the 16-row tile edges and the many-rows tier's switch
BITS_MS = (1, 15, 16, 17, 33, 63, 64, 65, 128, 129, 255, 256, 300, 512, 1024)


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("shape", [(6144, 4096, False, False), (4096, 4096, False, True),
                                   (24576, 4096, True, False), (4096, 12288, False, True),
                                   (151936, 4096, False, False), (960, 576, False, False),
                                   (576, 576, False, True), (3072, 576, True, False), (576, 1536, False, True)],
                         ids=["qkv", "o", "gate_up", "down", "lm_head", "smollm2_qkv", "smollm2_o",
                              "smollm2_gate_up", "smollm2_down"])
def test_gpu_a_rows_bits_are_the_same_at_every_m(shape):
    """The engine's path (config=None: the few-row tier below WIDE_FROM_ROWS rows, the many-rows
    tier from there) at Qwen3-8B's and SmolLM2's shapes with the H200's measured tables: rows 0,
    7 and 14 (and the last row of each M) have the same bits at every M in BITS_MS as alone."""
    n, k, swiglu, res = shape
    dev = torch.device("cuda")
    S.use_measured_configs(dev)
    x, w, b, r = _problem(max(BITS_MS), n, k, seed=11, dtype=torch.bfloat16, device=dev)
    op = (lambda x_, r_: S.small_linear_swiglu(x_, w)) if swiglu else (
        lambda x_, r_: S.small_linear(x_, w, residual=r_[:, :n] if res else None))
    if res:
        r = torch.randn(max(BITS_MS), n, device=dev).bfloat16()
    alone = {j: op(x[j:j + 1], r[j:j + 1])[0] for j in (0, 7, 14)}
    for m in BITS_MS:
        y = op(x[:m], r[:m])
        for j, want in alone.items():
            if j < m:
                assert torch.equal(y[j], want), f"{shape}: row {j} at M = {m} differs from the row alone"
        last = op(x[m - 1:m], r[m - 1:m])[0]
        assert torch.equal(y[m - 1], last), f"{shape}: the last row of M = {m} differs from the row alone"


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
def test_gpu_small_weights_never_go_to_cublas():
    """CUBLAS_MIN_WEIGHT_BYTES: SmolLM2's q/k/v weight (1.1 MB) stays on the Triton tiers at every M (no cuBLAS
    check runs), its LM head (56 MB) is checked at 64 rows."""
    dev = torch.device("cuda")
    S.use_measured_configs(dev)
    S._CUBLAS_SAME.clear()
    for m in (17, 64, 128, 256, 1024):
        x, w = _problem(m, 960, 576, seed=m, dtype=torch.bfloat16, device=dev)[:2]
        S.small_linear(x, w)
    assert not S._CUBLAS_SAME, "a small weight was checked for cuBLAS"
    x, w = _problem(64, 49152, 576, seed=1, dtype=torch.bfloat16, device=dev)[:2]
    S.small_linear(x, w)
    assert [key[0] for key in S._CUBLAS_SAME] == [(49152, 576)]


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
def test_gpu_cublas_runs_many_rows_only_with_the_kernels_bits(monkeypatch):
    """At Qwen3-8B's q/k/v shape and M = 512 the engine's path hands the call to cuBLAS once cuBLAS
    gave the Triton tiers' bits (the H200 does: linear_rows_probe); its output then equals the Triton
    path's bit for bit (DOMINO_GRAFT_CUBLAS_ROWS=0), and a call inside a graph capture never checks."""
    dev = torch.device("cuda")
    S.use_measured_configs(dev)
    x, w = _problem(512, 6144, 4096, seed=21, dtype=torch.bfloat16, device=dev)[:2]
    S._CUBLAS_SAME.clear()
    y = S.small_linear(x, w)
    assert list(S._CUBLAS_SAME.values()) == [True], "cuBLAS did not give the kernel's bits at q/k/v, M = 512"
    monkeypatch.setattr(S, "CUBLAS_ROWS", False)  # DOMINO_GRAFT_CUBLAS_ROWS=0
    assert torch.equal(y, S.small_linear(x, w)), "the cuBLAS and Triton paths differ"
    monkeypatch.setattr(S, "CUBLAS_ROWS", True)
    S._CUBLAS_SAME.clear()
    xs = x[:300].clone()
    S.small_linear(xs, w)  # compile outside the capture
    S._CUBLAS_SAME.clear()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        inside = S.small_linear(xs, w)
    graph.replay()
    assert not S._CUBLAS_SAME, "a check ran inside a capture"
    assert torch.equal(inside, S.small_linear(xs, w)), "the captured (Triton) call and the checked call differ"


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
def test_gpu_tune_fills_the_table():
    S.clear_configs()
    try:
        won = S.tune([(1024, 1024), (2048, 1024, "swiglu")], torch.bfloat16, "cuda", m=16)
        assert set(won) == {(1024, 1024), (2048, 1024, "swiglu")}
        assert S.lookup_config(1024, 1024) == won[(1024, 1024)]
        assert S.lookup_config(2048, 1024, swiglu=True) == won[(2048, 1024, "swiglu")]
        x, w = _problem(16, 1024, 1024, seed=0, dtype=torch.bfloat16, device=torch.device("cuda"))[:2]
        _bf16_close(S.small_linear(x, w), S.small_linear_reference(x, w), 2 ** -7, 1e-3, "tuned config")
    finally:
        S.clear_configs()
