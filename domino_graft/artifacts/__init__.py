"""What domino-graft writes and reads back, and how: the I/O under every command.

    files.py        atomic writes, strict JSON reading, file checksums
    tensors.py      safetensors read and written with strict checks (finite, names, shapes, dtypes)
    destination.py  where a command may write (never over another kind of thing; its own with --force)
    provenance.py   where a result came from: versions, git sha, hardware, model identities
    rundir.py       run directories (`apply` writes them; `train`, `export`, `bench` read them)
    lock.py         one trainer per run dir (RUN/train.lock)

Nothing here imports torch at module level.
"""
