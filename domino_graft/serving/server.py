"""Load a run or bundle, build the engine, the scheduler and the app, and serve with uvicorn.

Shutdown (SIGTERM or Ctrl-C): uvicorn stops accepting connections and waits up to
`drain_s` for the responses in flight, streams included; then the worker cancels what is left
(no client waits for it any more) and ends at its next block, and the process exits 0.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Optional


ADMIT_CHOICES = ("auto", "on", "off")


@dataclass
class ServeOptions:
    run: Optional[str]
    host: str = "127.0.0.1"
    port: int = 8000
    max_batch: int = 8
    max_queue: int = 64
    api_key: Optional[str] = None
    model_name: Optional[str] = None
    max_model_len: Optional[int] = None
    target_only: bool = False
    device: str = "auto"
    kv: str = "auto"
    rollout: Optional[str] = None
    drain_s: float = 30.0
    max_body_bytes: int = 1 << 20
    log_level: str = "info"
    dtype: Optional[str] = None  # bf16, fp16 or fp32: the weights' dtype (None: the recipe's)
    verify_budget: Optional[str] = None  # full, auto or N; None: auto on CUDA, full elsewhere
    verify_costs: Optional[str] = None  # a cost table for auto (needed off CUDA)
    warm_start: bool = True  # reserve the caches and visit every shape before /health says ok (serving/warmup.py)
    admit_in_place: str = "auto"  # on, off, or auto (the scheduler's default): new requests into freed rows
    admission_cohorts: str = "auto"  # on, off, or auto (off for now): rows freed apart admitted together (cohorts.py)
    prefill_chunk: Optional[int] = None  # a prompt admitted in place longer than this goes in chunks (None: 512)

    def check(self) -> None:
        """Every bad option, before minutes of loading."""
        problems = []
        for name, low in (("max_batch", 1), ("max_queue", 1), ("max_body_bytes", 1), ("prefill_chunk", 1)):
            if getattr(self, name) is not None and getattr(self, name) < low:
                problems.append(f"--{name.replace('_', '-')}: {getattr(self, name)!r} is invalid; valid: an integer >= {low}")
        if not 0 <= self.port <= 65535:
            problems.append(f"--port: {self.port!r} is invalid; valid: 0..65535 (0 = any free port)")
        if self.max_model_len is not None and self.max_model_len < 2:
            problems.append(f"--max-model-len: {self.max_model_len!r} is invalid; valid: an integer >= 2")
        if not self.drain_s >= 0:
            problems.append(f"--drain-timeout: {self.drain_s!r} is invalid; valid: seconds >= 0")
        if self.verify_budget is not None:
            from ..decoding.budget import VerifyBudget

            try:
                VerifyBudget.parse(self.verify_budget)
            except ValueError as e:
                problems.append(str(e))
        if self.admit_in_place not in ADMIT_CHOICES:
            problems.append(f"--admit-in-place: {self.admit_in_place!r} is invalid; valid: {', '.join(ADMIT_CHOICES)}")
        if self.admission_cohorts not in ADMIT_CHOICES:
            problems.append(f"--admission-cohorts: {self.admission_cohorts!r} is invalid; valid: "
                            f"{', '.join(ADMIT_CHOICES)}")
        if self.api_key is not None and not self.api_key.strip():
            problems.append("--api-key: empty; valid: a non-empty token (or leave --api-key out)")
        if problems:
            raise ValueError("; ".join(problems))


def build(opts: ServeOptions):
    """-> (the FastAPI app wrapped in the body limit, the Served state)."""
    from ..decoding import Engine, check_rollout_name, rollout_choice, stop_token_ids
    from ..device import pick_device
    from ..loading import load_run_or_bundle
    from .app import BodyLimit, Served, create_app
    from .metrics import Metrics
    from .scheduler import Scheduler

    if opts.rollout is not None:
        check_rollout_name(opts.rollout)
    loaded = load_run_or_bundle(opts.run, device=pick_device(opts.device, option="--device"))
    target = loaded.target
    if opts.dtype is not None:  # target, drafter and head in one dtype, as bench/concurrency.py runs them
        from ..target import TORCH_DTYPES

        for module in (target.model, loaded.adapter, loaded.head):
            if module is not None:
                module.to(TORCH_DTYPES[opts.dtype])
    positions = target.shape.max_position_embeddings
    if opts.max_model_len is not None and opts.max_model_len > positions:
        raise ValueError(f"--max-model-len: {opts.max_model_len} is beyond the target's {positions} positions "
                         f"(max_position_embeddings); valid: 2..{positions}")
    engine = Engine(target, loaded.adapter, loaded.head, rollout=rollout_choice(loaded.recipe.bench, opts.rollout),
                    stop_ids=stop_token_ids(target), kv=opts.kv)
    metrics = Metrics()
    max_model_len = opts.max_model_len or positions  # what prompt + max_tokens may reach (app._budget)
    scheduler = Scheduler(engine, max_batch=opts.max_batch, max_queue=opts.max_queue,
                          target_only=opts.target_only, metrics=metrics, budget=verify_budget(opts, engine),
                          warm_start=max_model_len if opts.warm_start else None,
                          admit_in_place={"on": True, "off": False}.get(opts.admit_in_place),
                          cohorts={"on": True, "off": False}.get(opts.admission_cohorts),
                          **({} if opts.prefill_chunk is None else {"prefill_chunk": opts.prefill_chunk}))
    served = Served(loaded=loaded, engine=engine, scheduler=scheduler, metrics=metrics,
                    model_name=opts.model_name or Path(loaded.path).name,
                    max_model_len=max_model_len, api_key=opts.api_key, max_body_bytes=opts.max_body_bytes)
    app = create_app(served)
    return BodyLimit(app, opts.max_body_bytes, metrics), served


def verify_budget(opts: ServeOptions, engine):
    """The batched chains' verify budget (decoding/budget.py): --verify-budget, by default auto on
    CUDA (costs measured there) and full elsewhere; None for full or the target alone."""
    from ..decoding.budget import VerifyBudget, VerifyCosts

    device_type = engine.target.device.type
    text = opts.verify_budget or ("auto" if device_type == "cuda" else "full")
    costs = VerifyCosts.load(opts.verify_costs) if opts.verify_costs else None
    budget = VerifyBudget.parse(text, costs)
    if budget.mode == "full" or opts.target_only or engine.adapter is None:
        return None
    budget.check(engine.adapter.num_slots, device_type)
    return budget


def serve(opts: ServeOptions) -> int:
    import uvicorn

    from .scheduler import describe

    opts.check()
    app, served = build(opts)
    scheduler = served.scheduler
    log = logging.getLogger("domino_graft.serve")
    if not log.handlers:  # the worker's lines (the warm start's at info) beside uvicorn's, at --log-level
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
        log.addHandler(handler)
        log.propagate = False
    log.setLevel(opts.log_level.upper())
    config = uvicorn.Config(app, host=opts.host, port=opts.port, log_level=opts.log_level,
                            timeout_graceful_shutdown=opts.drain_s, access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    # a warm start that fails means the model cannot run what traffic would ask of it: stop, exit 1
    scheduler.on_fatal = lambda message: setattr(server, "should_exit", True)
    scheduler.start()
    family = served.loaded.adapter.family
    print(f"serve: {served.model_name} ({family} drafter{', target alone' if opts.target_only else ''}; "
          f"{scheduler.mode}, max batch {opts.max_batch}, queue {opts.max_queue}, verify budget "
          f"{describe(scheduler)['verify_budget']}) on http://{opts.host}:{opts.port}"
          f"{'; warming up (/health: 503 warming until ready)' if scheduler.warming else ''}",
          flush=True)
    # uvicorn catches SIGTERM for its graceful shutdown, then restores the handler it found and
    # raises the signal again, which with the default handler kills the process (-15) before the
    # worker drains. The handler it finds is this no-op, so the drained server exits 0.
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, previous)  # serve in process (tests): the caller's handler back
        drained = scheduler.stop(opts.drain_s, abandon=True)
        if not drained:
            log.warning("the model worker was still busy after %.0f s; its remaining requests were failed",
                        opts.drain_s)
    if scheduler.warm_failed:
        raise RuntimeError(f"serve: {scheduler.error}; nothing was served (a smaller --max-batch or --max-model-len "
                           "needs less memory; --no-warm-start defers every shape to the first request that meets it)")
    return 0 if server.started else 1
