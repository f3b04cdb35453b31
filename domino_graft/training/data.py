"""Training data: token sequences with a loss mask, a stateless sampler, and collation.

Sources (train.data):
* `path`: jsonl / json / parquet, or a folder written by `datasets.save_to_disk`. Records are
  `{"messages": [{"role", "content"}, ...]}`, `{"prompt", "response"}`,
  `{"prompt_ids", "response_ids"}` (token ids, for targets without a tokenizer; what
  `regenerate` writes for them) or `{"text"}`. Conversations go through the target's chat
  template and only assistant tokens are trained.
* `synthetic`: small learnable tasks built from the seed (tests, smoke runs); see
  `synthetic_examples`.

The sampler is a pure function of (seed, position in the sample stream): a resumed or
re-sharded run sees exactly the same sequences and anchors, so no data-loader state needs
checkpointing beyond the step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from .objective import sample_anchors

RECORD_FORMATS = "messages | prompt+response | prompt_ids+response_ids | text"


@dataclass
class Example:
    input_ids: list[int]
    loss_mask: list[int]  # 1 where the token is a training label (assistant / response)


# ------------------------------------------------------------------------------ synthetic
# Tokens of a "run": counting through a small alphabet, with random restarts. Inside a block
# the next token follows from the previous one (which the Domino head reads, teacher-forced)
# except after a restart, which a parallel slot cannot see: the base must guess x_a+j from the
# anchor alone and loses accuracy at every restart, the head only at the restart itself.
SYNTH_ALPHABET = 16
SYNTH_RESTART = 0.15


def _specials(vocab_size: int, eos_id: int, reserved: set[int]):
    free = [i for i in range(vocab_size) if i not in reserved | {0, eos_id}]
    if len(free) < SYNTH_ALPHABET + 1:
        raise ValueError(
            f"train.data.synthetic needs a vocabulary of at least {SYNTH_ALPHABET + 3} usable ids; "
            f"the target has {vocab_size}"
        )
    return free[0], free[1 : 1 + SYNTH_ALPHABET]  # sep, alphabet


def _run(n: int, step: int, alphabet: list[int], g: torch.Generator) -> list[int]:
    a = len(alphabet)
    idx = int(torch.randint(a, (1,), generator=g))
    out = []
    for _ in range(n):
        out.append(alphabet[idx])
        if float(torch.rand((), generator=g)) < SYNTH_RESTART:
            idx = int(torch.randint(a, (1,), generator=g))
        else:
            idx = (idx + step) % a
    return out


def synthetic_examples(kind: str, *, num_samples: int, max_length: int, vocab_size: int, eos_id: int,
                       reserved: set[int], seed: int) -> list[Example]:
    """copy:  [BOS] run [SEP] run [EOS]; the response repeats the prompt's run (a drafter can
              copy it from context; the head predicts it from the previous token).
    arith: [BOS] d [SEP] run_d [EOS]; a run counting in steps of d (given in the prompt).
    Loss on the response (after SEP) including EOS."""
    sep, alphabet = _specials(vocab_size, eos_id, reserved)
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(num_samples):
        if kind == "copy":
            n = (max_length - 3) // 2
            run = _run(n, 1, alphabet, g)
            prompt = [0, *run, sep]
            response = [*run, eos_id]
        elif kind == "arith":
            d = 1 + int(torch.randint(len(alphabet) - 1, (1,), generator=g))
            prompt = [0, alphabet[d], sep]
            response = [*_run(max_length - 4, d, alphabet, g), eos_id]
        else:
            raise ValueError(f"train.data.synthetic: {kind!r} is not a synthetic task; valid: copy, arith")
        out.append(Example(prompt + response, [0] * len(prompt) + [1] * len(response)))
    return out


# ------------------------------------------------------------------------------ files
def read_records(path: str) -> list[dict]:
    """Rows of a jsonl / json / parquet file or a saved `datasets` folder."""
    return [rec for _, rec in read_located_records(path)]


def read_located_records(path: str, what: str = "train.data.path") -> list[tuple[str, dict]]:
    """(where, row) for every row: `file:line` for JSON lines, `file row i` otherwise."""
    p = Path(path)
    if p.is_file() and p.suffix == ".jsonl":
        # plain JSON lines need no `datasets` (absent on some GPU images), and a bad line
        # (not UTF-8, not JSON) is reported with its number
        from ..inputs import iter_jsonl

        return [(f"{path}:{n}", rec) for n, rec in iter_jsonl(p, what)]
    if not p.exists():
        raise FileNotFoundError(f"{what}: {path!r} does not exist")
    kind = "folder written by datasets.save_to_disk" if p.is_dir() else p.suffix
    if not (p.is_dir() or (p.is_file() and p.suffix in (".json", ".parquet"))):
        raise ValueError(
            f"{what}: {path!r} is not a supported dataset; valid: .jsonl, .json, .parquet, "
            "or a folder written by datasets.save_to_disk"
        )
    import datasets

    try:
        if p.is_dir():
            ds = datasets.load_from_disk(str(p))
            if isinstance(ds, datasets.DatasetDict):
                split = "train" if "train" in ds else next(iter(ds))
                ds = ds[split]
        else:
            ds = datasets.load_dataset("json" if p.suffix == ".json" else "parquet", data_files=str(p), split="train")
    except Exception as e:  # datasets / pyarrow raise many kinds for a file they cannot read
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ValueError(f"{what}: {path} cannot be read as a {kind} dataset ({type(e).__name__}: {why})") from None
    return [(f"{path} row {i}", rec) for i, rec in enumerate(ds)]


def _assistant_spans(tokenizer, messages: list[dict], where: str = "train.data") -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans of assistant turns: for turn i,
    render(messages[:i], generation prompt) is a prefix of render(messages[:i+1]); the
    difference is what the target itself would have written (content + end-of-turn)."""
    from ..inputs import render_chat

    full = render_chat(tokenizer, messages, where)
    spans = []
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        before = render_chat(tokenizer, messages[:i], where, add_generation_prompt=True) if i else ""
        upto = render_chat(tokenizer, messages[: i + 1], where)
        if not (upto.startswith(before) and full.startswith(upto)):
            raise ValueError(
                f"{where}: the chat template re-renders earlier turns (e.g. strips reasoning), so the "
                "assistant tokens cannot be located; give single-turn records or prompt/response pairs"
            )
        spans.append((len(before), len(upto)))
    return full, spans


def encode_conversation(tokenizer, messages: list[dict], where: str = "train.data") -> Example:
    full, spans = _assistant_spans(tokenizer, messages, where)
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    mask = [int(any(s <= start < e for s, e in spans)) for start, _ in enc["offset_mapping"]]
    return Example(ids, mask)


def check_record(rec, where: str) -> str:
    """The record's format (RECORD_FORMATS), its fields' types checked: -> messages | pair | ids | text."""
    from ..inputs import check_ids, check_messages, check_text, describe

    if not isinstance(rec, dict):
        raise ValueError(f"{where}: expected a JSON object ({RECORD_FORMATS}), got {describe(rec)}")
    if "prompt_ids" in rec or "response_ids" in rec:
        for key in ("prompt_ids", "response_ids"):
            if key not in rec:
                raise ValueError(f"{where}: has {'response_ids' if key == 'prompt_ids' else 'prompt_ids'} but no "
                                 f"{key}; valid: both, lists of integer token ids")
        check_ids(rec["prompt_ids"], f"{where}: prompt_ids", allow_empty=True)
        check_ids(rec["response_ids"], f"{where}: response_ids", allow_empty=True)
        return "ids"
    if "messages" in rec:
        check_messages(rec["messages"], f"{where}: messages")
        return "messages"
    if "prompt" in rec or "response" in rec:
        for key in ("prompt", "response"):
            if key not in rec:
                raise ValueError(f"{where}: has {'response' if key == 'prompt' else 'prompt'} but no {key}; "
                                 f"valid: {RECORD_FORMATS}")
            check_text(rec[key], f"{where}: {key}")
        return "pair"
    if "text" in rec:
        check_text(rec["text"], f"{where}: text")
        return "text"
    raise ValueError(f"{where}: record has keys {', '.join(map(repr, sorted(map(str, rec)))) or 'none'}; "
                     f"valid record formats: {RECORD_FORMATS}")


def encode_record(rec: dict, tokenizer, *, chat: bool, eos_id: Optional[int], where: str,
                  no_tokenizer: str = "the target has no tokenizer (random target?)") -> Example:
    kind = check_record(rec, where)
    if kind == "ids":
        p, r = list(rec["prompt_ids"]), list(rec["response_ids"])
        return Example(p + r, [0] * len(p) + [1] * len(r))
    if tokenizer is None:
        raise ValueError(f"{where}: {no_tokenizer}, so text records cannot be encoded; give prompt_ids + response_ids")
    if kind in ("messages", "pair"):
        messages = rec.get("messages") or [
            {"role": "user", "content": rec["prompt"]},
            {"role": "assistant", "content": rec["response"]},
        ]
        if chat and getattr(tokenizer, "chat_template", None):
            return encode_conversation(tokenizer, messages, where)
        # No template: plain prompt then response; the response (and EOS) is trained.
        ids, mask = [], []
        for m in messages:
            t = tokenizer(m["content"], add_special_tokens=not ids)["input_ids"]
            ids += t
            mask += [int(m["role"] == "assistant")] * len(t)
        if eos_id is not None:
            ids.append(eos_id)
            mask.append(1)
        return Example(ids, mask)
    ids = tokenizer(rec["text"])["input_ids"]
    return Example(list(ids), [1] * len(ids))


def no_tokenizer_reason(recipe) -> str:
    """Why the recipe's target cannot encode text, in words."""
    t = recipe.target
    if t.random is not None:
        return "the target is a random model (built from a seed) and has no tokenizer"
    return f"the target ({t.path or t.asset}) has no tokenizer files"


def load_examples(recipe, tokenizer, *, vocab_size: int, eos_id: int, reserved: set[int]) -> list[Example]:
    d = recipe.train.data
    if d.synthetic is not None:
        return synthetic_examples(
            d.synthetic, num_samples=d.num_samples or 256, max_length=d.max_length, vocab_size=vocab_size,
            eos_id=eos_id, reserved=reserved, seed=recipe.train.seed,
        )
    if d.path is None:
        raise ValueError("train.data: no training data; set train.data.path (jsonl / parquet / datasets folder) "
                         "or train.data.synthetic (copy | arith)")
    records = read_located_records(d.path)
    if d.num_samples is not None:
        records = records[: d.num_samples]
    out = []
    reason = no_tokenizer_reason(recipe)
    for where, rec in records:
        ex = encode_record(rec, tokenizer, chat=recipe.target.chat, eos_id=eos_id, where=where, no_tokenizer=reason)
        ex = Example(ex.input_ids[: d.max_length], ex.loss_mask[: d.max_length])
        bad = [t for t in ex.input_ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"{where}: token id {bad[0]} is outside the target vocabulary; valid: 0..{vocab_size - 1}")
        held = sorted(set(ex.input_ids) & set(reserved))
        if held:
            raise ValueError(f"{where}: holds token id {held[0]}, the drafter's reserved placeholder (mask / draft "
                             "token), which it must never see as data; valid: records without it")
        if sum(ex.loss_mask[2:]) > 0:  # something to anchor on
            out.append(ex)
    if not out:
        raise ValueError(f"train.data.path: {d.path!r} has no record with trainable (assistant/response) tokens")
    return out


def fingerprint(examples: list[Example]) -> str:
    import hashlib

    h = hashlib.sha256()
    for ex in examples:
        h.update(json.dumps([ex.input_ids, ex.loss_mask]).encode())
    return h.hexdigest()[:16]


# ------------------------------------------------------------------------------ sampling
class StreamSampler:
    """Position p of the infinite sample stream -> dataset index: epoch e = p // n walks a
    permutation seeded by (seed, e). Stateless, so resume and re-sharding are exact."""

    def __init__(self, num_examples: int, seed: int):
        self.n = num_examples
        self.seed = seed
        self._perms: dict[int, list[int]] = {}

    def index(self, position: int) -> int:
        epoch, i = divmod(position, self.n)
        if epoch not in self._perms:
            if len(self._perms) > 4:
                self._perms.clear()
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perms[epoch] = torch.randperm(self.n, generator=g).tolist()
        return self._perms[epoch][i]


def anchor_generator(seed: int, position: int) -> torch.Generator:
    # Keyed by the sample's stream position, not by a running RNG: the anchors of a sequence
    # are the same whichever rank or micro-step draws it.
    return torch.Generator().manual_seed((seed * 2_654_435_761 + position * 40_503 + 17) % (2**63 - 1))


def collate(examples: list[Example], positions: list[int], *, anchors_per_seq: int, seed: int,
            pad_id: int = 0) -> dict:
    """Right-padded batch. Padding only follows real tokens, so under causal attention (target)
    and anchor-limited context (drafter) it never influences a trained position."""
    length = max(len(ex.input_ids) for ex in examples)
    b = len(examples)
    ids = torch.full((b, length), pad_id, dtype=torch.long)
    mask = torch.zeros((b, length), dtype=torch.long)
    anchors = torch.empty((b, anchors_per_seq), dtype=torch.long)
    valid = torch.empty((b, anchors_per_seq), dtype=torch.bool)
    lengths = []
    for r, (ex, pos) in enumerate(zip(examples, positions)):
        n = len(ex.input_ids)
        ids[r, :n] = torch.tensor(ex.input_ids)
        mask[r, :n] = torch.tensor(ex.loss_mask)
        anchors[r], valid[r] = sample_anchors(mask[r], n, anchors_per_seq, anchor_generator(seed, pos))
        lengths.append(n)
    return {"input_ids": ids, "loss_mask": mask, "anchors": anchors, "valid": valid, "lengths": lengths}
