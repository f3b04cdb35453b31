"""The one place a requested device ("auto" | "cpu" | "cuda") becomes the device used."""

from __future__ import annotations

DEVICES = ("auto", "cpu", "cuda")


def pick_device(requested, *, option: str = "device") -> str:
    """'auto' -> cuda when available, else cpu; 'cuda' without a CUDA device is an error.

    requested: a device name, or a recipe (its `device`); option: how the error names the
    setting ("device" for the recipe's, "--device" for a command's flag)."""
    import torch

    name = requested if isinstance(requested, str) else requested.device
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"{option}: 'cuda' requested but no CUDA device is available; valid here: auto, cpu")
    return name
