"""A job's text, without a model: incremental detokenisation equals decoding the whole answer,
an incomplete UTF-8 character waits for its next byte, and a stop string cuts the text before it
without any of it ever being sent (a tail that may begin one is held back)."""

from __future__ import annotations

import pytest

from domino_graft.sampling import Sampling
from domino_graft.serving.scheduler import Job

EOS = 0


def _bytes_decode(ids: list[int]) -> str:
    """A byte-level detokeniser: id = byte value (0 = eos, skipped)."""
    return bytes(i for i in ids if i != EOS).decode("utf-8", errors="replace")


def _job(stop=(), max_tokens=100):
    sent = []
    job = Job([5], max_tokens=max_tokens, sampling=Sampling(), stop=list(stop), stop_ids=frozenset({EOS}),
              detokenize=_bytes_decode, send=sent.append)
    return job, sent


def _deltas(sent) -> str:
    return "".join(ev[1] for ev in sent if ev[0] == "delta")


@pytest.mark.parametrize("chunk", [1, 2, 3, 7])
def test_deltas_add_up_to_the_whole_text(chunk):
    text = "héllo wörld, ünïcode ✓ ok"
    ids = list(text.encode()) + [EOS]
    job, sent = _job()
    for i in range(0, len(ids), chunk):
        job.push(ids[i: i + chunk])
        assert not _deltas(sent).endswith("\ufffd")  # a half character is never sent
    assert _deltas(sent) == text
    assert sent[-1] == ("done", "stop") and job.finish_reason == "stop"


@pytest.mark.parametrize("chunk", [1, 4])
def test_a_stop_string_is_never_sent(chunk):
    text = "abc wö xyz"
    ids = list(text.encode())
    job, sent = _job(stop=["wö x"])
    for i in range(0, len(ids), chunk):
        if job.push(ids[i: i + chunk]):
            break
        assert "w" not in _deltas(sent)  # "w" may begin the stop string: held back
    assert _deltas(sent) == "abc " and job.finish_reason == "stop" and job.stopped_by_string


def test_max_tokens_ends_with_length():
    job, sent = _job(max_tokens=3)
    assert not job.push([ord("a"), ord("b")])
    assert job.push([ord("c"), ord("d")])
    assert _deltas(sent) == "abc" and job.finish_reason == "length"
