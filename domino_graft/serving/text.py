"""A request's text as its tokens arrive (serving/scheduler.py `Job.push`): the whole answer's text so far, on the
worker's critical path once per row per step.

Two ways, the same text:

- `StreamText`, where the target's tokenizer is a fast (Rust) one whose decode adds nothing in Python (no
  `clean_up_tokenization_spaces`): tokenizers' `DecodeStream`, one Rust step per new token, which holds back an
  incomplete UTF-8 character until its last byte. The whole answer is decoded once, at its end, so the text
  finishes exactly as a decode of every token does (an incomplete last character shows as U+FFFD there).
  On this 2-core CPU with SmolLM2's tokenizer a whole `Job.push` of 1 / 2 / 4 tokens took 2.7 / 5.2 / 6.2 µs
  against the window's 7.0 / 10.7 / 8.9 (bench/results/detokenize_cpu.json; a noisy machine: 2.6-5.5 µs saved a
  push): at 64 rows, 0.17-0.35 ms a step less of host work.
- `WindowText` otherwise (a slow tokenizer, one that cleans up spaces, a tokenizer-less target): each push decodes
  the tokens since the last complete character plus the few before them (the context a tokenizer needs for the
  spaces it puts between tokens; vLLM's prefix and read offsets), two decodes a push, never the whole answer, which
  over a long answer would be quadratic work. An incomplete character (U+FFFD at the end) waits for its next token.
"""

from __future__ import annotations

from typing import Callable, Protocol


class TextSoFar(Protocol):
    def text(self, tokens: list[int], final: bool) -> str:
        """The text of `tokens` (the whole answer so far, grown since the last call); `final`: its last push."""


class WindowText:
    def __init__(self, detokenize: Callable[[list[int]], str]):
        self.detokenize = detokenize
        self.decoded = ""  # complete characters only
        self._prefix_at = self._read_at = 0

    def text(self, tokens: list[int], final: bool) -> str:
        prefix = self.detokenize(tokens[self._prefix_at: self._read_at])
        new = self.detokenize(tokens[self._prefix_at:])
        if len(new) > len(prefix) and (final or not new.endswith("\ufffd")):
            self.decoded += new[len(prefix):]
            self._prefix_at, self._read_at = self._read_at, len(tokens)
        return self.decoded


class StreamText:
    def __init__(self, tokenizer):
        from tokenizers.decoders import DecodeStream

        self.tokenizer, self.rust = tokenizer, tokenizer._tokenizer
        self.stream = DecodeStream(skip_special_tokens=True)
        self.decoded = ""
        self._seen = 0

    def text(self, tokens: list[int], final: bool) -> str:
        step, rust = self.stream.step, self.rust
        for t in tokens[self._seen:]:
            chunk = step(rust, t)
            if chunk:
                self.decoded += chunk
        self._seen = len(tokens)
        if final:  # the whole decode, unless it would take back text already sent (it never has: tests)
            whole = self.tokenizer.decode(tokens, skip_special_tokens=True)
            if whole.startswith(self.decoded):
                self.decoded = whole
        return self.decoded


def streams(tokenizer) -> bool:
    """Whether `StreamText` gives this tokenizer's decode: a fast tokenizer that adds no clean-up of its own."""
    try:
        from tokenizers import Tokenizer
        from tokenizers.decoders import DecodeStream  # noqa: F401  (tokenizers >= 0.21)
    except ImportError:
        return False
    return (isinstance(getattr(tokenizer, "_tokenizer", None), Tokenizer)
            and not getattr(tokenizer, "clean_up_tokenization_spaces", False))


def text_so_far(target) -> TextSoFar:
    """A fresh request's text tracker for this target (module docstring)."""
    tokenizer = target.tokenizer
    if tokenizer is not None and streams(tokenizer):
        return StreamText(tokenizer)
    from ..decoding import decode_text

    return WindowText(lambda ids: decode_text(target, ids))
