"""serving/text.py's StreamText (tokenizers' DecodeStream) against decoding the whole answer, on fast tokenizers
built here (no download): a byte-level BPE (GPT-2 / SmolLM2 style) and a SentencePiece-style one (Metaspace,
byte fallback: Llama / Gemma style), each with a special token. Whatever the chunks the tokens arrive in, a
request's deltas add up to the whole decode, every text sent is a prefix of it, and no delta before the last
ends in half a character; a tokenizer that cleans up spaces in Python, or a slow one, gets the window instead."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from domino_graft.sampling import Sampling
from domino_graft.serving.scheduler import Job
from domino_graft.serving.text import StreamText, WindowText, streams, text_so_far

CORPUS = ["héllo wörld, ünïcode ✓ ok", "naïve café — déjà vu", "数学题：3 + 4 = 7。", "emoji 🙂🚀 end",
          "The answer is 42.\n\n  Indented code:\n    x = y ** 2", "Ünïcödé ünd ßtraße", "¿Qué? ¡Sí!"] * 5


def _byte_level() -> PreTrainedTokenizerFast:
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>", clean_up_tokenization_spaces=False)


def _sentencepiece_like() -> PreTrainedTokenizerFast:
    tk = Tokenizer(models.BPE(byte_fallback=True, unk_token=None))
    tk.normalizer = normalizers.Replace(" ", "▁")
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=False)
    tk.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tk.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<eos>"] + [f"<0x{b:02X}>" for b in range(256)]))
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>", clean_up_tokenization_spaces=False)


@pytest.fixture(scope="module", params=["byte_level", "sentencepiece_like"])
def tokenizer(request):
    return _byte_level() if request.param == "byte_level" else _sentencepiece_like()


def _sequences(tok, rng: random.Random) -> list[list[int]]:
    """Encoded texts (a special token inside some), and random ids: byte pieces that split characters, or form
    no valid UTF-8 at all."""
    eos = tok.convert_tokens_to_ids("<eos>")
    out = [tok(text)["input_ids"] for text in CORPUS[:7]]
    out.append(tok(CORPUS[0])["input_ids"] + [eos] + tok(CORPUS[2])["input_ids"])
    out += [[rng.randrange(len(tok)) for _ in range(rng.randint(1, 40))] for _ in range(30)]
    return out


def test_stream_text_adds_up_to_the_whole_decode(tokenizer):
    assert streams(tokenizer)
    rng = random.Random(0)
    for ids in _sequences(tokenizer, rng):
        whole = tokenizer.decode(ids, skip_special_tokens=True)
        sent = []
        job = Job([1], max_tokens=len(ids), sampling=Sampling(), stop=[], stop_ids=frozenset(),
                  send=sent.append, text=StreamText(tokenizer))
        at = 0
        while at < len(ids):
            n = rng.randint(1, 4)
            job.push(ids[at: at + n])
            at += n
            so_far = "".join(ev[1] for ev in sent if ev[0] == "delta")
            assert whole.startswith(so_far), (ids, so_far, whole)
            if at < len(ids) and so_far:
                assert not so_far.endswith("\ufffd") or whole[: len(so_far)].endswith("\ufffd"), (ids, so_far)
        assert "".join(ev[1] for ev in sent if ev[0] == "delta") == whole, ids
        assert sent[-1] == ("done", "length")


def test_the_window_is_kept_where_the_stream_would_not_give_the_same_text(tokenizer):
    class Target:
        def __init__(self, tok):
            self.tokenizer = tok

    assert isinstance(text_so_far(Target(tokenizer)), StreamText)
    cleaning = PreTrainedTokenizerFast(tokenizer_object=tokenizer._tokenizer, clean_up_tokenization_spaces=True)
    assert not streams(cleaning) and isinstance(text_so_far(Target(cleaning)), WindowText)
    assert isinstance(text_so_far(Target(None)), WindowText)  # a tokenizer-less target: ids as text
