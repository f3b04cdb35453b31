"""Every tiny family behind `serve`, driven by the openai client: completions streamed and not,
16 requests 8 at a time with mixed prompt lengths, budgets and temperatures; every greedy answer
equals the target alone's greedy decode of its prompt, whatever else shared its batch."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from .harness import FAMILIES, Reference, Server, apply_tiny


@pytest.fixture(scope="module", params=FAMILIES)
def family_server(request, tmp_path_factory):
    family = request.param
    root = tmp_path_factory.mktemp(f"serve-{family}")
    run = apply_tiny(family, root / family)
    server = Server(run, "--max-batch", "8", log=root / "serve.log")
    try:
        yield family, server, Reference(run)
    finally:
        rc = server.stop()
        assert rc == 0, f"serve exited with {rc}:\n{server.log()}"


def _requests(n: int, seed: int) -> list[dict]:
    """Mixed prompts (ids 2..90: no eos, no placeholder), budgets, temperatures, stream or not."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [rng.randrange(2, 90) for _ in range(rng.randrange(2, 24))]
        temperature = 0.0 if i % 4 != 3 else rng.choice([0.7, 1.0])
        out.append({"prompt": prompt, "max_tokens": rng.randrange(3, 28), "temperature": temperature,
                    "stream": i % 2 == 1})
    return out


def _complete(client, model: str, req: dict) -> tuple[str, str, int]:
    """-> (text, finish_reason, completion tokens (usage, or the streamed ids))."""
    kw = dict(model=model, prompt=req["prompt"], max_tokens=req["max_tokens"], temperature=req["temperature"])
    if not req["stream"]:
        r = client.completions.create(**kw)
        return r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens
    text, reason = [], None
    for chunk in client.completions.create(stream=True, **kw):
        text.append(chunk.choices[0].text)
        reason = chunk.choices[0].finish_reason or reason
    joined = "".join(text)
    return joined, reason, len(joined.split())


def test_greedy_equals_target_alone_under_concurrency(family_server):
    family, server, ref = family_server
    client = server.client()
    model = client.models.list().data[0].id
    reqs = _requests(16, seed=hash(family) % 1000)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda r: _complete(client, model, r), reqs))
    for req, (text, reason, n) in zip(reqs, results):
        ids = [int(t) for t in text.split()]  # a tokenizer-less target's text is its ids
        assert n == len(ids) and 1 <= len(ids) <= req["max_tokens"]
        assert reason in ("stop", "length")
        assert (reason == "length") == (len(ids) == req["max_tokens"] and ids[-1] != 1)
        if req["temperature"] == 0:
            assert ids == ref.greedy(req["prompt"], req["max_tokens"]), (family, req)
    assert server.metric("domino_graft_requests_total") == len(reqs)
    assert server.metric("domino_graft_generation_tokens_total") >= len(reqs)
    assert server.metric("domino_graft_verify_steps_total") > 0
