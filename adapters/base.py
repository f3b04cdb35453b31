"""The adapter contract: what a drafter family must provide for the Domino head.

The head itself knows nothing of families. An adapter exposes three hook points —
per-slot hidden states, base logits, and the embedding the GRU reads — plus the
bookkeeping decoding and training need. Family facts (tensor names, layer-id
conventions, slot/label conventions) live in the adapter module, in one place.

Decoding protocol (batch size B, one chain per row):

    adapter.reset(B)
    adapter.observe(features, positions)     # context the target has verified
    block = adapter.propose(anchor_ids, pos)  # exactly one backbone forward
    ... head rollout over block.hidden / block.base_logits, verification ...
    adapter.observe(features_of_accepted, positions_of_accepted)

Context only ever holds verified tokens, so nothing needs cropping on rejection.

Ragged batches (`ragged_batch = True`; decoding/batched.py): rows at different positions.
`observe` then gets positions [B, n] per row, where a negative position marks padding (no
token: never attended to, never read), and `propose` gets the anchors' positions as a [B]
tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import nn


def forget_rows(context: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """A ragged batch's per-row context [B, n] with `rows` dropped: positions become padding (-1: never
    attended, never read), a validity mask False. What an adapter's `observe_prompts` does to the
    context of rows whose requests ended."""
    if context.dim() != 2 or not rows:
        return context
    out = context.clone()
    out[torch.as_tensor(rows, device=context.device)] = False if context.dtype == torch.bool else -1
    return out


def checkpoint_conflicts(d, checkpoint: dict) -> list[str]:
    """One line per recipe field the user set (`d.model_fields_set`, not None = "the default")
    whose value contradicts the checkpoint's: `checkpoint` maps field name -> the checkpoint's
    value. A checkpoint's values are never silently overridden."""
    return [f"drafter.{name}: {getattr(d, name)!r} conflicts with the checkpoint's {theirs!r} "
            "(remove it from the recipe to use the checkpoint's)"
            for name, theirs in checkpoint.items()
            if name in d.model_fields_set and getattr(d, name) is not None and getattr(d, name) != theirs]


def read_config_json(path: str, field: str, hint: str = "") -> dict:
    """config.json of a checkpoint folder (or the file itself), with errors naming the recipe field."""
    import json
    from pathlib import Path

    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise FileNotFoundError(f"{field}: no config.json at {str(p)!r}{hint}")
    try:
        return json.loads(p.read_text())
    except ValueError as e:
        raise ValueError(f"{field}: {str(p)!r} is not valid JSON ({e})") from None


@dataclass
class DraftBlock:
    """The output of one backbone forward: K proposal slots.

    Slot j (1-based) predicts x_j, x_0 being the anchor. hidden[:, j-1] is H_j.
    """

    hidden: torch.Tensor  # [B, K, Dh]
    base_logits: torch.Tensor  # [B, K, V]


def placeholder_token_problems(field: str, token: int, vocab: int, eos_ids, vocab_name: str = "target") -> list[str]:
    """The refusals for a drafter's placeholder token (DFlash's / P-EAGLE's mask, PARD's pard
    token): it must be a row of the vocabulary and not the target's eos (prompts and data may
    not hold it). One line each, naming the field, the value and what is valid."""
    if not 0 <= token < vocab:
        return [f"drafter.{field}: {token} is outside the {vocab_name} vocabulary; valid: 0..{vocab - 1} "
                f"(a row the target never emits, e.g. {vocab - 1})"]
    if token in eos_ids:
        return [f"drafter.{field}: {token} is the target's eos id; valid: a row the target never emits "
                f"(prompts and data may not hold it), e.g. {vocab - 1}"]
    return []


def slot_targets(input_ids: torch.Tensor, loss_mask: torch.Tensor, anchors: torch.Tensor,
                 k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The slot convention's training targets for blocks anchored at `anchors` [B, nb] (x_0 at
    position a; block n belongs to row n // nb): (labels [N, k] = x_{a+1..a+k}, -100 past the
    sequence or where loss_mask is 0; prev [N, k] = x_{a..a+k-1}, the tokens the GRU reads,
    clamped inside the sequence). One definition for every family's `training_blocks`."""
    b, length = input_ids.shape
    dev = input_ids.device
    a = anchors.reshape(-1, 1)
    rows = torch.arange(b, device=dev).repeat_interleave(anchors.shape[1])[:, None]
    lab_pos = a + torch.arange(1, k + 1, device=dev)
    lab_c = lab_pos.clamp(max=length - 1)
    keep = (lab_pos < length) & loss_mask[rows, lab_c].bool()
    labels = torch.where(keep, input_ids[rows, lab_c], torch.full_like(lab_c, -100))
    prev = input_ids[rows, (a + torch.arange(0, k, device=dev)).clamp(max=length - 1)]
    return labels, prev


def ragged_allowed(valid: torch.Tensor, mine: torch.Tensor) -> torch.Tensor:
    """Who may attend what in one forward of a ragged batch over a shared cache (the eager drafters' ragged
    contract, as decoding/session.py's DynamicSession does for the target): valid [B, L] = the cached
    entries each row owns, mine [B, n] = the new columns each row owns -> bool [B, n, L + n]. A query sees
    its row's cached entries and its row's new columns up to itself; a column the row does not own is
    seen by no query but its own, so that no query is fully masked."""
    b, n = mine.shape
    cols = torch.arange(n, device=mine.device)
    new = ((cols[None, :] <= cols[:, None]) & mine[:, None, :]) | torch.eye(n, dtype=torch.bool, device=mine.device)
    return torch.cat([valid[:, None, :].expand(b, n, -1), new], dim=-1)


@dataclass
class TrainingBlocks:
    """Teacher-forced blocks for the Domino objective.

    `base_logits_fn(rows)` maps hidden rows [N, Dh] to logits [N, V]; the trainer calls
    it chunk by chunk so [blocks·K, V] logits are never held at once.
    """

    hidden: torch.Tensor  # [N, K, Dh]   N = blocks in the batch
    prev_emb: torch.Tensor  # [N, K, E]  E(x_0..x_{K-1}), ground truth (teacher forcing)
    labels: torch.Tensor  # [N, K]       x_1..x_K, -100 where not trained
    base_logits_fn: Callable[[torch.Tensor], torch.Tensor]
    extra_loss: Optional[torch.Tensor] = None  # a family's own auxiliary loss, if any
    info: dict = field(default_factory=dict)


class DrafterAdapter(nn.Module):
    """Base class for drafter families. Subclasses set the static facts in __init__."""

    family: str = "?"
    topology: str = "chain"  # "chain" | "tree"
    one_pass: bool = True  # the whole block comes from one backbone forward
    ragged_batch: bool = False  # observe/propose take per-row positions (module docstring)
    admits_rows: bool = False  # observe_prompts: new prompts into rows of a ragged batch in flight

    num_slots: int  # K proposals per block
    hidden_dim: int  # Dh, what the LM head reads
    emb_dim: int  # E, the GRU's input
    vocab_size: int

    def reserved_token_ids(self) -> frozenset[int]:
        """Token ids the drafter uses as placeholders (a mask or parallel-draft token): they
        must not occur in prompts or training data, where they would read as the placeholder."""
        return frozenset()

    def capture_layers(self) -> tuple[int, ...]:
        """Target layer ids (0-based outputs, -1 = final post-norm) the adapter reads."""
        raise NotImplementedError

    # ---- decoding
    def reset(self, batch_size: int) -> None:
        raise NotImplementedError

    def observe(self, features: torch.Tensor, positions: torch.Tensor, ids: Optional[torch.Tensor] = None) -> None:
        """Verified context: features [B, n, F] of the target at `positions` [n], and the
        token ids [B, n] there (families that draft from tokens, e.g. PARD, need them;
        engines should always pass them)."""
        raise NotImplementedError

    def propose(self, anchor: torch.Tensor, position: int) -> DraftBlock:
        """anchor [B] = x_0 at absolute `position`; exactly one backbone forward."""
        raise NotImplementedError

    def observe_prompts(self, features, positions: torch.Tensor, ids: torch.Tensor, rows: list[int]) -> None:
        """A ragged batch in flight (`admits_rows`; serving/batch.py's admission in place): `rows` now
        hold new requests, whose earlier context is dropped; features [B, n, F] (or None), positions and
        ids [B, n] hold their prompts (right-padded), -1 positions everywhere else. The other rows keep
        their context, untouched. Afterwards every row decodes as before: a row's drafts read only
        its own context, as in any ragged batch."""
        raise NotImplementedError(f"{self.family}: no admission into a batch in flight (admits_rows is False)")

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def slot_base_logits(self, hidden: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Base logits of flattened rows: hidden [N, Dh], slots [N] (0-based slot of each row).

        Trainers flatten [blocks, K] into rows and chunk them; families with one LM head for
        every slot (DFlash, PARD) ignore `slots`, Medusa has one LM head per slot."""
        return self.base_logits(hidden)

    def context_length(self) -> int:
        raise NotImplementedError

    def static_drafter(self, max_len: int):
        """This drafter on the fast engine, for decodes of at most `max_len` positions: an object
        with ``prefill(features, n)``, ``propose(anchor, pos) -> DraftBlock`` and
        ``observe_block(features_of_all_K+1_verified_tokens, pos)`` (context in preallocated
        tensors, the propose replayed as a CUDA graph). None (the default): decoders use
        observe/propose, eagerly.

        The accept count is never passed: the next ``propose``'s anchor position says it (a
        block observed at pos and anchored next at pos + 1 + a accepted a drafts), so entries
        of the rejected drafts must be masked or ignored, not rolled back. A drafter that reads
        tokens sets ``reads_ids = True``; decoders then also pass ``ids=``: the prompt [B, n] to
        ``prefill`` and the verified block [x_0, d_1..d_K] [B, K+1] to ``observe_block``
        (features may then be None: capture_layers() == ()). Families: DFlash (its context
        K/V), Medusa (the heads on the anchor's predecessor's state), PARD (its LM's own static
        cache, ids); each one's fast.py says how. One that sets ``takes_short_blocks = True`` also
        takes the features of T < K+1 tokens (a verify budget's K' < K, decoding/chain.py); without
        it a solo chain verifies all K or none."""
        return None

    def static_batch_drafter(self, max_len: int, batch: int):
        """As `static_drafter`, for ragged batches of up to `batch` rows (decoding/batched.py):
        ``prefill(right-padded features [B, n, F], n)``, ``propose(anchor [B], positions)`` and
        ``observe_block(features [B, T, F], positions)``, positions as B host ints; row b's
        context in cache row b. Under a verify budget (decoding/budget.py) T may be any 1..K+1 and
        two observe_blocks may come without a propose between them (a step that verified no
        drafts): both must reach the context. ``prefill(features, n, rows=slots)`` may fill only the
        cache rows `slots` (prompts admitted into freed rows of a batch in flight: serving/batch.py),
        the other rows' context kept. It may offer ``compact(rows)`` (rows `rows` become rows
        0..len(rows)-1: decoding/session.py), so that a batch whose rows ended shrinks; without it the
        batch keeps its size to the end. One whose class sets ``positions_on_device = True`` takes
        ``propose(anchor, bounds, at)`` too, the positions as a [B] tensor on the device and the host ints
        bounding them from above: on CUDA the chains then draft each step before reading the last one
        (decoding/batched.py, "Drafted ahead"). None (the default): batches observe/propose eagerly."""
        return None

    # ---- training
    def training_blocks(self, features: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor,
                        anchors: torch.Tensor) -> TrainingBlocks:
        raise NotImplementedError

    def backbone_parameters(self) -> list[nn.Parameter]:
        raise NotImplementedError

    # ---- persistence
    def backbone_state_dict(self) -> dict[str, torch.Tensor]:
        """Native-format tensors of the drafter's own weights (no target tensors)."""
        raise NotImplementedError

    def native_config(self) -> dict:
        raise NotImplementedError
