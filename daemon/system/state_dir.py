"""The state directory: what a daemon keeps on disk, and the lock that makes it one daemon's.

Layout: ``identity.key`` (0600), ``p2pd.identity`` (derived from it each start), ``lock``,
``control.sock``, and ``runs/<run id>.spec`` (signed specs: the creator's, or cached on join,
re-verified on every read).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from pathlib import Path

from swarmd.errors import AlreadyRunningError, RunSpecError, SwarmdError
from swarmd.models.files import write_atomically
from swarmd.peers.records.run_spec import SignedRunSpec, verify_run_spec

logger = logging.getLogger(__name__)

RUNS_DIRNAME = "runs"


def prepare_state_dir(path: Path) -> Path:
    """Create the state directory (0700) or check that an existing one is ours alone."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise SwarmdError(f"cannot create state directory {path}: {e.strerror}; set [node] state_dir") from None
    if not os.access(path, os.W_OK):
        raise SwarmdError(f"state directory {path} is not writable by this user; fix its owner or set [node] state_dir")
    return path


def spec_cache_path(state_dir: Path, run_id: str) -> Path:
    return state_dir / RUNS_DIRNAME / f"{run_id}.spec"


def save_spec(state_dir: Path, signed: SignedRunSpec) -> Path:
    path = spec_cache_path(state_dir, signed.run_id)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    write_atomically(path, signed.raw)
    return path


def load_cached_spec(state_dir: Path, run_id: str) -> SignedRunSpec | None:
    """A spec cached by an earlier join or by ``run create``; re-verified, never trusted blindly."""
    path = spec_cache_path(state_dir, run_id)
    if not path.exists():
        return None
    try:
        return verify_run_spec(path.read_bytes(), run_id)
    except RunSpecError as e:
        logger.warning("Ignoring the cached spec %s: %s", path, e)
        return None


class StateDirLock:
    """One daemon per state directory: two on one identity would fight over the same peer ID."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise AlreadyRunningError(
                f"another swarmd (pid {holder}) uses state directory {self.path.parent}; stop it, or give this "
                "one its own [node] state_dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    @property
    def fd(self) -> int | None:
        return self._fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def run_checkpoint_dir(state_dir: Path, run_id: str) -> Path:
    """Where this peer's shard servers of ``run_id`` keep their checkpoints."""
    return state_dir / RUNS_DIRNAME / run_id


GATHERED_TOKENIZER = "tokenizer.json"
"""In a run's folder, beside the stages ``swarmd export`` gathered: the run's tokenizer, if it has one."""
LOCAL_FILES = "local-files.json"
"""In a run's folder on its creator's machine: where ``swarmd run create`` found the run's files."""


def local_files_path(state_dir: Path, run_id: str) -> Path:
    return run_checkpoint_dir(state_dir, run_id) / LOCAL_FILES


def record_local_files(state_dir: Path, run_id: str, files: dict[str, str]) -> None:
    """Remember, on the creator's machine, where its run's files are (``swarmd run create``), so
    that its own daemon serves them without being told."""
    path = local_files_path(state_dir, run_id)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_atomically(path, json.dumps(files, indent=2, sort_keys=True) + "\n")
