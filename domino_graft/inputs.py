"""What users hand in (recipe, prompt, data and response files), checked before anything slow.

A leaf module (standard library only, no torch): `validate` imports it. Every failure is a
ValueError whose one line names the file (and line, or byte offset), the bad value, shortened
to a short repr, and what would be valid.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, Optional

MAX_REPR = 80  # characters of a bad value shown in an error line
ROLES = ("system", "user", "assistant")  # chat roles every chat template takes
PROMPT_KEYS = ("prompt", "messages", "prompt_ids")
# Text is measured before it is tokenised: a prompt of more than this many characters per position
# of the target cannot fit (real text averages 3-5 characters per token).
CHARS_PER_POSITION = 16
# A seed: torch.manual_seed's signed 64-bit range, less room for the per-prompt offsets (seed + i)
MIN_SEED, MAX_SEED = -(2**63), 2**63 - 1 - 10**6
MAX_RECORD_CHARS = 1_000_000  # one training / response record's text, before tokenising
# One JSON line is read at most this far: a record holds at most MAX_RECORD_CHARS of text (up to 4
# bytes a character, escaped) plus its ids, and a file with no newline (a 2 GB sparse file, a
# binary) must not be read whole into memory to find its first line.
MAX_LINE_BYTES = 16 * 2**20


def short(value: Any, limit: int = MAX_REPR) -> str:
    """repr(value), cut to about `limit` characters (an alias bomb or a 1 MB prompt stays one line)."""
    try:
        r = repr(value)
    except Exception:  # a value whose repr fails is still named
        r = f"<{type(value).__name__}>"
    if len(r) <= limit:
        return r
    tail = f"... ({len(r):,} chars)"
    return r[: max(8, limit - len(tail))] + tail


def describe(value: Any) -> str:
    """`'5' (a string)`: the value and its JSON type, for "expected X" messages."""
    kinds = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
             dict: "an object", type(None): "null"}
    return f"{short(value)} ({kinds.get(type(value), type(value).__name__)})"


def _not_utf8(path: Path, data: bytes, offset: int, what: str) -> ValueError:
    line = data.count(b"\n", 0, offset) + 1
    return ValueError(f"{what}: {path}: not UTF-8 text: byte 0x{data[offset]:02x} at offset {offset:,} (line {line}); "
                      "valid: a UTF-8 text file (re-save it as UTF-8)")


def decode_utf8(path: Path, data: bytes, what: str) -> str:
    """Bytes of a text file -> str; binary files and bad UTF-8 named with the byte offset."""
    nul = data.find(b"\x00")
    if nul >= 0:
        raise ValueError(f"{what}: {path}: a binary file (NUL byte at offset {nul:,}), not UTF-8 text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        start = e.start + (3 if data.startswith(b"\xef\xbb\xbf") else 0)
        raise _not_utf8(path, data, min(start, len(data) - 1), what) from None


def read_text(path: str | Path, what: str, *, max_bytes: Optional[int] = None) -> str:
    """A whole UTF-8 text file, size-limited before it is read."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if max_bytes is not None and size > max_bytes:
            raise ValueError(f"{what}: {path}: {size:,} bytes; the limit is {max_bytes:,} bytes")
        data = path.read_bytes()
    except OSError as e:
        raise ValueError(f"{what}: {path}: cannot read it ({e.strerror or e})") from None
    return decode_utf8(path, data, what)


def iter_jsonl(path: str | Path, what: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object) for every non-blank line of a JSON-lines file, streamed;
    bad UTF-8 is named with its byte offset, bad JSON with its line and column."""
    path = Path(path)
    try:
        fh = path.open("rb")
    except OSError as e:
        raise ValueError(f"{what}: {path}: cannot read it ({e.strerror or e})") from None
    with fh:
        offset = 0
        for n, raw in enumerate(iter(lambda: fh.readline(MAX_LINE_BYTES + 1), b""), 1):
            start, offset = offset, offset + len(raw)
            if n == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw, start = raw[3:], start + 3
            nul = raw.find(b"\x00")
            if nul >= 0:
                raise ValueError(f"{what}: {path}:{n}: a binary file (NUL byte at offset {start + nul:,}), "
                                 "not JSON lines")
            if len(raw) > MAX_LINE_BYTES:
                raise ValueError(f"{what}: {path}:{n}: a line longer than {MAX_LINE_BYTES:,} bytes; valid: one JSON "
                                 f"object per line, each of at most {MAX_LINE_BYTES:,} bytes")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{what}: {path}:{n}: not UTF-8 text: byte 0x{raw[e.start]:02x} at offset "
                                 f"{start + e.start:,}; valid: a UTF-8 text file (re-save it as UTF-8)") from None
            if not line.strip():
                continue
            try:
                yield n, json.loads(line.rstrip("\r\n"))
            except ValueError as e:
                msg = getattr(e, "msg", None) or str(e)
                col = f" at column {e.colno}" if getattr(e, "colno", None) else ""
                raise ValueError(f"{what}: {path}:{n} is not JSON ({msg}{col}); valid: one JSON object per line") \
                    from None


# -------------------------------------------------------------------------- records
def check_ids(ids: Any, where: str, *, allow_empty: bool = False) -> list[int]:
    """A JSON list of integer token ids (not strings, floats or booleans)."""
    if not isinstance(ids, list):
        raise ValueError(f"{where}: expected a list of integer token ids, got {describe(ids)}")
    if not ids and not allow_empty:
        raise ValueError(f"{where}: [] is empty; valid: a non-empty list of integer token ids")
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int):
            raise ValueError(f"{where}[{i}]: {describe(t)} is not a token id; valid: integers >= 0, e.g. [5, 17, 42]")
        if t < 0:
            raise ValueError(f"{where}[{i}]: {t} is negative; valid: integers >= 0")
    return list(ids)


def check_ids_in_vocab(ids: list[int], vocab_size: int, where: str) -> None:
    for i, t in enumerate(ids):
        if not 0 <= t < vocab_size:
            raise ValueError(f"{where}[{i}]: {t} is outside the target vocabulary; valid: 0..{vocab_size - 1}")


def check_text(text: Any, where: str, *, limit: int = MAX_RECORD_CHARS) -> str:
    if not isinstance(text, str):
        raise ValueError(f"{where}: expected a string, got {describe(text)}")
    if len(text) > limit:
        raise ValueError(f"{where}: {len(text):,} characters; the limit is {limit:,} (before tokenising)")
    return text


def check_messages(messages: Any, where: str, *, limit: int = MAX_RECORD_CHARS) -> list[dict]:
    """A chat: a non-empty list of {"role": system|user|assistant, "content": str}."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: expected a non-empty list of {{\"role\", \"content\"}} objects, got "
                         f"{describe(messages)}")
    total = 0
    for i, m in enumerate(messages):
        at = f"{where}[{i}]"
        if not isinstance(m, dict):
            raise ValueError(f"{at}: expected a {{\"role\", \"content\"}} object, got {describe(m)}")
        for key in ("role", "content"):
            if key not in m:
                raise ValueError(f"{at}: no \"{key}\" (keys: {', '.join(sorted(map(str, m))) or 'none'}); "
                                 "valid: {\"role\": \"user\", \"content\": \"...\"}")
        if m["role"] not in ROLES:
            raise ValueError(f"{at}.role: {short(m['role'])} is not a chat role; valid: {', '.join(ROLES)}")
        check_text(m["content"], f"{at}.content", limit=limit)
        total += len(m["content"])
    if total > limit:
        raise ValueError(f"{where}: {total:,} characters of content; the limit is {limit:,} (before tokenising)")
    return messages


def check_prompt_record(obj: Any, where: str) -> dict:
    """One line of a prompt file: {"prompt": str} | {"messages": [...]} | {"prompt_ids": [int]},
    optionally "raw": bool and "id": str | int. Types only (lengths need the target)."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object with one of \"prompt\", \"messages\", \"prompt_ids\", "
                         f"got {describe(obj)}")
    keys = [k for k in PROMPT_KEYS if k in obj]
    if len(keys) != 1:
        raise ValueError(f"{where}: each line needs exactly one of \"prompt\", \"messages\", \"prompt_ids\" "
                         f"(got {', '.join(map(repr, keys or sorted(obj))) or 'no keys'})")
    key = keys[0]
    if key == "prompt":
        check_text(obj["prompt"], f"{where}: \"prompt\"", limit=1 << 62)
    elif key == "messages":
        check_messages(obj["messages"], f"{where}: messages", limit=1 << 62)
    else:
        check_ids(obj["prompt_ids"], f"{where}: prompt_ids")
    if "raw" in obj and not isinstance(obj["raw"], bool):
        raise ValueError(f"{where}: \"raw\": {describe(obj['raw'])} is invalid; valid: true or false")
    if "id" in obj and (isinstance(obj["id"], bool) or not isinstance(obj["id"], (str, int))):
        raise ValueError(f"{where}: \"id\": {describe(obj['id'])} is invalid; valid: a string or an integer")
    return obj


def check_length(n_prompt: int, max_new_tokens: Optional[int], max_positions: int, where: str) -> None:
    """Prompt tokens (after the chat template) plus the tokens to generate must fit the target."""
    need = n_prompt + (max_new_tokens or 0)
    if need > max_positions:
        extra = f" + {max_new_tokens:,} new tokens (max_new_tokens) = {need:,} positions" if max_new_tokens else ""
        raise ValueError(f"{where}: {n_prompt:,} prompt tokens{extra}; the target has {max_positions:,} positions "
                         f"(max_position_embeddings); shorten the prompt"
                         + (" or lower max_new_tokens" if max_new_tokens else ""))


def check_text_size(text_len: int, max_positions: int, where: str) -> None:
    """Before tokenising: text far longer than the target can read is refused at once."""
    limit = CHARS_PER_POSITION * max_positions
    if text_len > limit:
        raise ValueError(f"{where}: the prompt text is {text_len:,} characters; at most {limit:,} are tokenised "
                         f"({CHARS_PER_POSITION} per position of the target's {max_positions:,}); shorten it")


def render_chat(tok, messages: list, where: str, **kw) -> str:
    """The tokenizer's chat template applied to `messages` (text); a template that refuses them
    (e.g. "System role not supported", roles that must alternate) is a ValueError naming `where`."""
    try:
        return tok.apply_chat_template(messages, tokenize=False, **kw)
    except Exception as e:  # jinja2's TemplateError (raise_exception in the template), and kin
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        roles = ", ".join(str(m.get("role")) for m in messages)
        raise ValueError(f"{where}: messages (roles {roles}): the target's chat template refuses them: {why}") from None
