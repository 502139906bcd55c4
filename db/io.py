"""Export records to a JSON document and import them back, validating everything before writing.

A document looks like::

    {"schema": "triton-tuner/records", "schema_version": 2, "exported_at": "2025-...+00:00",
     "devices": [{"name": ..., "alias": ..., "compute_capability": ..., "sm_count": ...}],
     "records": [{<every Record field>, "created_at": "2025-...+00:00"}, ...]}

Import is all or nothing: the whole file is checked first (every problem is reported at once), and
only then written, in one transaction. ``devices`` and ``exported_at`` are for people reading the
file; import derives everything from ``records``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Union

from ._record import ImportSummary, Record
from ._plausible import plausibility_problems
from ._validate import FIELDS, record_from_raw, record_problems
from .store import Store, check_on_conflict

_logger = logging.getLogger(__name__)

SCHEMA = "triton-tuner/records"
# 2: each record carries its dispatch "mode" ("eager" or "graph"); a version-1 record, which has none,
# was timed as a graph replay sees it (do_bench, L2 flushed) and imports as "graph".
SCHEMA_VERSION = 2
# Enough problems to see the pattern without burying the advice at the end of the message.
_PROBLEMS_SHOWN = 20

Source = Union[str, Path, Mapping[str, Any]]
Validator = Callable[[Record], None]


class ImportValidationError(ValueError):
    """A document failed validation; ``problems`` lists every problem found, the message the first 20."""

    def __init__(self, source: str, problems: Sequence[str]) -> None:
        self.source = source
        self.problems = list(problems)
        shown = "\n".join(f"  - {problem}" for problem in self.problems[:_PROBLEMS_SHOWN])
        more = len(self.problems) - _PROBLEMS_SHOWN
        if more > 0:
            shown += f"\n  - ... and {more} more"
        super().__init__(
            f"{source}: {len(self.problems)} problem(s), so nothing was imported "
            f"(records are numbered from 0):\n{shown}\n"
            "Fix these in the file, or export it again from the machine that tuned it, "
            "then import again.")


def dump_document(records: Sequence[Record]) -> dict[str, Any]:
    """The JSON-ready document for ``records``, sorted by device, kernel and problem so that
    exports of the same data diff cleanly."""
    ordered = sorted(records, key=lambda record: record.key)
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "exported_at": datetime.now(timezone.utc).isoformat(),
        "devices": _devices(ordered),
        "records": [_raw_of(record) for record in ordered],
    }


def export_records(store: Store, path: str | Path, device: str | None = None,
                   kernel: str | None = None) -> int:
    """Write the store's records of ``device`` and ``kernel`` (None: all) to ``path``; returns how
    many. The file is replaced atomically, so a reader never sees half of it."""
    records = store.records(device, kernel)
    text = json.dumps(dump_document(records), indent=1, allow_nan=False, ensure_ascii=False)
    _write_atomically(Path(path), text + "\n")
    _logger.info("exported %d records to %s", len(records), path)
    return len(records)


def load_document(source: Source, validate: Validator | None = None) -> list[Record]:
    """The records of a document (a file path, or the parsed object), all checked.

    ``validate`` is called on each well-formed record and raises ValueError for what only the
    caller knows to be wrong (an unknown kernel, a config outside the kernel's space). Raises
    ``ImportValidationError`` listing every problem if there is any.
    """
    name, document = _read(source)
    problems = _document_problems(document)
    if problems:
        raise ImportValidationError(name, problems)
    raws = document["records"]
    if document["schema_version"] == 1:
        raws = [{"mode": "graph", **raw} if isinstance(raw, Mapping) else raw for raw in raws]
    records, problems = _parse_records(raws, validate)
    if problems:
        raise ImportValidationError(name, problems)
    return records


def import_records(store: Store, source: Source, on_conflict: str = "faster",
                   validate: Validator | None = None) -> ImportSummary:
    """Validate the whole document, then write it to ``store`` in one transaction.

    Nothing is written if any record is invalid, or if ``on_conflict="error"`` meets a conflict.
    """
    check_on_conflict(on_conflict)
    records = load_document(source, validate)
    return store.put_many(records, on_conflict)


# Reading ----------------------------------------------------------------------------------------


def _read(source: Source) -> tuple[str, Any]:
    """(a name for messages, the parsed JSON) of ``source``."""
    if not isinstance(source, (str, os.PathLike)):  # already parsed: the envelope check says what it is
        return "document", source
    path = Path(source)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist; pass the path of a file written by "
                                "export") from None
    except OSError as exc:  # a folder, a file this user may not read
        raise OSError(f"cannot read {path}: {exc.strerror or exc}; pass the path of a file written by "
                      "export") from None
    except UnicodeDecodeError as exc:
        raise ImportValidationError(str(path), [f"not UTF-8 text ({exc.reason}); is it a "
                                                "records export?"]) from None
    try:
        return str(path), json.loads(text, parse_int=_parse_int)
    except json.JSONDecodeError as exc:
        raise ImportValidationError(str(path), [f"not JSON: {exc}"]) from None
    except RecursionError:  # Python's parser recurses per bracket: a hostile file must not end in a traceback
        raise ImportValidationError(str(path), ["nested deeper than any records export; is it a "
                                                "records export?"]) from None


class _HugeInt:
    """An integer literal too long for Python to convert (over ``sys.get_int_max_str_digits()`` digits): kept
    as this stand-in so that validation names the record and field that hold it, as for any bad value."""

    def __init__(self, digits: str) -> None:
        self.digits = len(digits.lstrip("-"))

    def __repr__(self) -> str:
        return f"<an integer of {self.digits} digits>"


_HugeInt.__name__ = "int"  # what messages call its type: it is a JSON integer


def _parse_int(text: str) -> int | _HugeInt:
    try:
        return int(text)
    except ValueError:  # "Exceeds the limit (4300 digits) for integer string conversion"
        return _HugeInt(text)


def _document_problems(document: Any) -> list[str]:
    """What is wrong with the document's envelope; records are checked only once it is right."""
    if not isinstance(document, Mapping):
        return [f"the document is a JSON {type(document).__name__}, not an object with "
                f"'schema': '{SCHEMA}'; is it a records export?"]
    problems = []
    if document.get("schema") != SCHEMA:
        problems.append(f"'schema' is {document.get('schema')!r}, not {SCHEMA!r}; "
                        "this is not a records export")
    version = document.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        problems.append(f"'schema_version' is {version!r}; expected an integer from 1 to {SCHEMA_VERSION}")
    elif version > SCHEMA_VERSION:
        problems.append(f"schema_version {version} was written by a newer version of triton-tuner "
                        f"(this one reads up to {SCHEMA_VERSION}); upgrade triton-tuner")
    if not isinstance(document.get("records"), list):
        problems.append(f"'records' must be a list, got {type(document.get('records')).__name__}")
    return problems


def _parse_records(raws: list[Any], validate: Validator | None) -> tuple[list[Record], list[str]]:
    """The records, and every problem with them (bad fields, duplicates, the caller's checks)."""
    records: list[Record] = []
    problems: list[str] = []
    first_of: dict[tuple[str, ...], int] = {}
    for index, raw in enumerate(raws):
        where = _location(index, raw)
        if not isinstance(raw, Mapping):
            problems.append(f"{where}: must be an object, got {type(raw).__name__}")
            continue
        found = record_problems(raw)
        key = _key_of(raw)
        if key is not None and key in first_of:
            found.append(f"same device_name, kernel, problem_key and mode as record {first_of[key]}; "
                         "keep one of them")
        elif key is not None:
            first_of[key] = index
        if not found:
            found = plausibility_problems(raw)
        if not found:
            record = record_from_raw(raw)
            found = _caller_problems(record, validate)
            records.append(record)
        problems += [f"{where}: {problem}" for problem in found]
    return records, problems


def _caller_problems(record: Record, validate: Validator | None) -> list[str]:
    if validate is None:
        return []
    try:
        validate(record)
    except ValueError as exc:
        return [str(exc)]
    return []


def _key_of(raw: Mapping[str, Any]) -> tuple[str, ...] | None:
    key = (raw.get("device_name"), raw.get("kernel"), raw.get("problem_key"), raw.get("mode"))
    return key if all(isinstance(part, str) for part in key) else None  # type: ignore[return-value]


def _location(index: int, raw: Any) -> str:
    """``record 3 (h100 matmul fp16:nn:16x4096x4096)``, with what the record says it is."""
    if not isinstance(raw, Mapping):
        return f"record {index}"
    named = [raw.get(name) for name in ("device_alias", "kernel", "problem_key")]
    named = [_short(part) for part in named if isinstance(part, str) and part]
    return f"record {index} ({' '.join(named)})" if named else f"record {index}"


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# Writing ----------------------------------------------------------------------------------------


def _raw_of(record: Record) -> dict[str, Any]:
    """The JSON form of ``record``: fields in declaration order, shapes as lists, time as ISO."""
    raw = {name: getattr(record, name) for name in FIELDS}
    raw["shapes"] = [list(shape) for shape in record.shapes]
    raw["config"] = dict(record.config)
    raw["triton_config"] = None if record.triton_config is None else dict(record.triton_config)
    raw["created_at"] = record.created_at.isoformat()
    return raw


def _devices(records: Sequence[Record]) -> list[dict[str, Any]]:
    """One entry per device in ``records``, so a reader sees what hardware a file covers."""
    seen: dict[str, dict[str, Any]] = {}
    for record in records:
        seen.setdefault(record.device_name, {
            "name": record.device_name, "alias": record.device_alias,
            "compute_capability": record.compute_capability, "sm_count": record.sm_count})
    return [seen[name] for name in sorted(seen)]


def _write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        # mkstemp makes the file private; an export is meant to be shared, so use the usual mode.
        os.chmod(temporary, path.stat().st_mode & 0o777 if path.exists() else 0o644)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
