"""Turn expected failures (bad recipe, checkpoint, data, flags) into one clear message.

Tracebacks are for bugs. Set DOMINO_GRAFT_DEBUG=1 to see them for every error.
"""

from __future__ import annotations

import os
import sys


def run_with_clean_errors(fn, args) -> int:
    from .checkpoint import CheckpointError
    from .recipe import RecipeError

    expected = (RecipeError, CheckpointError, FileNotFoundError, ValueError, RuntimeError, KeyError)
    try:
        rc = fn(args)
        return 0 if rc is None else int(rc)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except expected as e:
        if os.environ.get("DOMINO_GRAFT_DEBUG"):
            raise
        msg = str(e) if not isinstance(e, KeyError) else f"missing key {e}"
        print(f"error: {msg}", file=sys.stderr)
        return 1
