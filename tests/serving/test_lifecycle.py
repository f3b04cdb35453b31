"""The server under pressure and at its end: an API key, a full queue (429 + Retry-After), a client
that disconnects mid-stream (its row freed), a bounded load loop in which no request is lost or
duplicated, and SIGTERM draining the requests in flight before exiting 0 (last: it stops the server)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from .harness import Reference, Server, apply_tiny, httpx

KEY = "test-key"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-life")
    run = apply_tiny("dflash", root / "run")
    s = Server(run, "--max-batch", "2", "--max-queue", "2", "--api-key", KEY, "--served-model-name", "m",
               "--drain-timeout", "60", log=root / "serve.log")
    try:
        yield s, Reference(run)
    finally:
        s.stop()  # the SIGTERM test checks the exit code


def _wait_for(predicate, timeout: float = 20, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_api_key_is_required_on_v1_only(server):
    s, _ = server
    with pytest.raises(openai.AuthenticationError) as e:
        s.client(api_key="wrong").models.list()
    assert e.value.status_code == 401
    r = httpx.post(s.base + "/completions", json={"model": "m", "prompt": [5, 6], "max_tokens": 2}, timeout=10)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.post(s.base + "/completions", json={"model": "m", "max_token": 2}, timeout=10)  # a bad body too
    assert r.status_code == 401, r.text
    assert httpx.get(s.url + "/health", timeout=10).status_code == 200
    assert s.client(api_key=KEY).models.list().data[0].id == "m"


def test_full_queue_is_429_with_retry_after(server):
    s, _ = server
    client = s.client(api_key=KEY)
    outcomes = []

    def one(i):
        try:
            r = client.completions.create(model="m", prompt=[5, 6, 7 + i], max_tokens=300, temperature=0)
            outcomes.append(("ok", r.usage.completion_tokens))
        except openai.RateLimitError as e:
            outcomes.append(("429", e.response.headers.get("retry-after"), e.body))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(8)))
    refused = [o for o in outcomes if o[0] == "429"]
    # at least the 2 queued get in (2 more when the worker has taken the first ones into rows)
    assert refused and len(refused) <= 6 and len(outcomes) == 8, outcomes
    assert all(o[1] == "1" and "queue is full" in o[2]["message"] for o in refused)
    assert all(o[1] == 300 for o in outcomes if o[0] == "ok")
    assert httpx.get(s.url + "/health", timeout=10).json()["queued"] == 0


def test_disconnect_mid_stream_frees_the_row(server):
    s, _ = server
    before = s.metric('domino_graft_requests_total{outcome="cancelled"}')
    client = s.client(api_key=KEY)
    stream = client.completions.create(model="m", prompt=[9, 8, 7], max_tokens=2000, temperature=0, stream=True)
    for n, _ in enumerate(stream):
        if n == 3:
            break
    stream.close()
    client.close()
    # the worker retires the row at its next block
    _wait_for(lambda: s.metric('domino_graft_requests_total{outcome="cancelled"}') == before + 1, what="the cancel")
    _wait_for(lambda: s.metric("domino_graft_batch_size") == 0, what="an empty batch")
    r = s.client(api_key=KEY).completions.create(model="m", prompt=[5, 6], max_tokens=3, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length")


def test_a_non_streamed_client_that_gives_up_frees_its_row(server):
    s, _ = server
    before = s.metric('domino_graft_requests_total{outcome="cancelled"}')
    with pytest.raises(openai.APITimeoutError):
        s.client(api_key=KEY, timeout=1.0).completions.create(model="m", prompt=[7, 7, 3], max_tokens=2000,
                                                               temperature=0)
    _wait_for(lambda: s.metric('domino_graft_requests_total{outcome="cancelled"}') == before + 1, what="the cancel")
    _wait_for(lambda: s.metric("domino_graft_batch_size") == 0, what="an empty batch")


def test_load_loop_loses_and_duplicates_nothing(server):
    """40 requests, 8 clients, each retried on 429 (bounded): every request answered once, with
    its own greedy answer; the server counted exactly 40 finished requests."""
    s, ref = server
    client = s.client(api_key=KEY)
    before = s.metric("domino_graft_requests_total")
    prompts = [[2 + (i % 80), 3 + (i * 7) % 80, 4 + (i * 13) % 80][: 1 + i % 3] + [5 + i % 50] for i in range(40)]
    deadline = time.monotonic() + 120

    def one(i):
        while True:
            assert time.monotonic() < deadline, "the load loop ran out of time"
            try:
                r = client.completions.create(model="m", prompt=prompts[i], max_tokens=4 + i % 9, temperature=0)
                return i, r.id, [int(t) for t in r.choices[0].text.split()]
            except openai.RateLimitError as e:
                time.sleep(float(e.response.headers["retry-after"]) / 10)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(40)))
    assert len({rid for _, rid, _ in results}) == 40
    for i, _, ids in results:
        assert ids == ref.greedy(prompts[i], 4 + i % 9), i
    assert s.metric("domino_graft_requests_total") == before + 40


def test_sigterm_drains_the_requests_in_flight_and_exits_0(server):
    s, _ = server
    client = s.client(api_key=KEY)
    started = threading.Barrier(3, timeout=30)
    results = {}

    def stream(i):
        text, reason = [], None
        for n, chunk in enumerate(client.completions.create(model="m", prompt=[11 + i, 12], max_tokens=600,
                                                            temperature=0, stream=True)):
            if n == 0:
                started.wait()
            text.append(chunk.choices[0].text)
            reason = chunk.choices[0].finish_reason or reason
        results[i] = ("".join(text), reason)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    started.wait()  # both streams have their first tokens
    assert s.metric("domino_graft_batch_size") == 2  # both rows decoding when the signal comes
    t0 = time.monotonic()
    rc = s.stop(timeout=60)
    for t in threads:
        t.join(30)
    assert rc == 0, s.log()
    assert time.monotonic() - t0 < 60
    for i in range(2):
        text, reason = results[i]
        assert len(text.split()) == 600 and reason == "length", results[i]
    with pytest.raises(httpx.HTTPError):
        httpx.get(s.url + "/health", timeout=2)
