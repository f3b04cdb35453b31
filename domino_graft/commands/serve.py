"""`domino-graft serve [RUN_OR_BUNDLE]`: an OpenAI-compatible HTTP server (domino_graft/serving)."""

from __future__ import annotations


def add_arguments(p) -> None:
    p.add_argument("run", nargs="?", metavar="RUN_OR_BUNDLE", help="run dir or bundle (default: the latest run)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-batch", type=int, default=8, metavar="N",
                   help="rows decoded together (chain drafters with ragged batches; others decode one at a time)")
    p.add_argument("--max-queue", type=int, default=64, metavar="N",
                   help="requests that may wait for a row; more get 429 with Retry-After")
    p.add_argument("--api-key", metavar="KEY", help="require 'Authorization: Bearer KEY' on /v1/*")
    p.add_argument("--served-model-name", metavar="NAME", help="the model id clients send (default: the folder's name)")
    p.add_argument("--max-model-len", type=int, metavar="N",
                   help="positions per request, prompt + answer (default: the target's max_position_embeddings); "
                        "the warm start reserves the cache for --max-batch rows of this many positions")
    p.add_argument("--target-only", action="store_true", help="no speculation: serve the target alone (the baseline)")
    p.add_argument("--drain-timeout", type=float, default=30.0, metavar="S",
                   help="on SIGTERM, seconds to finish the requests in flight (default 30)")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, metavar="N", help="larger request bodies get 413")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--kv", default="auto", choices=("auto", "dynamic", "static"), help="as for generate")
    p.add_argument("--rollout", default=None, help="as for generate")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), help="weights dtype (default: the recipe's target.dtype)")
    p.add_argument("--verify-budget", default=None, metavar="{full,auto,N}",
                   help="drafts each block verifies (docs/design.md §5): default auto on CUDA, full elsewhere")
    p.add_argument("--verify-costs", metavar="FILE.json", help="costs for --verify-budget auto (needed off CUDA)")
    p.add_argument("--no-warm-start", dest="warm_start", action="store_false",
                   help="skip the warm start: by default, before /health says ok, the batched server reserves its "
                        "caches at full size and captures every shape traffic can meet (CUDA graphs, compiles, the "
                        "verify budget's costs), so no request waits for them (docs/serving.md)")
    p.add_argument("--admit-in-place", default="auto", choices=("auto", "on", "off"),
                   help="prefill new requests into freed rows of the batch in flight instead of rebuilding it "
                        "(auto, the default: on; docs/serving.md)")
    p.add_argument("--admission-cohorts", default="auto", choices=("auto", "on", "off"),
                   help="hold queued requests while rows of the batch in flight free up, at most 8 admissions' "
                        "time, to admit them in one call (auto, the default: off until measured on a GPU; "
                        "docs/serving.md)")
    p.add_argument("--prefill-chunk", type=int, default=None, metavar="N",
                   help="a prompt admitted in place (--admit-in-place) longer than N tokens is prefilled N tokens a "
                        "block, between the blocks of the requests in flight (default 512; docs/serving.md)")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))


def run(args) -> int:
    from ..progress import loading
    from ..serving.server import ServeOptions, serve

    opts = ServeOptions(run=args.run, host=args.host, port=args.port, max_batch=args.max_batch,
                        max_queue=args.max_queue, api_key=args.api_key, model_name=args.served_model_name,
                        max_model_len=args.max_model_len, target_only=args.target_only, device=args.device,
                        kv=args.kv, rollout=args.rollout, drain_s=args.drain_timeout,
                        max_body_bytes=args.max_body_bytes, log_level=args.log_level,
                        dtype=args.dtype, verify_budget=args.verify_budget, verify_costs=args.verify_costs,
                        warm_start=args.warm_start, admit_in_place=args.admit_in_place,
                        admission_cohorts=args.admission_cohorts, prefill_chunk=args.prefill_chunk)
    opts.check()  # before minutes of loading
    loading("serve")
    return serve(opts)
