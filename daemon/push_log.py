"""The standby's log of a stage's pushes since its last checkpoint copy: what makes an update committed.

A stage's host numbers every valid push (``StageParameterServer.received``) and, before it
applies one and answers the worker, sends it to the standby, which appends it here. A
checkpoint copy that arrives later makes the entries it includes redundant (its ``log_seq``),
and they are pruned. If the host dies, its successor takes the newest checkpoint copy and
replays the entries numbered after it, in order, and so resumes at exactly the state whose
updates the workers were told about. One file per entry (written to a temporary name, then
renamed), at most ``MAX_ENTRIES`` per stage: a standby that falls that far behind its
checkpoint copies refuses more, and the host carries on unreplicated (and counts it).
"""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path
from typing import Any

from swarmd.errors import SwarmdError

MAX_ENTRIES = 512
MAX_LOG_BYTES = 1 << 30
"""Disk a stage's log may take at a standby (what a faulty or hostile host can make it hold)."""
MAX_META_BYTES = 1024
_NAME = re.compile(r"(\d{12})\.push")


def check_meta(meta: object) -> dict[str, int]:
    """A log entry's metadata is exactly ``{"base": version >= 0, "micro_batches": 1..1e6}``."""
    if not isinstance(meta, dict) or set(meta) != {"base", "micro_batches"}:
        raise SwarmdError("push log metadata must be exactly {base, micro_batches}")
    base, count = meta["base"], meta["micro_batches"]
    if type(base) is not int or base < 0 or type(count) is not int or not 1 <= count <= 1_000_000:
        raise SwarmdError(f"push log metadata out of range: base {base!r}, micro_batches {count!r}")
    return {"base": base, "micro_batches": count}


class PushLog:
    def __init__(self, checkpoint_dir: Path, stage: int) -> None:
        self.folder = checkpoint_dir / f"stage{stage}.pushes"

    def append(self, seq: int, meta: dict[str, Any], blob: bytes, lineage: str) -> None:
        """Keep push ``seq``. ``lineage`` names the host that numbered it: a new host's numbers
        may reuse a dead one's, so entries of another lineage are dropped first."""
        marker = self.folder / "lineage"
        if self.folder.is_dir() and (not marker.exists() or marker.read_text() != lineage):
            self.prune(2**62)
        self.folder.mkdir(parents=True, exist_ok=True)
        if not marker.exists() or marker.read_text() != lineage:
            marker.write_text(lineage)
        check_meta(meta)
        existing = self.sequence_numbers()
        if seq in existing:
            return  # a retry of an entry we hold
        if len(existing) >= MAX_ENTRIES:
            raise SwarmdError(f"the push log holds {len(existing)} entries, its limit; send a checkpoint copy first")
        used = sum(p.stat().st_size for p in self.folder.iterdir() if _NAME.fullmatch(p.name))
        if used + len(blob) > MAX_LOG_BYTES:
            raise SwarmdError(f"the push log would take {used + len(blob)} bytes, over {MAX_LOG_BYTES}; "
                              "send a checkpoint copy first")  # fmt: skip
        header = json.dumps(meta, separators=(",", ":")).encode()
        if len(header) > MAX_META_BYTES:
            raise SwarmdError(f"push log entry header is {len(header)} bytes, over {MAX_META_BYTES}")
        final = self.folder / f"{seq:012d}.push"
        tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            f.write(struct.pack("<I", len(header)) + header + blob)
        os.replace(tmp, final)

    def sequence_numbers(self) -> list[int]:
        if not self.folder.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.folder.iterdir() if (m := _NAME.fullmatch(p.name)))

    def entries_after(self, seq: int, limit: int) -> list[tuple[int, dict[str, Any], bytes]]:
        """The contiguous entries numbered ``seq + 1``, ``seq + 2``, ... (at most ``limit``)."""
        found: list[tuple[int, dict[str, Any], bytes]] = []
        for n in self.sequence_numbers():
            if n <= seq:
                continue
            if n != seq + len(found) + 1 or len(found) >= limit:
                break
            data = (self.folder / f"{n:012d}.push").read_bytes()
            (size,) = struct.unpack_from("<I", data)
            try:
                meta = check_meta(json.loads(data[4 : 4 + size]))
            except (ValueError, SwarmdError):
                break  # a damaged entry ends the contiguous run: replay stops before it
            found.append((n, meta, data[4 + size :]))
        return found

    def prune(self, upto_seq: int) -> None:
        """Drop the entries a checkpoint with ``log_seq = upto_seq`` already includes."""
        for n in self.sequence_numbers():
            if n <= upto_seq:
                (self.folder / f"{n:012d}.push").unlink(missing_ok=True)
