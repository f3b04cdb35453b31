"""`domino-graft serve`: an OpenAI-compatible HTTP server over the project's own lossless engine.

    protocol    the request bodies (strict pydantic models) and the OpenAI error JSON
    batch       a chain batch stepped block by block (batched_chain's loop, cut at block boundaries)
    scheduler   the queue and the one model worker thread: continuous batching, or one at a time
    warmup      the warm start: caches reserved at full size and every shape visited before /health says ok
    mailbox     the worker's events to the event loop, one wake-up per burst
    metrics     /metrics in the Prometheus text format
    app         the FastAPI app: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics
    server      load a run or bundle, build the app, run uvicorn (SIGTERM drains)

docs/serving.md ("domino-graft serve") says what is batched and what is not.
"""
