"""A plan's wire form: a small signed manifest, and the parts it names by their digest.

A plan for 1,000 devices is about 60 KB of JSON and one for 10,000 about 600 KB, while one
value through hivemind's DHT process must stay far below its 64 KiB request bound
(``swarmd.peers.dht.process``). So no value a plan makes exceeds ``PART_BYTES`` (16 KiB):

- **The manifest** (this module's ``PlanManifest``, kind ``plan``) is what the coordinator
  signs and stores under ``swarmd/<run>/plan`` with its peer ID as subkey: the version, the
  plan's decompressed size and either the whole plan inline (zlib, base64; a plan of up to a
  few hundred devices) or the digest and size of each part.
- **Parts** are zlib-compressed JSON, each stored under its own SHA-256
  (``swarmd/<run>/plan-part/<digest>``): the DHT's validator stores a part only under the
  digest of its bytes, so nobody can store another value under it, and a reader checks the
  digest again. The signature on the manifest thus covers every part.
- **Devices** (the peer IDs, 52 characters each and most of the bytes) go in parts of their
  own, cut where a peer ID's hash says (content-defined, about ``CHUNK_TARGET`` IDs a part):
  the list is sorted, so a member joining or leaving changes one device part, and a reader
  that cached the others by digest fetches only that one and the parts of the roles (the
  grid, servers, relays: everything else, one compressed stream cut into parts).

Everything read is bounded before it is used: the bundle's and each part's size, the number
of parts, and the bytes each part may decompress to (a small part must not inflate into
gigabytes). ``swarmd.peers.records.plan_record`` checks the plan's own fields once joined.

A ``bundle`` is the manifest followed by its parts in one byte string: what ``PlanRecord.sign``
returns and what the DHT's publish splits (parts first, then the manifest that names them).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from swarmd.errors import RecordError, RunSpecError
from swarmd.peers.records.envelope import Fields, canonical_json
from swarmd.peers.records.run_id import check_run_id
from swarmd.peers.records.signed import Head, SignedRecord

KIND = "plan"
PART_BYTES = 16 * 1024
"""The largest value a plan stores: a part, or the manifest (a quarter of one DHT request)."""
MAX_PLAN_PARTS = 160
"""The most parts a manifest names (its list then fills most of ``PART_BYTES``): 2.5 MiB,
room for 16,384 members; a plan of 10,000 members needs about 90."""
MAX_PLAN_BYTES = 4 * 1024 * 1024
"""The most a whole plan may decompress to (10,000 members: about 600 KB)."""
INLINE_BYTES = 9 * 1024
"""A plan that compresses to at most this rides inline in the manifest (base64 keeps it under
``PART_BYTES``): one value, no part to fetch, for swarms of up to about 200 members."""
CHUNK_TARGET = 128
"""Devices per part on average: a part is cut after a peer ID whose hash says so. Well below
what fits a part (about 290 peer IDs), so that a cut forced by size is rare: after one, a
device joining shifts the parts that follow up to the next cut by hash."""
MAX_TTL_S = 900.0
_PART_MAGIC = b"swarmd-plan-part-v1\x00"
_BUNDLE_MAGIC = b"swarmd-plan-bundle-v1\x00"
_ZLIB_SLACK = 64  # deflate's worst case over incompressible input: a few bytes per 64 KiB block
MAX_BUNDLE_BYTES = len(_BUNDLE_MAGIC) + (1 + MAX_PLAN_PARTS) * (4 + PART_BYTES)


def part_digest(value: bytes) -> str:
    return hashlib.sha256(value).hexdigest()


def make_part(run_id: str, payload: bytes) -> bytes:
    """A part's stored bytes: it names its run, so that the validator can recompute its key."""
    return _PART_MAGIC + run_id.encode() + b"\x00" + payload


def is_part(value: object) -> bool:
    return isinstance(value, bytes) and value.startswith(_PART_MAGIC)


def open_part(value: object, digest: str | None = None) -> tuple[str, bytes]:
    """The run and the compressed payload of a stored part, checked: size, form, run ID and,
    when given, that ``digest`` is its SHA-256. Raises RecordError naming what failed."""
    if not isinstance(value, bytes) or not value.startswith(_PART_MAGIC):
        raise RecordError("a plan part must be bytes that start with the part marker")
    if len(value) > PART_BYTES:
        raise RecordError(f"a plan part is {len(value)} bytes, over the {PART_BYTES}-byte limit")
    if digest is not None and part_digest(value) != digest:
        raise RecordError(f"a plan part's SHA-256 is not the {digest[:16]}… its manifest names")
    run, sep, payload = value[len(_PART_MAGIC) :].partition(b"\x00")
    try:
        run_id = run.decode("ascii")
        check_run_id(run_id)
    except (UnicodeDecodeError, RunSpecError):
        raise RecordError(f"a plan part names no valid run ({run[:40]!r})") from None
    if not sep or not payload:
        raise RecordError("a plan part carries no payload")
    return run_id, payload


@dataclass(frozen=True, kw_only=True)
class PlanManifest(SignedRecord):
    """What the coordinator signs for a plan (module doc); its ``peer_id`` is the coordinator."""

    KIND: ClassVar[str] = KIND
    MAX_BYTES: ClassVar[int] = PART_BYTES
    MAX_TTL_S: ClassVar[float] = MAX_TTL_S
    READ_EXPIRED: ClassVar[bool] = True
    """An expired plan is still read: the newest one stands until replaced."""
    version: int
    size: int
    """The plan's bytes once decompressed (inline, or device parts and role parts together)."""
    inline: str = ""
    """The whole plan, zlib then base64, when it is small; empty when it is in parts."""
    devices: list[tuple[str, int]] = field(default_factory=list)
    """(digest, bytes) of each part of the device list, in order."""
    roles: list[tuple[str, int]] = field(default_factory=list)
    """(digest, bytes) of each part of the compressed roles, in order."""

    def digests(self) -> list[str]:
        return [d for d, _ in (*self.devices, *self.roles)]

    @classmethod
    def _read_fields(cls, f: Fields, head: Head) -> dict[str, Any]:
        claimed = head.peer_id
        inline = f.string("inline", PART_BYTES)
        devices, roles = _part_list(f, "devices", claimed), _part_list(f, "roles", claimed)
        if inline and (devices or roles) or not inline and not (devices and roles):
            raise RecordError(f"plan of {claimed}: either the plan inline or device and role parts, not both")
        if len(devices) + len(roles) > MAX_PLAN_PARTS:
            raise RecordError(f"plan of {claimed} names {len(devices) + len(roles)} parts, over {MAX_PLAN_PARTS}")
        if len({d for d, _ in devices + roles}) != len(devices) + len(roles):
            raise RecordError(f"plan of {claimed} names a part twice")
        return {
            "version": f.integer("version", 0, 2**53),
            "size": f.integer("size", 1, MAX_PLAN_BYTES),
            "inline": inline,
            "devices": devices,
            "roles": roles,
        }


def _part_list(f: Fields, name: str, claimed: str) -> list[tuple[str, int]]:
    raw = f.obj.get(name)
    if not isinstance(raw, list) or len(raw) > MAX_PLAN_PARTS:
        raise RecordError(f"plan of {claimed}: {name} must be a list of at most {MAX_PLAN_PARTS} parts")
    out = []
    for item in raw:
        ok = isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and type(item[1]) is int
        if not ok or len(item[0]) != 64 or item[0].strip("0123456789abcdef") or not 0 < item[1] <= PART_BYTES:
            raise RecordError(f"plan of {claimed}: a part of {name} must be [sha256 hex, 1..{PART_BYTES} bytes]")
        out.append((item[0], item[1]))
    return out


def encode(run_id: str, devices: list[str], roles: dict[str, Any]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """A plan's manifest fields (``size``, ``inline``, ``devices``, ``roles``) and its parts by
    digest, from its device list and the rest of its own fields (``roles``)."""
    whole = canonical_json({**roles, "devices": devices})
    packed = zlib.compress(whole, 9)
    if len(packed) <= INLINE_BYTES:
        return {"size": len(whole), "inline": base64.b64encode(packed).decode(), "devices": [], "roles": []}, {}
    room = PART_BYTES - len(make_part(run_id, b""))
    parts: dict[str, bytes] = {}
    size = 0

    def add(payload: bytes) -> tuple[str, int]:
        value = make_part(run_id, payload)
        parts[part_digest(value)] = value
        return part_digest(value), len(value)

    device_parts = []
    for chunk in _device_chunks(devices, room - _ZLIB_SLACK):
        raw = canonical_json(chunk)
        size += len(raw)
        device_parts.append(add(zlib.compress(raw, 9)))
    raw_roles = canonical_json(roles)
    size += len(raw_roles)
    stream = zlib.compress(raw_roles, 9)
    role_parts = [add(stream[i : i + room]) for i in range(0, len(stream), room)]
    if len(parts) > MAX_PLAN_PARTS:
        raise RecordError(
            f"a plan of {len(devices)} devices needs {len(parts)} parts, over {MAX_PLAN_PARTS}; plan fewer devices"
        )
    return {"size": size, "inline": "", "devices": device_parts, "roles": role_parts}, parts


def _device_chunks(devices: list[str], room: int) -> list[list[str]]:
    """The device list cut where a peer ID's hash says (module doc), each chunk's JSON within
    ``room`` bytes, so that a part fits even if nothing compresses."""
    chunks: list[list[str]] = [[]]
    used = 2  # the list's brackets
    for peer in devices:
        cost = len(canonical_json(peer)) + 1
        if chunks[-1] and used + cost > room:
            chunks.append([])
            used = 2
        chunks[-1].append(peer)
        used += cost
        if int.from_bytes(hashlib.sha256(peer.encode()).digest()[:2], "big") % CHUNK_TARGET == 0:
            chunks.append([])
            used = 2
    return [chunk for chunk in chunks if chunk]


def decode(manifest: PlanManifest, parts: Mapping[str, bytes]) -> tuple[list[str], dict[str, Any]]:
    """The device list and the roles object of ``manifest``'s plan from ``parts`` (by digest),
    each part's digest, run and size checked and every byte decompressed within the size the
    signed manifest gives. Raises RecordError naming what failed."""
    who = manifest.peer_id
    if manifest.inline:
        try:
            packed = base64.b64decode(manifest.inline, validate=True)
        except (binascii.Error, ValueError):
            raise RecordError(f"plan of {who}: the inline plan is not base64") from None
        body = _json(_inflate(packed, manifest.size, who), who)
        listed = body.pop("devices", None) if isinstance(body, dict) else None
        if not isinstance(body, dict) or not isinstance(listed, list):
            raise RecordError(f"plan of {who}: the inline plan must be an object with a device list")
        return listed, body
    left = manifest.size
    devices: list[Any] = []
    for digest, _ in manifest.devices:
        raw = _inflate(_payload(manifest, parts, digest), left, who)
        left -= len(raw)
        chunk = _json(raw, who)
        if not isinstance(chunk, list) or not chunk:
            raise RecordError(f"plan of {who}: device part {digest[:16]}… is not a list of devices")
        devices.extend(chunk)
        if len(devices) > 1 << 16:
            raise RecordError(f"plan of {who}: over {1 << 16} devices")
    stream = b"".join(_payload(manifest, parts, digest) for digest, _ in manifest.roles)
    raw = _inflate(stream, left, who)
    if len(raw) != left:
        raise RecordError(f"plan of {who} decompresses to {manifest.size - left + len(raw)} bytes, not {manifest.size}")
    roles = _json(raw, who)
    if not isinstance(roles, dict):
        raise RecordError(f"plan of {who}: its roles must be an object")
    return devices, roles


def _payload(manifest: PlanManifest, parts: Mapping[str, bytes], digest: str) -> bytes:
    value = parts.get(digest)
    if value is None:
        raise RecordError(f"plan v{manifest.version} of {manifest.peer_id}: part {digest[:16]}… is missing")
    run_id, payload = open_part(value, digest)
    if run_id != manifest.run_id:
        raise RecordError(f"plan of {manifest.peer_id}: part {digest[:16]}… is for run {run_id}")
    return payload


def _inflate(data: bytes, limit: int, who: str) -> bytes:
    """``data`` decompressed, refused past ``limit`` bytes before more is produced."""
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as e:
        raise RecordError(f"plan of {who} is not valid zlib data ({e})") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise RecordError(f"plan of {who} decompresses past the {limit} bytes its manifest gives")
    if not inflater.eof or inflater.unused_data:
        raise RecordError(f"plan of {who}: a compressed part is truncated or has trailing bytes")
    return out


def _json(raw: bytes, who: str) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise RecordError(f"plan of {who} is not valid JSON ({type(e).__name__})") from None


@dataclass(frozen=True)
class PlanBundle:
    """A signed manifest and its parts by digest, as one plan travels before the DHT splits it."""

    manifest: bytes
    parts: dict[str, bytes]


def pack_bundle(manifest: bytes, parts: Mapping[str, bytes]) -> bytes:
    items = [manifest, *parts.values()]
    return _BUNDLE_MAGIC + b"".join(len(item).to_bytes(4, "big") + item for item in items)


def open_bundle(raw: object) -> PlanBundle:
    """Split a bundle into its manifest and parts, bounded (the manifest is not verified here)."""
    if not isinstance(raw, bytes | bytearray) or not bytes(raw).startswith(_BUNDLE_MAGIC):
        raise RecordError("a plan must be a plan bundle (swarmd.peers.records.plan_parts)")
    raw = bytes(raw)
    if len(raw) > MAX_BUNDLE_BYTES:
        raise RecordError(f"a plan bundle is {len(raw)} bytes, over the {MAX_BUNDLE_BYTES}-byte limit")
    items, at = [], len(_BUNDLE_MAGIC)
    while at < len(raw):
        n = int.from_bytes(raw[at : at + 4], "big")
        if at + 4 + n > len(raw) or not 0 < n <= PART_BYTES:
            raise RecordError(f"a plan bundle is cut short or holds an item of {n} bytes (at most {PART_BYTES})")
        items.append(raw[at + 4 : at + 4 + n])
        at += 4 + n
    if not items:
        raise RecordError("a plan bundle holds no manifest")
    return PlanBundle(items[0], {part_digest(v): v for v in items[1:]})
