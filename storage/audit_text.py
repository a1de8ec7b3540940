"""The audit table read as stored text, one range of ids at a time: the rows `verify` checks and
`export` writes, without decoding a JSON column whose stored text is already what was hashed.

A row's hash covers the canonical JSON of its columns. Rows are stored with their JSON columns
as that canonical text, so the hashed body is the stored text put together; a row whose text is
not canonical (written before rows were stored that way, or by hand) is decoded and encoded
again, as every row once was. Each row stores its previous hash, so a range of ids is checked
on its own (in a worker process for a big log, storage/audit_workers.py) and the ranges are
linked afterwards, in order. The reads themselves are in storage/audit_reads.py.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from json.encoder import encode_basestring  # the C one where the interpreter has it
from typing import Any

#: What the first row's previous hash is.
GENESIS_HASH = "0" * 64
#: The id of the chain's one head row.
HEAD_ID = 1
#: The audit's JSON columns, stored as the canonical text their hash covers.
JSON_COLUMNS = ("matching_rules", "facts", "detail")
#: Every column of an audit row in export order; all but the last (`hash`) are what it hashes.
#: A new column must be added here deliberately: it changes what old rows hash to.
HEADER = (
    "id",
    "at",
    "actor",
    "tag",
    "subject",
    "outcome",
    "deciding_rule",
    "matching_rules",
    "facts",
    "detail",
    "revision",
    "engine",
    "prev_hash",
    "hash",
)
#: A row's hashed bytes put together from its stored bytes: its previous hash, then the head and
#: tail of its body (`body_parts`), the text columns between quotes as they are stored.
_HEAD = (
    b'{"actor":"%s","at":"%sT%s%s+00:00","deciding_rule":"%s","detail":%s,"engine":"%s","facts":%s'
)
_TAIL = (
    b',"id":%d,"matching_rules":%s,"outcome":"%s","prev_hash":"%s","revision":"%s",'
    b'"subject":"%s","tag":"%s"}'
)
_HASHED = b"%s" + _HEAD + _TAIL
#: The stored JSON texts are not parsed, so nothing in them says where one ends: text moved from
#: one JSON column into the next, over the columns between them, would add up to the same body.
#: Every such move leaves a JSON text holding the separator before the column after it (the
#: strings between hold no quote, and no separator can overlap itself). A row whose JSON texts
#: hold none is read as stored; the few others are decoded, which finds where each one ends.
_SEPARATORS = (b',"engine":', b',"id":')

Row = Sequence[Any]


def _json_default(value: object) -> object:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, set | frozenset):
        return sorted(value, key=str)
    raise TypeError(f"{type(value).__name__} cannot go into the audit log: {value!r}")


def canonical_json(value: object) -> str:
    """The one serialisation hashes are computed over: sorted keys, no spaces, UTF-8 as is."""
    return json.dumps(
        value,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
        default=_json_default,
    )


def plain(value: object) -> Any:
    """`value` as JSON reads it back: tuples, sets, dates and non-str keys become what JSON
    makes of them, so the row read from the database hashes the same. (Not sorted here: keys
    of mixed types cannot be sorted before they are strings.)"""
    return json.loads(json.dumps(value, ensure_ascii=False, allow_nan=False, default=_json_default))


def body_parts(values: Sequence[str]) -> tuple[str, str]:
    """A row's hashed body, canonical JSON with its keys in sorted order, split where the
    export's "hash" key goes (after "facts"). `values` are the hashed columns in `HEADER`
    order (id to prev_hash), each already encoded as canonical JSON."""
    (
        row_id,
        at,
        actor,
        tag,
        subject,
        outcome,
        rule,
        rules,
        facts,
        detail,
        revision,
        engine,
        prev_hash,
    ) = values
    head = (
        f'{{"actor":{actor},"at":{at},"deciding_rule":{rule},"detail":{detail},'
        f'"engine":{engine},"facts":{facts}'
    )
    tail = (
        f',"id":{row_id},"matching_rules":{rules},"outcome":{outcome},'
        f'"prev_hash":{prev_hash},"revision":{revision},"subject":{subject},"tag":{tag}}}'
    )
    return head, tail


_sha256 = hashlib.sha256


def digest(prev_hash: str, body: str) -> str:
    return hashlib.sha256((prev_hash + body).encode()).hexdigest()


def stored_at(at: datetime) -> str:
    """How an aware time reads back from either database through `_COLUMNS`."""
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def _iso(at: str) -> str:
    """The stored time as `datetime.isoformat` writes it in UTC (what the hash covers)."""
    moment = datetime.fromisoformat(at)
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(UTC).isoformat()


def _stored_hashed(row: Row) -> bytes | None:
    """What a row's hash covers (its previous hash, then its body) put together from its
    stored bytes as they are, when that is what it hashes to: the row is stored as rows are
    stored now. Else None, and the row is decoded to be judged.

    Put together as they are: a whole id, a time as it is stored, JSON texts that hold no
    separator (`_SEPARATORS`), and text columns with no quote or backslash, which would make
    the body say something else. Any other character JSON escapes cannot be in a body that
    hashes to what was hashed: the hash refuses it. One function, nothing called per column:
    it runs for every row of a log."""
    (row_id, at, actor, tag, subject, outcome, rule, rules, facts, detail, revision, engine,
     prev_hash, row_hash) = row  # fmt: skip
    try:
        text = b"".join((at, actor, tag, subject, outcome, rule, revision, engine, prev_hash))
        json_text = b"".join((rules, facts, detail))
    except TypeError:  # a value that is not bytes (SQLite keeps whatever was written)
        return None
    if (
        type(row_id) is not int
        or len(at) != 26
        or at[19] != 46  # "."
        or b'"' in text
        or b"\\" in text
        or _SEPARATORS[0] in json_text
        or _SEPARATORS[1] in json_text
    ):
        return None
    fraction = b"" if at[20:] == b"000000" else at[19:]  # isoformat() writes none
    hashed = _HASHED % (
        prev_hash, actor, at[:10], at[11:19], fraction, rule, detail, engine, facts,
        row_id, rules, outcome, prev_hash, revision, subject, tag,
    )  # fmt: skip
    return hashed if _sha256(hashed).hexdigest().encode() == row_hash else None


def is_stored_hash(row: Row) -> bool:
    """Whether a row's stored bytes are what its hash covers, as rows are stored now."""
    return _stored_hashed(row) is not None


def _text(row: Row) -> Row | None:
    """The row with its bytes decoded; None where they are not UTF-8."""
    try:
        return [value.decode() if isinstance(value, bytes) else value for value in row]
    except UnicodeDecodeError:
        return None


def _decoded_parts(text: Row) -> tuple[str, str, str] | None:
    """The time in ISO form and the head and tail of a row's body from its decoded values,
    the JSON columns decoded and encoded again, as every row once was; None when they cannot
    be decoded (nothing hashes to what cannot be read)."""
    try:
        iso = _iso(text[1])
        decoded = [json.loads(text[i]) for i in (7, 8, 9)]
        values = [text[0], iso, *text[2:7], *decoded, *text[10:13]]
        return iso, *body_parts([canonical_json(value) for value in values])
    except (TypeError, ValueError):
        return None


def holds(row: Row) -> bool:
    """Whether a row's hash covers its content, from its previous hash on."""
    return _stored_hashed(row) is not None or _decoded_holds(row)


def _decoded_holds(row: Row) -> bool:
    """`holds` for a row not stored as rows are now: its values decoded and encoded again."""
    text = _text(row)
    decoded = _decoded_parts(text) if text is not None else None
    if text is None or decoded is None:
        return False
    return bool(digest(text[12], decoded[1] + decoded[2]) == text[13])


def _unreadable(row: Row) -> ValueError:
    return ValueError(
        f"audit row {row[0]} cannot be exported: its time or JSON columns do not parse "
        "(`gpubot audit verify` names what was altered)"
    )


# ---- reading ---------------------------------------------------------------------------------


# ---- verifying a range ---------------------------------------------------------------------


@dataclass(frozen=True)
class Span:
    """What one range of ids holds: its first and last row, how many rows check out before its
    first fault, and that fault. The first row's id and previous hash are for whoever links
    this range to the one before; every other row was linked here."""

    checked: int = 0
    first: tuple[int, str] | None = None  # (id, prev_hash)
    last: tuple[int, str] | None = None  # (id, hash)
    fault: tuple[int, str] | None = None  # (first bad id, problem)


def check(rows: Iterable[Row]) -> Span:
    """Check the rows of one range: ids without gaps, each row linked to the one before it,
    each row's hash over its content."""
    first: tuple[int, str] | None = None
    last_id, last_hash = 0, b""
    checked = 0
    for row in rows:
        row_id, prev_hash, row_hash = row[0], row[12], row[13]
        if first is None:
            first = (row_id, _decoded(prev_hash))
        else:
            if row_id != last_id + 1:
                return Span(
                    checked, first, None, (last_id + 1, f"audit row {last_id + 1} is missing")
                )
            if prev_hash != last_hash:
                problem = f"audit row {row_id} does not follow row {last_id}"
                return Span(checked, first, None, (row_id, problem))
        if _stored_hashed(row) is None and not _decoded_holds(row):
            return Span(checked, first, None, (row_id, f"audit row {row_id} was altered"))
        checked += 1
        last_id, last_hash = row_id, row_hash
    return Span(checked, first, (last_id, _decoded(last_hash)) if first else None)


def _decoded(value: bytes) -> str:
    # A hash that is not UTF-8 matches no hash; it is still shown for what it is.
    return value.decode(errors="replace")


# ---- export lines --------------------------------------------------------------------------


def jsonl_lines(rows: Iterable[Row]) -> Generator[str, None, None]:
    """One canonical JSON object per row, its hash included."""
    for line in jsonl_bytes(rows):
        yield line.decode()


def jsonl_bytes(rows: Iterable[Row]) -> Generator[bytes, None, None]:
    """The same lines, UTF-8, as the rows stored canonical hold them already."""
    for row in rows:
        hashed = _stored_hashed(row)
        if hashed is not None:
            # The body's tail starts at its one `,"id":` (no JSON text holds one): the hash
            # goes before it.
            body, start, tail = memoryview(hashed), len(row[12]), hashed.find(_SEPARATORS[1])
            yield b"".join((body[start:tail], b',"hash":"', row[13], b'"', body[tail:], b"\n"))
            continue
        text = _text(row)
        parts = _decoded_parts(text) if text is not None else None
        if text is None or parts is None:
            raise _unreadable(row)
        yield f'{parts[1]},"hash":{encode_basestring(text[13])}{parts[2]}\n'.encode()


def csv_lines(rows: Iterable[Row], *, header: bool = True) -> Generator[str, None, None]:
    """The header, then one CSV record per row, its JSON columns as canonical JSON text."""
    out: list[str] = []
    writer = csv.writer(_Sink(out.append), lineterminator="\n")
    if header:
        writer.writerow(HEADER)
        yield out.pop()
    for row in rows:
        text = _text(row)
        try:
            if text is None:
                raise ValueError("not UTF-8")
            at = _iso(text[1])
            if is_stored_hash(row):
                json_texts = text[7:10]
            else:
                json_texts = [canonical_json(json.loads(text[i])) for i in (7, 8, 9)]
        except (TypeError, ValueError):
            raise _unreadable(row) from None
        writer.writerow([text[0], at, *text[2:7], *json_texts, *text[10:14]])
        yield out.pop()


class _Sink:
    """A file for csv.writer that hands each record over instead of buffering it."""

    def __init__(self, write: Callable[[str], object]) -> None:
        self.write = write
