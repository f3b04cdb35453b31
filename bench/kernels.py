"""One bench entry per kernel, named as the kernel is (kernels/<client>/<name>.py, tests/kernels/test_<name>.py):
the kernel against the reference it is tested against, at one decode-time shape, through the harness.

    python bench/kernels.py --out kernels_h200.json                        # every entry, one GPU
    python bench/kernels.py small_linear row_norm --out x.json              # some
    python bench/kernels.py --smoke --out /tmp/k.json                       # CPU: tiny shapes, interpreter

A row: {"kernel", "shape", "kernel": spread, "reference": spread, "speedup"} (spread: the harness's
median, quartiles, min / max and n, ms); the report carries the environment (gpu, versions,
commit, date, command). The deep benches of a kernel's design choices stay where they were:
bench/linear_speed.py and bench/linear_rows_probe.py (small_linear's tiles against cuBLAS),
bench/rollout.py (every rollout variant, L2 flushed, launch constants swept).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402  (bench/ is not a package)

# shapes: (GPU, CPU smoke); GPU ones are Qwen3-8B's (the head's rollout at batch 1)
QWEN = dict(h=4096, g=1024, r=256, v=151936, heads=32, kv_heads=8, head_dim=128)
TINY = dict(h=24, g=20, r=12, v=97, heads=4, kv_heads=2, head_dim=16)


def _dev():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _dtype(smoke: bool):
    return torch.float32 if smoke else torch.bfloat16


def small_linear(s, smoke):
    from domino_graft.kernels.engine.small_linear import small_linear as kernel

    n, k = (40, 24) if smoke else (s["h"], s["h"])  # Qwen3-8B's o_proj
    x = torch.randn(16, k, device=_dev(), dtype=_dtype(smoke))
    w = torch.randn(n, k, device=_dev(), dtype=_dtype(smoke)) / k ** 0.5
    return f"M=16 N={n} K={k}", lambda: kernel(x, w), lambda: torch.nn.functional.linear(x, w)


def decode_attention(s, smoke):
    from domino_graft.fast.llama_split import attention_reference
    from domino_graft.kernels.engine.decode_attention import decode_attention as kernel

    b, t, ctx = 1, 16, 64 if smoke else 512
    h, hkv, d = s["heads"], s["kv_heads"], s["head_dim"]
    q = torch.randn(b, t, h * d, device=_dev(), dtype=_dtype(smoke))
    kc = torch.randn(b, hkv, ctx + t, d, device=_dev(), dtype=_dtype(smoke))
    vc = torch.randn_like(kc)
    pos = torch.full((b,), ctx, device=_dev(), dtype=torch.int32)
    kw = dict(num_heads=h, num_kv_heads=hkv, head_dim=d)
    return (f"B={b} T={t} context={ctx} H={h} Hkv={hkv} D={d}", lambda: kernel(q, kc, vc, pos, **kw),
            lambda: attention_reference(q, kc, vc, pos, **kw))


def row_norm(s, smoke):
    from domino_graft.fast.llama_math import rms_norm
    from domino_graft.kernels.engine.row_norm import rms_norm_rows

    x = torch.randn(16, s["h"], device=_dev(), dtype=_dtype(smoke))
    w = torch.ones(s["h"], device=_dev(), dtype=_dtype(smoke))
    return f"M=16 H={s['h']}", lambda: rms_norm_rows(x, w, 1e-6), lambda: rms_norm(x, w, 1e-6)


def pdl(s, smoke):
    """A chain of eight batch-1 projections, each the next one's input, launched with programmatic
    dependent launch (kernel) and without (reference): what kernels/engine/pdl.py hides per launch."""
    from domino_graft.kernels.engine import pdl as P
    from domino_graft.kernels.engine.small_linear import small_linear

    h = 40 if smoke else s["h"]
    x = torch.randn(1, h, device=_dev(), dtype=_dtype(smoke))
    ws = [torch.randn(h, h, device=_dev(), dtype=_dtype(smoke)) / h ** 0.5 for _ in range(8)]

    def chain(on: bool):
        def run():
            was, P.ENABLED = P.ENABLED, on
            try:
                y = x
                for w in ws:
                    y = small_linear(y, w)
                return y
            finally:
                P.ENABLED = was
        return run

    return f"8 x (M=1 N={h} K={h})", chain(True), chain(False)


def sample_rows(s, smoke):
    """A sampled rollout slot's draw at B = 16 over the vocabulary, against the torch inverse CDF."""
    from domino_graft.kernels.head.reference import inverse_cdf
    from domino_graft.kernels.head.sample_rows import sample_rows as kernel

    v = s["v"]
    probs = torch.softmax(torch.randn(16, v, device=_dev()), -1)
    u = torch.rand(16, device=_dev())
    return f"B=16 V={v}", lambda: kernel(probs, u), lambda: inverse_cdf(probs, u)


def sample_logits(s, smoke):
    """A sampled rollout slot at B = 16, T = 1 (softmax written as q, one draw), logits held [V, B] as the
    full-vocabulary rollout holds them, against the torch slot (warp, inverse CDF, the two copies)."""
    from domino_graft.kernels.head.domino_rollout import FusedRollout
    from domino_graft.kernels.head.reference import filtered_probs
    from domino_graft.kernels.head.sample_logits import sample_logits as kernel

    v, b, k = s["v"], 16, 15
    logits = torch.randn(v, b, device=_dev()).t()
    u = torch.rand(b, k, device=_dev())
    q = torch.empty(b, k, v, device=_dev())
    tok = torch.empty(k, b, dtype=torch.int64, device=_dev())
    return (f"B=16 V={v} T=1", lambda: kernel(logits, 1.0, u[:, 0], q[:, 0], tok[0]),
            lambda: FusedRollout._sample(filtered_probs(logits, 1.0, 0, 1.0), None, u, q, tok, 1))


def verify_sampled(s, smoke):
    """Speculative sampling's accept rule at B = 16, K = 3, T = 1 (four launches), against the torch rule
    (decoding/verify.py's verify_sampling: warp, gathers, residual, multinomial)."""
    from domino_graft.decoding.verify import verify_sampling
    from domino_graft.kernels.head.verify_sampled import verify_sampled as kernel
    from domino_graft.sampling import warp

    v, b, k = s["v"], 16, 3
    logits = torch.randn(b, k + 1, v, device=_dev())
    q = torch.softmax(torch.randn(b, k, v, device=_dev()), -1)
    drafts = torch.randint(0, v, (b, k), device=_dev())
    u, w = torch.rand(b, k, device=_dev()), torch.rand(b, device=_dev())
    return (f"B=16 K=3 V={v} T=1", lambda: kernel(logits, q, drafts, 1.0, u, w),
            lambda: verify_sampling(warp(logits, 1.0), q, drafts, None))


def _rollout(s, smoke, name, **kw):
    from domino_graft.head import DominoHead, HeadSpec
    from domino_graft.kernels.head import make_rollout, reference_rollout
    from domino_graft.kernels.head.reference import dense_embed

    class Block:  # duck-types adapters.base.DraftBlock
        def __init__(self, hidden, base_logits):
            self.hidden, self.base_logits = hidden, base_logits

    k, dt, dev = 16, _dtype(smoke), _dev()
    spec = HeadSpec(hidden_dim=s["h"], emb_dim=s["h"], gru_hidden_dim=s["g"], rank=s["r"], vocab_size=s["v"])
    with torch.device(dev):
        head = DominoHead(spec, zero_init_w2=False).to(dt)
        emb = torch.randn(s["v"], s["h"], dtype=dt)
        block = Block(torch.randn(1, k, s["h"], dtype=dt), torch.randn(1, k, s["v"], dtype=dt))
        anchor = torch.zeros(1, dtype=torch.long)
    embed = dense_embed(emb)
    roll = make_rollout(name, head, emb, **kw)
    pool = kw.get("pool_size", 0)
    return (f"B=1 K={k} H={s['h']} G={s['g']} r={s['r']} V={s['v']}" + (f" pool={pool}" if pool else ""),
            lambda: roll(head, block, anchor, embed),
            lambda: reference_rollout(head, block, anchor, embed, pool_size=pool))


def triton_rollout(s, smoke):
    return _rollout(s, smoke, "triton")


def domino_rollout(s, smoke):
    return _rollout(s, smoke, "triton_pool", pool_size=16 if smoke else 2048)


def triton_persistent(s, smoke):
    from domino_graft.kernels.head import KernelConfig

    return _rollout(s, smoke, "triton_pool", pool_size=16 if smoke else 2048,
                    config=KernelConfig(pool_persistent=True))


def head_ce(s, smoke):
    from domino_graft.kernels.head import dense_head_ce, head_ce as kernel

    n, r, v = (45, s["r"], s["v"]) if smoke else (16 * 64, s["r"], s["v"])  # 64 blocks of 16 slots
    z = torch.randn(n, r, device=_dev(), requires_grad=True)
    w2 = torch.randn(v, r, device=_dev(), requires_grad=True)
    base = torch.randn(n, v, device=_dev())
    labels = torch.randint(0, v, (n,), device=_dev())
    return (f"N={n} r={r} V={v} (forward + backward)", lambda: kernel(z, w2, base, labels).sum().backward(),
            lambda: dense_head_ce(z, w2, base, labels).sum().backward())


# kernel name (its module's name under kernels/engine or kernels/head) -> entry
ENTRIES = {f.__name__: f for f in (small_linear, decode_attention, row_norm, pdl, domino_rollout, triton_rollout, sample_rows,
                                   sample_logits, verify_sampled, triton_persistent, head_ce)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("kernels", nargs="*", help=f"entries (default: all): {', '.join(ENTRIES)}")
    p.add_argument("--out", required=True)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--smoke", action="store_true", help="tiny shapes (the CPU run: numbers meaningless)")
    args = p.parse_args(argv)
    bad = [k for k in args.kernels if k not in ENTRIES]
    if bad:
        p.error(f"unknown kernel(s) {', '.join(bad)}; valid: {', '.join(ENTRIES)}")
    shapes = TINY if args.smoke or not torch.cuda.is_available() else QWEN
    iters, warmup = (2, 1) if args.smoke else (args.iters, args.warmup)
    report = {**harness.environment(), "rows": []}
    for name in args.kernels or ENTRIES:
        torch.manual_seed(0)
        shape, kernel, reference = ENTRIES[name](shapes, args.smoke)
        k, ref = harness.time_cuda(kernel, iters, warmup), harness.time_cuda(reference, iters, warmup)
        report["rows"].append({"kernel": name, "shape": shape, "kernel_ms": k, "reference_ms": ref,
                               "speedup": ref["ms"] / k["ms"] if k["ms"] > 0 else None})
        print(f"{name:18s} {shape:45s} {k['ms']:9.4f} ms  reference {ref['ms']:9.4f} ms", flush=True)
        harness.write_json(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
