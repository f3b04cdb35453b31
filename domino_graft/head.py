"""The Domino head: causal correction of a parallel drafter's logits.

    S_j       = GRU(S_{j-1}, E(x_{j-1}))                  (bias-free, S_0 = 0)
    L_final_j = L_base_j + W2 · SiLU(W1 · [H_j ; S_j])    (low-rank, bias-free)

The head knows nothing of drafter families: it is given per-slot hidden states H,
base logits and the embeddings of the previous tokens. It is the reference every
Triton kernel in `domino_graft.kernels` is tested against.

Slot convention (docs/design.md §2): slot j = 1..K predicts x_j; S_j is the GRU state after
reading E(x_0) .. E(x_{j-1}) (j inputs). Slots j <= pure_prefix_len are returned
uncorrected (their proposal is the plain base argmax).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

# Native tensor names (SGLang / Huang2020 Domino checkpoints). Exporters and strict
# loaders use this list; keep it in one place.
HEAD_TENSOR_NAMES = (
    "prefix_gru.weight_ih_l0",
    "prefix_gru.weight_hh_l0",
    "embed_proj.0.weight",
    "embed_proj.2.weight",
)


@dataclass(frozen=True)
class HeadSpec:
    hidden_dim: int  # H: the drafter's per-slot hidden state (what its LM head reads)
    emb_dim: int  # E: embedding of the previous token (the GRU's input)
    gru_hidden_dim: int  # G
    rank: int  # r
    vocab_size: int  # V
    pure_prefix_len: int = 1

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        g, r = self.gru_hidden_dim, self.rank
        return {
            "prefix_gru.weight_ih_l0": (3 * g, self.emb_dim),
            "prefix_gru.weight_hh_l0": (3 * g, g),
            "embed_proj.0.weight": (r, self.hidden_dim + g),
            "embed_proj.2.weight": (self.vocab_size, r),
        }

    def num_parameters(self) -> int:
        return sum(math.prod(shape) for shape in self.tensor_shapes().values())

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class HeadState:
    """Incremental decoding state: the GRU state after the inputs fed so far."""

    gru: torch.Tensor  # [B, G]
    steps: int  # how many embeddings have been read (= the slot index whose state this is)


class DominoHead(nn.Module):
    def __init__(self, spec: HeadSpec, *, zero_init_w2: bool = True):
        super().__init__()
        self.spec = spec
        self.prefix_gru = nn.GRU(spec.emb_dim, spec.gru_hidden_dim, num_layers=1, bias=False, batch_first=True)
        self.embed_proj = nn.Sequential(
            nn.Linear(spec.hidden_dim + spec.gru_hidden_dim, spec.rank, bias=False),
            nn.SiLU(),
            nn.Linear(spec.rank, spec.vocab_size, bias=False),
        )
        if zero_init_w2:
            # A freshly grafted drafter must produce exactly the base drafter's logits.
            nn.init.zeros_(self.embed_proj[2].weight)

    # ---------------------------------------------------------------- training
    def correction(self, hidden: torch.Tensor, prev_emb: torch.Tensor) -> torch.Tensor:
        """Low-rank features [B, K, r] (before W2) for all slots, teacher-forced."""
        states, _ = self.prefix_gru(prev_emb.to(self.prefix_gru.weight_ih_l0.dtype))
        x = torch.cat([hidden.to(states.dtype), states], dim=-1)
        return F.silu(self.embed_proj[0](x))

    def block(self, hidden: torch.Tensor, base_logits: torch.Tensor, prev_emb: torch.Tensor) -> torch.Tensor:
        """Final logits for all K slots at once.

        hidden [B, K, H], base_logits [B, K, V], prev_emb [B, K, E] = E(x_0..x_{K-1}).
        """
        feats = self.correction(hidden, prev_emb)
        delta = self.embed_proj[2](feats).to(base_logits.dtype)
        mask = self.corrected_slots(hidden.shape[1], hidden.device).to(delta.dtype)
        return base_logits + delta * mask[None, :, None]

    def corrected_slots(self, num_slots: int, device=None) -> torch.Tensor:
        """[K] bool: which slots (1-based j = index+1) the head corrects."""
        return torch.arange(1, num_slots + 1, device=device) > self.spec.pure_prefix_len

    # ---------------------------------------------------------------- decoding
    def init_state(self, batch_size: int, *, device=None, dtype=None) -> HeadState:
        w = self.prefix_gru.weight_hh_l0
        h = torch.zeros(batch_size, self.spec.gru_hidden_dim, device=device or w.device, dtype=dtype or w.dtype)
        return HeadState(gru=h, steps=0)

    def advance(self, state: HeadState, emb: torch.Tensor) -> HeadState:
        """Read one embedding [B, E]: S_{j} -> S_{j+1}."""
        h = torch.gru_cell(
            emb.to(state.gru.dtype), state.gru, self.prefix_gru.weight_ih_l0, self.prefix_gru.weight_hh_l0, None, None
        )
        return HeadState(gru=h, steps=state.steps + 1)

    def step(self, state: HeadState, emb: torch.Tensor, hidden: torch.Tensor, base_logits: torch.Tensor):
        """Incremental slot: read E(x_{j-1}) and return (final logits of slot j, new state).

        Matches `block()` slot by slot; slots within the pure prefix come back uncorrected
        (the GRU still reads their input so later slots see the whole prefix).
        """
        state = self.advance(state, emb)
        j = state.steps
        if j <= self.spec.pure_prefix_len:
            return base_logits, state
        x = torch.cat([hidden.to(state.gru.dtype), state.gru], dim=-1)
        delta = self.embed_proj[2](F.silu(self.embed_proj[0](x)))
        return base_logits + delta.to(base_logits.dtype), state

    def is_identity(self) -> bool:
        """True when W2 is all zeros: the graft cannot change any logit."""
        return bool((self.embed_proj[2].weight == 0).all())
