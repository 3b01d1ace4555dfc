"""Documents read from text inputs, streamed: plain text, JSON lines and parquet, gzipped or not.

What ``swarmd data prepare`` and ``swarmd tokenizer train`` read. Nothing is held whole: a file
is read a line or a record batch at a time, and a document is at most
:data:`MAX_DOCUMENT_CHARS` characters (a bigger one is an error, or in plain text is cut).

- ``.txt``, ``.txt.gz``: documents are separated by blank lines (lines of only whitespace); a
  document keeps its lines, their line ends and the blank lines after it, so that the documents
  laid end to end give the file back (less any blank lines it starts with).
- ``.jsonl``, ``.jsonl.gz`` (also ``.json.gz``, ``.ndjson``): one JSON object per line, the
  document in its string field ``text_field`` (``text`` by default). A blank line is skipped;
  anything else that is not such an object is an error naming the file and line.
- ``.parquet``: the string column ``text_field``, read in record batches with ``pyarrow``
  (optional: ``pip install 'swarmd[data]'``). Nulls are skipped.

Empty documents are skipped everywhere. Text must be UTF-8; an invalid byte is an error naming
the file, so that two machines never turn the same file into different documents.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from swarmd.errors import SwarmdError

MAX_DOCUMENT_CHARS = 64 * 1024 * 1024
"""Largest document read: a longer JSON line or parquet value is an error; longer plain text is cut."""

READ_BYTES = 1 << 20
"""Bytes of plain text read and split at once (a file of one huge line still streams)."""

PARQUET_BATCH_ROWS = 1024

SUFFIXES = (".txt", ".txt.gz", ".jsonl", ".jsonl.gz", ".ndjson", ".ndjson.gz", ".json.gz", ".parquet")

PYARROW_HINT = "pip install 'swarmd[data]'"


class InputError(SwarmdError):
    """A text input is missing, of an unknown kind, or malformed."""


def input_kind(path: Path) -> str:
    """``text``, ``jsonl`` or ``parquet``, from the file name; InputError for another suffix."""
    name = path.name.lower()
    if name.endswith((".txt", ".txt.gz")):
        return "text"
    if name.endswith((".jsonl", ".jsonl.gz", ".ndjson", ".ndjson.gz", ".json.gz")):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    raise InputError(f"input {path}: unknown kind of file; give one of {', '.join(SUFFIXES)}")


def check_inputs(paths: Sequence[str | Path]) -> list[Path]:
    """The inputs as paths, each an existing file of a known kind (InputError naming the first that is not)."""
    if not paths:
        raise InputError("no input given: name one or more text, JSON lines or parquet files")
    checked = []
    for p in paths:
        path = Path(p).expanduser()
        if not path.is_file():
            raise InputError(f"input {path} does not exist or is not a file")
        kind = input_kind(path)
        if kind == "parquet":
            require_pyarrow()
        checked.append(path)
    return checked


def require_pyarrow() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError(f"reading parquet needs pyarrow, which is not installed: {PYARROW_HINT}") from None
    return pq


def total_bytes(paths: Sequence[Path]) -> int:
    """The inputs' sizes on disk (compressed, for ``.gz``): what progress is measured against."""
    return sum(p.stat().st_size for p in paths)


def documents(path: Path, *, text_field: str = "text") -> Iterator[tuple[str, int]]:
    """``(document, bytes of the file read so far)`` for each non-empty document of ``path``."""
    kind = input_kind(path)
    try:
        if kind == "parquet":
            yield from _parquet(path, text_field)
            return
        with path.open("rb") as raw:
            stream: io.BufferedIOBase = gzip.GzipFile(fileobj=raw, mode="rb") if path.name.endswith(".gz") else raw
            if kind == "text":
                yield from _text(stream, raw, path)
            else:
                yield from _jsonl(stream, raw, path, text_field)
    except OSError as e:  # a gzip.BadGzipFile is an OSError too
        raise InputError(f"cannot read input {path}: {e}") from None
    except EOFError as e:
        raise InputError(f"input {path} is truncated: {e}") from None


def _decode(data: bytes, path: Path, lines_before: int) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = lines_before + data.count(b"\n", 0, e.start) + 1
        raise InputError(f"input {path}, line {line}: not UTF-8 ({e.reason}); convert it to UTF-8") from None


_BLANK_RUN = re.compile(r"\n(?:[^\S\n]*\n)+")
"""A line end and the blank lines after it (lines of only whitespace): where a document may end."""
_LEADING_BLANKS = re.compile(r"(?:[^\S\n]*\n)+")


def _text(stream: io.BufferedIOBase, raw: io.BufferedIOBase, path: Path) -> Iterator[tuple[str, int]]:
    """Documents split at blank lines, read a chunk at a time (a line at a time costs 3x as much).

    A document ends where a line of text follows blank lines; the blank lines stay with the
    document before them, so that the documents laid end to end are the file again.
    """
    carry = ""  # the last document so far: the next chunk may continue it
    pending = b""  # bytes after the chunk's last line end (or a cut UTF-8 character)
    lines_before = 0
    started = False
    while True:
        chunk = stream.read(READ_BYTES)
        data = pending + chunk
        if chunk:
            cut = data.rfind(b"\n") + 1 or _utf8_boundary(data)
            data, pending = data[:cut], data[cut:]
        text = _decode(data, path, lines_before)
        lines_before += data.count(b"\n")
        carry += text
        if not started:  # the blank lines a file starts with belong to no document
            carry = carry[m.end() :] if (m := _LEADING_BLANKS.match(carry)) else carry
            started = bool(carry)
        tail = ""
        if not chunk:  # the end: blank space after the last text belongs to the last document
            body = carry.rstrip()
            carry, tail = body, carry[len(body) :]
        start = 0
        for m in _BLANK_RUN.finditer(carry):
            if m.end() < len(carry):
                yield carry[start : m.end()], raw.tell()
                start = m.end()
        carry = carry[start:]
        if len(carry) >= MAX_DOCUMENT_CHARS:
            yield carry, raw.tell()
            carry = ""
        if not chunk:
            break
    carry += tail
    if carry.strip():
        yield carry, raw.tell()


def _utf8_boundary(data: bytes) -> int:
    """Where the last whole UTF-8 character of ``data`` ends (a continuation byte is 0b10xxxxxx)."""
    i = len(data)
    while i > 0 and len(data) - i < 4 and data[i - 1] & 0xC0 == 0x80:
        i -= 1
    if i > 0 and data[i - 1] >= 0xC0:  # a lead byte whose character is not complete
        need = 2 if data[i - 1] < 0xE0 else 3 if data[i - 1] < 0xF0 else 4
        if len(data) - (i - 1) < need:
            return i - 1
    return len(data)


def _jsonl(stream: io.BufferedIOBase, raw: io.BufferedIOBase, path: Path, field: str) -> Iterator[tuple[str, int]]:
    limit = 4 * MAX_DOCUMENT_CHARS + 1024  # UTF-8 and JSON escapes make a line longer than its text
    number = 0
    while True:
        line = stream.readline(limit)
        if not line:
            return
        number += 1
        if len(line) >= limit and not line.endswith(b"\n"):
            raise InputError(f"input {path}, line {number}: over {limit} bytes, the limit of one document")
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            raise InputError(f"input {path}, line {number}: not JSON ({e})") from None
        if not isinstance(record, dict) or not isinstance(record.get(field), str):
            got = type(record.get(field)).__name__ if isinstance(record, dict) else type(record).__name__
            raise InputError(
                f"input {path}, line {number}: no string field {field!r} (got {got}); name the field with --text-field"
            )
        text: str = record[field]
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:  # JSON may escape a lone surrogate, which is no text
                raise InputError(f"input {path}, line {number}: the text holds an invalid \\u escape") from None
        if len(text) > MAX_DOCUMENT_CHARS:
            raise InputError(
                f"input {path}, line {number}: a document of {len(text)} characters, over {MAX_DOCUMENT_CHARS}"
            )
        if text:
            yield text, raw.tell()


def _parquet(path: Path, field: str) -> Iterator[tuple[str, int]]:
    pq = require_pyarrow()
    import pyarrow as pa

    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"input {path}: not a parquet file ({e})") from None
    schema = parquet.schema_arrow
    if field not in schema.names:
        raise InputError(f"input {path}: no column {field!r} (it has {schema.names[:10]}); name it with --text-field")
    if not (pa.types.is_string(schema.field(field).type) or pa.types.is_large_string(schema.field(field).type)):
        raise InputError(f"input {path}: column {field!r} is {schema.field(field).type}, not a string column")
    size = os.path.getsize(path)
    rows = max(1, parquet.metadata.num_rows)
    done = 0
    try:
        for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=[field]):
            values = batch.column(0).to_pylist()
            for i, text in enumerate(values):
                if text is not None and len(text) > MAX_DOCUMENT_CHARS:
                    raise InputError(
                        f"input {path}, row {done + i}: a document of {len(text)} characters, over {MAX_DOCUMENT_CHARS}"
                    )
            done += len(values)
            read = size * done // rows
            for text in values:
                if text:
                    yield text, read
    except pa.ArrowException as e:
        raise InputError(f"input {path}: cannot read its parquet data ({e})") from None
