"""A preallocated key/value cache for the fast target engine.

One pair of tensors per decoder layer, ``[B, n_kv_heads, max_len, head_dim]``, allocated once
and written in place at explicit positions. Each row has a length (a device tensor, so a CUDA
graph can read and advance it, plus a host mirror the engine uses to pick an attention
bucket). A rejection rolls back by moving the length: nothing is copied, cropped or freed,
and the stale entries past the length are overwritten by the next write and masked until
then (attention reads positions < pos + i + 1 only).
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

Lengths = Union[int, Sequence[int], torch.Tensor]


class StaticKVCache:
    def __init__(self, num_layers: int, max_batch: int, num_kv_heads: int, max_len: int, head_dim: int, *,
                 dtype: torch.dtype, device: Union[str, torch.device]):
        if min(num_layers, max_batch, num_kv_heads, max_len, head_dim) < 1:
            raise ValueError("StaticKVCache: every size must be >= 1")
        self.num_layers, self.max_batch, self.max_len = num_layers, max_batch, max_len
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        self.dtype, self.device = dtype, torch.device(device)
        shape = (max_batch, num_kv_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        # Per-row filled length. Device tensor: graphs read it (pos=None) and advance it in place.
        self.lengths = torch.zeros(max_batch, dtype=torch.long, device=self.device)
        # Host mirror (None once a device-only update made it unknown).
        self.host_lengths: Optional[list[int]] = [0] * max_batch

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    # ------------------------------------------------------------------ writes
    def write(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor, idx: torch.Tensor) -> None:
        """Store k_new/v_new ``[B, H, T, D]`` at positions idx ``[B, T]`` (per row) of `layer`."""
        b = k_new.shape[0]
        rows = torch.arange(b, device=idx.device)[:, None]
        # advanced indices around a slice: the indexed view is [B, T, H, D]
        self.k[layer][rows, :, idx] = k_new.transpose(1, 2)
        self.v[layer][rows, :, idx] = v_new.transpose(1, 2)

    # ---------------------------------------------------------------- lengths
    def set_lengths(self, lengths: Lengths, rows: Optional[int] = None) -> None:
        """Move the filled length of the first `rows` rows (all by default): an int, a host
        sequence, or a device tensor (e.g. pos + 1 + n_accepted, no host sync; the host mirror
        then becomes unknown). This is the rollback: no tensor is copied or cropped."""
        n = self.max_batch if rows is None else rows
        if isinstance(lengths, torch.Tensor):
            self.lengths[:n].copy_(lengths.to(self.lengths.device, torch.long).expand(n) if lengths.dim() == 0
                                   else lengths.to(self.lengths.device, torch.long))
            if lengths.device.type == "cpu":
                vals = lengths.expand(n).tolist() if lengths.dim() == 0 else lengths.tolist()
                self._set_host(vals, n)
            else:
                self.host_lengths = None
            return
        vals = [int(lengths)] * n if isinstance(lengths, int) else [int(x) for x in lengths]
        if len(vals) != n:
            raise ValueError(f"set_lengths: {len(vals)} lengths for {n} rows")
        bad = [x for x in vals if not 0 <= x <= self.max_len]
        if bad:
            raise ValueError(f"set_lengths: {bad[:3]} outside 0..{self.max_len}")
        if n == self.max_batch and len(set(vals)) == 1:
            self.lengths.fill_(vals[0])
        else:
            self.lengths[:n].copy_(torch.tensor(vals, dtype=torch.long), non_blocking=True)
        self._set_host(vals, n)

    rollback = set_lengths

    def _set_host(self, vals: list[int], n: int) -> None:
        if self.host_lengths is None:
            self.host_lengths = [0] * self.max_batch if n == self.max_batch else None
            if self.host_lengths is None:
                return
        self.host_lengths[:n] = [int(v) for v in vals]

    def sync_host_lengths(self) -> list[int]:
        """Read the device lengths back (one host sync) and refresh the mirror."""
        self.host_lengths = self.lengths.tolist()
        return list(self.host_lengths)

    def reset(self) -> None:
        """Empty every row (lengths to 0; the tensors keep their stale contents, masked)."""
        self.set_lengths(0)
