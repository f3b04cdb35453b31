"""Process-group plumbing: one process, or `torchrun` ranks sharded with FSDP2.

WORLD_SIZE > 1 (set by torchrun) -> init the default group (nccl on CUDA, gloo on CPU) and
shard the trainable module with `fully_shard`. FSDP2 works on CPU/gloo in torch >= 2.6, so
the CPU test exercises the same code path as a GPU run.

Sharding is one FSDP unit at the root of the objective (backbone + head). Finer units (per
decoder layer) would cut peak memory further, but an adapter may call a layer's submodules
outside that layer's forward (a drafter that projects the target's context into each layer's
keys and values does), where a separately sharded layer's weights would not be gathered.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistInfo:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: str = "cpu"

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        if self.active:
            dist.all_reduce(t)
        return t

    def gather_objects(self, obj) -> list:
        if not self.active:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj):
        if not self.active:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]


def init_distributed(device: str) -> DistInfo:
    """device: 'cpu' | 'cuda' (already resolved from the recipe)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo(device=device)
    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if device == "cuda":
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return DistInfo(rank=rank, world=world, local_rank=local, device=device)


def shard(module: torch.nn.Module, info: DistInfo) -> torch.nn.Module:
    if not info.active:
        return module
    from torch.distributed.fsdp import fully_shard

    fully_shard(module)
    return module


def set_grad_sync(module: torch.nn.Module, sync: bool) -> None:
    """Gradient reduce-scatter only on the last micro-step of an accumulation."""
    if hasattr(module, "set_requires_gradient_sync"):
        module.set_requires_gradient_sync(sync)


def teardown(info: DistInfo) -> None:
    if info.active and dist.is_initialized():
        dist.destroy_process_group()
