"""The fast target engine's kernels (domino_graft.fast): few-row linears, decode attention, row norm.

Each module imports Triton, so this package imports none of them: `from
domino_graft.kernels.engine import small_linear` where a kernel is used.
"""
