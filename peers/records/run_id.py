"""The form of a run ID, apart from the spec so that the command line checks a typed one at once.

A run ID is ``<name>.<24 base32 characters of sha256(name, creator key)>``: self-certifying
(``swarmd.peers.records.run_spec`` says how a joiner checks it). This module imports only the
standard library and ``swarmd.errors``.
"""

from __future__ import annotations

import base64
import hashlib
import re

from swarmd.errors import MalformedRunId

NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")
RUN_ID = re.compile(r"([a-z0-9][a-z0-9-]{0,39})\.([a-z2-7]{24})")


def derive_run_id(name: str, creator_public_key: bytes) -> str:
    """``<name>.<24 base32 chars of sha256(name, creator key)>`` (120 bits of the hash)."""
    digest = hashlib.sha256(b"swarmd-run-id-v1\x00" + name.encode() + b"\x00" + creator_public_key).digest()
    return f"{name}.{base64.b32encode(digest).decode()[:24].lower()}"


def check_run_id(run_id: str) -> str:
    """Validate the form of a run ID typed by a user or received from a peer."""
    if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
        shown = run_id[:80] if isinstance(run_id, str) else type(run_id).__name__
        raise MalformedRunId(
            f"run ID {shown!r} is malformed: expected NAME.HASH as printed by 'swarmd run create' "
            "(NAME of a-z, 0-9 and '-', HASH of 24 base32 characters)"
        )
    return run_id
