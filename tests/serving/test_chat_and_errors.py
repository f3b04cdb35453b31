"""A target with a tokenizer and a chat template: text completions and chat, streamed and not,
equal to the target alone; stop strings; then every bad request of the table gets its status and
an OpenAI error naming the field, and the server goes on answering."""

from __future__ import annotations

import json

import pytest

from .harness import httpx

MESSAGES = [
    [{"role": "user", "content": "w1 w2 w3"}],
    [{"role": "system", "content": "w7"}, {"role": "user", "content": "w4 w5 w6 w7 w8 w9"}],
    [{"role": "user", "content": "w10"}, {"role": "assistant", "content": "w11 w12"}, {"role": "user", "content": "w13"}],
]


def _reference_text(ref, *, prompt=None, messages=None, max_tokens: int) -> str:
    from domino_graft.decoding import decode_text, encode_prompt

    target = ref.loaded.target
    ids = encode_prompt(target, prompt=prompt, messages=messages, raw=prompt is not None)
    return decode_text(target, ref.greedy(ids, max_tokens))


@pytest.mark.parametrize("stream", [False, True])
def test_chat_uses_the_template_and_equals_the_target_alone(chat_server, stream):
    server, ref = chat_server
    client = server.client()
    for messages in MESSAGES:
        want = _reference_text(ref, messages=messages, max_tokens=20)
        if stream:
            chunks = list(client.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=20,
                                                         temperature=0, stream=True))
            assert chunks[0].choices[0].delta.role == "assistant"
            got = "".join(c.choices[0].delta.content or "" for c in chunks)
            assert chunks[-1].choices[0].finish_reason in ("stop", "length")
        else:
            r = client.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=20, temperature=0)
            got = r.choices[0].message.content
            assert r.choices[0].message.role == "assistant" and r.object == "chat.completion"
        assert got == want


@pytest.mark.parametrize("stream", [False, True])
def test_text_completion_without_template_equals_the_target_alone(chat_server, stream):
    server, ref = chat_server
    client = server.client()
    prompt = "w3 w1 w4 w1 w5 w9 w2 w6"
    want = _reference_text(ref, prompt=prompt, max_tokens=24)
    if stream:
        got = "".join(c.choices[0].text for c in client.completions.create(
            model="tiny-chat", prompt=prompt, max_tokens=24, temperature=0, stream=True))
    else:
        got = client.completions.create(model="tiny-chat", prompt=prompt, max_tokens=24, temperature=0).choices[0].text
    assert got == want


def test_stop_string_cuts_the_text_before_it(chat_server):
    server, ref = chat_server
    client = server.client()
    prompt = "w3 w1 w4 w1 w5 w9 w2 w6"
    full = _reference_text(ref, prompt=prompt, max_tokens=24)
    words = full.split()
    assert len(words) >= 3, f"the tiny target's answer is too short for this test: {full!r}"
    stop = " " + words[1]  # its first occurrence is after the first word (random tiny targets repeat one)
    want = full[: full.find(stop)]
    for stream in (False, True):
        if stream:
            chunks = list(client.completions.create(model="tiny-chat", prompt=prompt, max_tokens=24, temperature=0,
                                                    stop=[stop], stream=True))
            got, reason = "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason
        else:
            r = client.completions.create(model="tiny-chat", prompt=prompt, max_tokens=24, temperature=0, stop=stop)
            got, reason = r.choices[0].text, r.choices[0].finish_reason
        assert (got, reason) == (want, "stop")


# ------------------------------------------------------------------- the bad requests
GOOD = {"model": "tiny-chat", "prompt": "w1 w2", "max_tokens": 2, "temperature": 0}
CHAT = {"model": "tiny-chat", "messages": [{"role": "user", "content": "w1"}], "max_tokens": 2}

# (id, path, body (a dict, or raw bytes), status, param, fragments of the message)
BAD = [
    ("malformed-json", "/v1/completions", b'{"model": "tiny-chat", "prompt": ', 400, "body", ["malformed JSON"]),
    ("not-an-object", "/v1/completions", b"[1, 2]", 400, "body", ["valid: a JSON object"]),
    ("unknown-field", "/v1/completions", {**GOOD, "max_token": 5}, 400, "max_token",
     ["unknown field", "valid fields:", "max_tokens"]),
    ("unknown-field-in-message", "/v1/chat/completions",
     {**CHAT, "messages": [{"role": "user", "content": "w1", "mood": "x"}]}, 400, "messages.0.mood",
     ["unknown field", "valid fields: content, name, role"]),
    ("missing-model", "/v1/completions", {"prompt": "w1"}, 400, "model", ["required"]),
    ("temperature-string", "/v1/completions", {**GOOD, "temperature": "hot"}, 400, "temperature", ["hot"]),
    ("max-tokens-float", "/v1/completions", {**GOOD, "max_tokens": 2.5}, 400, "max_tokens", ["integer"]),
    ("max-tokens-zero", "/v1/completions", {**GOOD, "max_tokens": 0}, 400, "max_tokens", ["0 is invalid", ">= 1"]),
    ("max-tokens-negative", "/v1/completions", {**GOOD, "max_tokens": -3}, 400, "max_tokens", [">= 1"]),
    ("max-tokens-beyond-cache", "/v1/completions", {**GOOD, "max_tokens": 5000}, 400, "max_tokens",
     ["beyond the positions left", "valid: 1..2,04"]),
    ("prompt-too-long", "/v1/completions", {**GOOD, "prompt": list(range(5, 60)) * 40}, 400, "prompt",
     ["2,200 prompt tokens", "2,048 positions"]),
    ("temperature-too-high", "/v1/completions", {**GOOD, "temperature": 2.5}, 400, "temperature",
     ["0 <= temperature <= 2"]),
    ("temperature-negative", "/v1/completions", {**GOOD, "temperature": -1}, 400, "temperature", ["0 <= temperature"]),
    ("top-p-zero", "/v1/completions", {**GOOD, "top_p": 0}, 400, "top_p", ["0 < top_p <= 1"]),
    ("top-p-above-one", "/v1/completions", {**GOOD, "top_p": 1.5}, 400, "top_p", ["0 < top_p <= 1"]),
    ("top-k-negative", "/v1/completions", {**GOOD, "top_k": -2}, 400, "top_k", [">= 0"]),
    ("n-two", "/v1/completions", {**GOOD, "n": 2}, 400, "n", ["valid: 1"]),
    ("unknown-model", "/v1/completions", {**GOOD, "model": "gpt-4"}, 400, "model", ["'gpt-4'", "'tiny-chat'"]),
    ("empty-prompt", "/v1/completions", {**GOOD, "prompt": ""}, 400, "prompt", ["empty"]),
    ("prompt-id-outside-vocab", "/v1/completions", {**GOOD, "prompt": [5, 500]}, 400, "prompt", ["0..96"]),
    ("empty-messages", "/v1/chat/completions", {**CHAT, "messages": []}, 400, "messages", ["empty"]),
    ("bad-role", "/v1/chat/completions", {**CHAT, "messages": [{"role": "robot", "content": "w1"}]}, 400,
     "messages.0.role", ["'system'", "'user'", "'assistant'"]),
    ("content-not-text", "/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": 5}]}, 400,
     "messages.0.content", ["string"]),
    ("max-completion-tokens-zero", "/v1/chat/completions", {**CHAT, "max_tokens": None, "max_completion_tokens": 0},
     400, "max_completion_tokens", ["0 is invalid", ">= 1"]),
    ("two-budgets-disagree", "/v1/chat/completions", {**CHAT, "max_completion_tokens": 3}, 400, "body",
     ["max_tokens 2 and max_completion_tokens 3 disagree"]),
    ("oversize-body", "/v1/completions", {**GOOD, "prompt": "w1 " * 10000}, 413, "body", ["at most 20,000 bytes"]),
    ("no-such-endpoint", "/v1/embeddings", GOOD, 404, None, ["no such endpoint"]),
]


@pytest.mark.parametrize("path,body,status,param,fragments", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_request_is_refused_by_name_and_the_server_goes_on(chat_server, path, body, status, param, fragments):
    server, _ = chat_server
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(server.url + path, content=content, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param, err
    for fragment in fragments:
        assert fragment in err["message"], err
    assert len(err["message"]) < 600
    ok = httpx.post(server.url + "/v1/completions", json=GOOD, timeout=30)
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] in ("stop", "length")
