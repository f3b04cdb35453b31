"""Turn expected failures (bad recipe, checkpoint, data, flags, files) into one clear message.

Tracebacks are for bugs, and even a bug prints one line by default (exit 2) that says how to see
its traceback. `domino-graft --debug ...` (or DOMINO_GRAFT_DEBUG=1) re-raises
every error with its traceback.

Expected: RecipeError (one line per problem), CheckpointError and the other ValueErrors,
RuntimeError, KeyError, and OSError, which names the path and the system's reason
(e.g. "No space left on device"); a JSON parse error names the file wherever the file was
read through checkpoint.read_json.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys


def debug_enabled(flag: bool = False) -> bool:
    return bool(flag) or os.environ.get("DOMINO_GRAFT_DEBUG", "") not in ("", "0")


def describe_os_error(e: OSError) -> str:
    """'PATH: reason' (and '-> PATH2' for a rename) for an OSError; its own text when it has no errno."""
    if e.errno is None:
        return str(e)
    reason = e.strerror or os.strerror(e.errno)
    where = ""
    if e.filename is not None:
        where = str(os.fsdecode(e.filename)) if not isinstance(e.filename, int) else f"fd {e.filename}"
        if getattr(e, "filename2", None) is not None:
            where += f" -> {os.fsdecode(e.filename2)}"
        where += ": "
    return f"{where}{reason}"


def format_error(e: BaseException) -> str:
    from .recipe import RecipeError

    if isinstance(e, RecipeError):
        return str(e)  # a header and one line per problem, by design
    if isinstance(e, json.JSONDecodeError):
        msg = f"not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})"
    elif isinstance(e, OSError):
        msg = describe_os_error(e)
    elif isinstance(e, KeyError):
        msg = f"missing key {e}"
    else:
        msg = str(e) or type(e).__name__
    # one line per failure: a multi-line message (torch's, pickle's) is folded
    return " ".join(part.strip() for part in msg.splitlines() if part.strip())


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is, so it unwinds as Ctrl-C does: a half-written bundle
    or run folder is removed (checkpoint.atomic_dir) instead of left beside the destination."""


def _raise_terminated(signum, frame):
    raise Terminated()


@contextlib.contextmanager
def sigterm_unwinds():
    """SIGTERM raises Terminated for the duration (main thread only: signals go there)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_with_clean_errors(fn, args, *, debug: bool = False) -> int:
    from .artifacts.files import CheckpointError
    from .recipe import RecipeError

    expected = (RecipeError, CheckpointError, OSError, ValueError, RuntimeError, KeyError)
    try:
        with sigterm_unwinds():
            rc = fn(args)
        return 0 if rc is None else int(rc)
    except KeyboardInterrupt as e:
        if debug_enabled(debug):
            raise
        terminated = isinstance(e, Terminated)
        print("terminated (SIGTERM)" if terminated else "interrupted", file=sys.stderr)
        return 143 if terminated else 130
    except expected as e:
        if debug_enabled(debug):
            raise
        print(f"error: {format_error(e)}", file=sys.stderr)
        return 1
    except Exception as e:  # a bug: still one line, and how to see (and report) the traceback
        if debug_enabled(debug):
            raise
        print(f"error: internal error ({type(e).__name__}: {format_error(e)}); rerun with --debug for the "
              "traceback and please report it", file=sys.stderr)
        return 2
