"""Writing a file so that a crash leaves either the old one or the new one, never half of either.

Here, at the bottom of the layers, so that the models' own writers (a trained tokenizer, a
prepared dataset's manifest) and the daemon's (its config, its state) share one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, data: str | bytes) -> None:
    """Replace ``path`` with ``data`` in one step (a temporary file beside it, synced, renamed over
    it), keeping an existing file's mode (and owner, where allowed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    old = path.stat() if path.exists() else None
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        if old is not None:
            os.chmod(tmp, old.st_mode & 0o7777)
            with contextlib.suppress(PermissionError):
                os.chown(tmp, old.st_uid, old.st_gid)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    # The rename itself survives a power cut only once the folder's entry is on disk.
    with contextlib.suppress(OSError):
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
