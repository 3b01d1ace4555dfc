"""Reading a run's file from a folder or an HTTP(S) mirror its manifest lists.

Reading a run's file from a source its data manifest lists: a folder (a shared disk, a
mounted bucket) or an HTTP(S) mirror.

A source is a base: a folder path or a URL, and the file is ``base/NAME``. Both are read in a
worker thread, in chunks, into a file the caller hashes as it goes; an HTTP transfer cut off
mid-way resumes with a ``Range`` request. Nothing here trusts what it reads: the caller checks
the whole file's digest before it uses a byte.
"""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from swarmd.errors import SwarmdError

CHUNK = 1 << 20
CONNECT_TIMEOUT_S = 15.0
"""How long an HTTP connection or a read of one chunk may take."""
RESUMES = 3
"""How many times a cut-off HTTP transfer is resumed before the mirror counts as failed."""


class MirrorError(SwarmdError):
    """A source could not give a file (down, missing, too large); the fetcher tries the next."""


def is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def describe(source: str) -> str:
    """A source as logs name it (a URL without its query, which may hold a token)."""
    if is_url(source):
        parts = urllib.parse.urlsplit(source)
        return f"{parts.scheme}://{parts.netloc}{parts.path}"
    return source


def read_source(source: str, name: str, out: Path, max_bytes: int, on_chunk: Callable[[bytes], None]) -> int:
    """Copy ``source/name`` into ``out`` (blocking), calling ``on_chunk`` with every chunk;
    returns the bytes read. Raises ``MirrorError`` when the source cannot give it whole."""
    if is_url(source):
        return _read_url(source.rstrip("/") + "/" + urllib.parse.quote(name), out, max_bytes, on_chunk)
    return _read_folder(Path(source).expanduser() / name, out, max_bytes, on_chunk)


def _read_folder(path: Path, out: Path, max_bytes: int, on_chunk: Callable[[bytes], None]) -> int:
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise MirrorError(f"{path} is {size} bytes, over the {max_bytes} the run's manifest allows for it")
        with path.open("rb") as src, out.open("wb") as dst:
            return _copy(src.read, dst, 0, max_bytes, on_chunk, f"{path} grew past {max_bytes} bytes while it was read")
    except OSError as e:
        raise MirrorError(f"cannot read {path}: {e.strerror or e}") from None


def _copy(
    read: Callable[[int], bytes],
    dst: BinaryIO,
    total: int,
    max_bytes: int,
    on_chunk: Callable[[bytes], None],
    over: str,
) -> int:
    """Copy ``read``'s chunks to ``dst`` after the ``total`` bytes already there, each handed to
    ``on_chunk``; returns the new total. Raises ``MirrorError(over)`` past ``max_bytes``."""
    while chunk := read(CHUNK):
        total += len(chunk)
        if total > max_bytes:
            raise MirrorError(over)
        on_chunk(chunk)
        dst.write(chunk)
    return total


def _read_url(url: str, out: Path, max_bytes: int, on_chunk: Callable[[bytes], None]) -> int:
    with out.open("wb") as dst:
        for attempt in range(RESUMES + 1):
            total = dst.tell()  # what earlier attempts wrote: a resume asks for the rest
            request = urllib.request.Request(url, headers={"User-Agent": "swarmd"})
            if total:
                request.add_header("Range", f"bytes={total}-")
            try:
                with urllib.request.urlopen(request, timeout=CONNECT_TIMEOUT_S) as answer:
                    if total and answer.status != 206:
                        raise MirrorError(f"{describe(url)} does not resume transfers (status {answer.status})")
                    length = answer.headers.get("Content-Length")
                    if length is not None and length.isdigit() and total + int(length) > max_bytes:
                        raise MirrorError(f"{describe(url)} offers {total + int(length)} bytes, over {max_bytes}")
                    return _copy(
                        answer.read, dst, total, max_bytes, on_chunk, f"{describe(url)} sent over {max_bytes} bytes"
                    )
            except urllib.error.HTTPError as e:
                raise MirrorError(f"{describe(url)} answered HTTP {e.code} {e.reason}") from None
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
                if attempt == RESUMES:
                    reason = getattr(e, "reason", e)
                    raise MirrorError(f"{describe(url)} failed after {dst.tell()} bytes: {reason}") from None
    raise AssertionError("unreachable")
