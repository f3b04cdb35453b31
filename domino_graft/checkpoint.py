"""Kept for third-party families: docs/adding_a_family.md documented `domino_graft.checkpoint`
(check_tensors, load_tensors) as the import path a family's `build` reads its weights through,
and installed plug-ins may still import it. The code is domino_graft/artifacts/ (tensors.py,
files.py); nothing in this repository imports this module."""

from .artifacts.files import CheckpointError, read_json  # noqa: F401
from .artifacts.tensors import cast_floating, check_tensors, load_tensors, save_tensors, torch_load  # noqa: F401
