"""Files of any size through any per-chunk function: streamed reading, bounded memory, exact resume.

`read_records` streams a txt / jsonl / csv / tsv file as `Record`s; bad rows are named with
file:line, counted per problem and skipped. `run_file` maps the usable records, chunk by chunk,
through the caller's `process` function (a model, typically; nothing here knows about models) into
one output:

  npy    a (N, dim) array in a `.npy` file, row i = the i-th usable record, written in place
         through `numpy.lib.format.open_memmap`;
  jsonl  one JSON object per usable input row, holding its source `line` (and its `id`, if the
         row has one), appended and flushed chunk by chunk.

Memory is one chunk of records and its results, whatever the file size. The npy header holds the
shape and comes first in the file, so a first streaming pass counts the usable rows (parsing only,
no `process` calls: its cost is one read of the file, small next to a model's). That pass also
gives the progress bar its exact total, reports every bad row once, and fails on a file with
nothing usable before any output is created. (Writing rows first and the header last would need a
guessed, padded header and leave a file that no reader opens until the end.)

Resume: the output is built under `OUT.partial` and renamed to OUT when complete, so a finished
output never sits beside a half one. Next to it a small state file, `OUT.progress.json` (atomic
writes), records the rows done, the committed byte length of a jsonl output, the input's size,
mtime and a hash of its first MiB, the reading options and the caller's `settings`. A row's result
is on disk before the state that counts it. `resume=True` verifies all of it (an error names what
changed), truncates a jsonl to its committed length and continues after the rows done, so a run
killed at any moment (SIGKILL included) and resumed writes the same bytes as an uninterrupted one.

Several processes (`torchrun --nproc_per_node N [--nnodes M]`, WORLD_SIZE = W > 1): rank r
processes chunks r, r + W, r + 2W, ... of the usable rows (chunk k = rows [k·chunk_size,
(k+1)·chunk_size)), so the output is the same for any W. npy: rank 0 creates the memory-mapped file,
the others open it after rank 0 says it is there, and each writes its own rows. jsonl: each rank
appends to its own part file, and rank 0 merges the parts in input order at the end. Each rank
keeps its own state file (`OUT.progress-rank{r}-of-{W}.json`), so resume works per rank, with the
same W. Across nodes, OUT and the input must be on a file system every node sees (for npy one
whose writes from several hosts to one file do not clobber each other; otherwise use jsonl).
"""

from __future__ import annotations

import atexit
import csv
import dataclasses
import glob
import hashlib
import json
import logging
import math
import mmap
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from bertkit.data.report import MAX_MESSAGES, DataReport, json_lines
from bertkit.fileio import atomic_write_json

log = logging.getLogger(__name__)

FORMATS = ("auto", "txt", "jsonl", "csv", "tsv")
SUFFIX_FORMATS = {".txt": "txt", ".text": "txt", ".jsonl": "jsonl", ".json": "jsonl",
                  ".ndjson": "jsonl", ".csv": "csv", ".tsv": "tsv"}
KINDS = ("npy", "jsonl")
# Records per `process` call: big enough that a token-budget batcher inside `process` finds
# similar lengths to group, small enough that a chunk's texts and results stay a few MB.
DEFAULT_CHUNK_SIZE = 1024
# A "text" longer than this is a dump (minified JSON, base64, a table on one line), not a
# sentence or document; one such row would also hold more memory than a whole chunk should.
DEFAULT_MAX_CHARS = 1_000_000
HEAD_BYTES = 1 << 20  # the input's first MiB is hashed: a rewritten file is caught, cheaply
_SNIFF_BYTES = 8192  # bytes inspected to tell a binary file (NUL bytes) from text
STATE_VERSION = 1


# ---------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------
@dataclass
class Record:
    """One usable input row."""

    line: int  # 1-based line of the source file where the row starts
    text: str
    pair: str | None = None  # the second text of a pair (classify pairs, rerank), from pair_field
    extra: dict[str, Any] = field(default_factory=dict)  # the row's other fields, e.g. "id"


@dataclass
class RecordReport(DataReport):
    """A `DataReport` that also counts the skipped rows per problem ("invalid JSON": 3, ...)."""

    problems: Counter = field(default_factory=Counter)
    quiet: bool = False  # count and keep messages without logging (ranks > 0 read the same file)

    def skip_problem(self, where: str, problem: str, detail: str = "") -> None:
        self.problems[problem] += 1
        why = f"{problem}: {detail}" if detail else problem
        if not self.quiet:
            self.skip(where, why)
            return
        self.n_skipped += 1
        if len(self.messages) < MAX_MESSAGES:
            self.messages.append(f"{where}: {why}")

    def summary(self) -> str:
        text = f"{self.source}: {self.n_kept} rows kept, {self.n_skipped} skipped"
        if self.problems:
            kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(self.problems.items()))
            text += f" ({kinds}); first problems: " + " | ".join(self.messages[:3])
        return text

    def to_dict(self) -> dict:
        return {**super().to_dict(), "problems": dict(sorted(self.problems.items()))}


def _skip(report: DataReport, where: str, problem: str, detail: str = "") -> None:
    if isinstance(report, RecordReport):
        report.skip_problem(where, problem, detail)
    else:
        report.skip(where, f"{problem}: {detail}" if detail else problem)


def record_format(path: str | os.PathLike, fmt: str = "auto") -> str:
    """'txt', 'jsonl', 'csv' or 'tsv': `fmt` itself, or from the file suffix when fmt is 'auto'."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown input format {fmt!r}; use one of {', '.join(FORMATS)}")
    if fmt != "auto":
        return fmt
    suffix = Path(path).suffix.lower()
    if suffix not in SUFFIX_FORMATS:
        raise ValueError(f"{path}: cannot tell the format from suffix {suffix!r} (known: "
                         f"{', '.join(SUFFIX_FORMATS)}); pass --format txt|jsonl|csv|tsv")
    return SUFFIX_FORMATS[suffix]


def read_records(path: str | os.PathLike, *, fmt: str = "auto", text_field: str = "text",
                 pair_field: str | None = None, report: DataReport | None = None,
                 max_chars: int = DEFAULT_MAX_CHARS) -> Iterator[Record]:
    """Stream the usable rows of a txt / jsonl / csv / tsv file as `Record`s, in file order.

    txt: one text per line. jsonl: one JSON object per line, its `text_field` (and `pair_field`)
    strings. csv / tsv: a header row naming the columns, then one row per record (quoted fields
    may span lines; `Record.line` is where the row starts). Blank lines are skipped silently, as
    by every bertkit reader. Bad rows (not UTF-8, invalid JSON, not an object, a missing or
    non-string field, empty text, a wrong column count, malformed CSV, text over `max_chars`) are
    named as file:line in `report`, counted and skipped. The file is read line by line, never
    whole. Raises FileNotFoundError / ValueError at once for a missing file, an unknown format, a
    binary file or a header without `text_field`; ValueError at the end when no row was usable.
    """
    path = Path(path)
    kind = record_format(path, fmt)
    if not path.is_file():
        raise FileNotFoundError(f"no such input file: {path}")
    if kind == "txt" and pair_field is not None:
        raise ValueError(f"{path}: a txt file holds one text per line, so pair field {pair_field!r} "
                         "cannot be read from it; give pairs as jsonl, csv or tsv")
    with open(path, "rb") as f:
        head = f.read(_SNIFF_BYTES)
    if b"\x00" in head:
        raise ValueError(f"{path} looks binary (NUL bytes in its first {_SNIFF_BYTES} bytes); pass a "
                         "UTF-8 text file (a UTF-16 file: re-encode it, e.g. iconv -f utf-16 -t utf-8)")
    if report is None:
        report = RecordReport(str(path))
    if kind in ("csv", "tsv") and csv.field_size_limit() < max_chars + 1:
        # The csv module's own limit (128 Ki characters) would reject long documents as malformed;
        # raising it only widens what parses (our `max_chars` check reports the rest).
        csv.field_size_limit(max_chars + 1)
    if kind in ("csv", "tsv"):  # a header without the text column fails now, not at the first row
        lines = _utf8_lines(path, RecordReport("header", quiet=True))
        try:
            _csv_header(path, lines, kind, text_field, pair_field)
        finally:
            lines.close()
    return _records(path, kind, text_field, pair_field, report, max_chars)


def _records(path: Path, kind: str, text_field: str, pair_field: str | None, report: DataReport,
             max_chars: int) -> Iterator[Record]:
    kept = 0
    lines = _utf8_lines(path, report)
    if kind == "txt":
        rows = _txt_records(path, lines, report, max_chars)
    elif kind == "jsonl":
        rows = _jsonl_records(path, lines, report, text_field, pair_field, max_chars)
    else:
        rows = _csv_records(path, lines, report, kind, text_field, pair_field, max_chars)
    for record in rows:
        kept += 1
        report.n_kept += 1
        yield record
    if kept == 0:
        detail = ""
        if report.messages:
            detail = f"; {report.n_skipped} rows skipped, e.g. {report.messages[0]}"
        raise ValueError(f"{path}: no usable rows{detail}")


def _utf8_lines(path: Path, report: DataReport) -> Iterator[tuple[int, str]]:
    """(line number, text with its line ending) of a file, decoded line by line so that one bad
    line costs only itself."""
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, 1):
            if line_no == 1 and raw.startswith(b"\xef\xbb\xbf"):  # UTF-8 byte-order mark
                raw = raw[3:]
            try:
                yield line_no, raw.decode("utf-8")
            except UnicodeDecodeError as err:
                _skip(report, f"{path}:{line_no}", "non-UTF-8 line",
                      f"byte 0x{raw[err.start]:02x} at column {err.start + 1}; re-encode the file "
                      "as UTF-8 (e.g. iconv -f latin1 -t utf-8)")


def _txt_records(path: Path, lines: Iterator[tuple[int, str]], report: DataReport,
                 max_chars: int) -> Iterator[Record]:
    for line_no, line in lines:
        text = line.rstrip("\r\n")
        if not text.strip():
            continue
        if len(text) > max_chars:
            _skip(report, f"{path}:{line_no}", "text too long", f"{len(text)} characters > {max_chars}")
            continue
        yield Record(line_no, text)


def _jsonl_records(path: Path, lines: Iterator[tuple[int, str]], report: DataReport,
                   text_field: str, pair_field: str | None, max_chars: int) -> Iterator[Record]:
    for line_no, row, error in json_lines(lines):
        where = f"{path}:{line_no}"
        if error:
            _skip(report, where, "invalid JSON", error)
        elif not isinstance(row, dict):
            _skip(report, where, "not a JSON object",
                  f"got {type(row).__name__}; each line must be an object with a {text_field!r} field")
        else:
            record = _row_record(row, line_no, where, report, text_field, pair_field, max_chars)
            if record is not None:
                yield record


def _row_record(row: dict[str, Any], line_no: int, where: str, report: DataReport,
                text_field: str, pair_field: str | None, max_chars: int) -> Record | None:
    """The Record of one parsed row, or None after reporting what is wrong with it."""
    values = []
    for name, flag, role in ((text_field, "--text-field", "text"), (pair_field, "--pair-field", "pair")):
        if name is None:
            values.append(None)
            continue
        if name not in row:
            _skip(report, where, f"missing {role} field",
                  f"no {name!r} (found: {', '.join(sorted(map(str, row))) or 'nothing'}); pass {flag}")
            return None
        value = row[name]
        if not isinstance(value, str):
            _skip(report, where, f"{role} not a string",
                  f"{name!r} holds {type(value).__name__} {json.dumps(value)[:40]}; expected a string")
            return None
        if not value.strip():
            _skip(report, where, f"empty {role}", f"{name!r} is empty")
            return None
        if len(value) > max_chars:
            _skip(report, where, f"{role} too long", f"{len(value)} characters > {max_chars}")
            return None
        values.append(value)
    extra = {k: v for k, v in row.items() if k != text_field and k != pair_field}
    return Record(line_no, values[0], values[1], extra)


class _LineFeed:
    """Decoded lines for `csv.reader`, remembering the line where the current row began."""

    def __init__(self, lines: Iterator[tuple[int, str]]):
        self._lines = lines
        self.start: int | None = None

    def __iter__(self) -> "_LineFeed":
        return self

    def __next__(self) -> str:
        line_no, text = next(self._lines)
        if self.start is None:
            self.start = line_no
        return text

    def take_start(self) -> int:
        start, self.start = self.start, None
        return start or 0


def _csv_header(path: Path, lines: Iterator[tuple[int, str]], kind: str, text_field: str,
                pair_field: str | None) -> tuple[_LineFeed, Any, list[str]]:
    """A csv reader over `lines` past the header row, and the header; ValueError for a header that
    lacks `text_field` / `pair_field` or names a column twice."""
    feed = _LineFeed(lines)
    reader = csv.reader(feed, delimiter="," if kind == "csv" else "\t")
    header: list[str] = []
    while not header:  # blank lines before the header are tolerated
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            break  # empty file: nothing usable, reported at the end of reading
        except csv.Error as err:
            raise ValueError(f"{path}:{feed.take_start()}: malformed {kind.upper()} header "
                             f"({err})") from None
        feed.take_start()
        if header and not any(header):
            header = []
    duplicates = sorted({h for h in header if header.count(h) > 1})
    if duplicates:
        raise ValueError(f"{path}: the header names column(s) {', '.join(map(repr, duplicates))} more "
                         "than once; give every column its own name")
    for name, flag in ((text_field, "--text-field"), (pair_field, "--pair-field")):
        if header and name is not None and name not in header:
            raise ValueError(f"{path}: no column {name!r} in the header ({', '.join(header)}); pass "
                             f"{flag} with one of them")
    return feed, reader, header


def _csv_records(path: Path, lines: Iterator[tuple[int, str]], report: DataReport, kind: str,
                 text_field: str, pair_field: str | None, max_chars: int) -> Iterator[Record]:
    feed, reader, header = _csv_header(path, lines, kind, text_field, pair_field)
    if not header:
        return
    separator = "commas" if kind == "csv" else "tabs"
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            _skip(report, f"{path}:{feed.take_start()}", f"malformed {kind.upper()}", str(err))
            continue
        line_no = feed.take_start()
        if not any(x.strip() for x in fields):
            continue
        where = f"{path}:{line_no}"
        if len(fields) != len(header):
            _skip(report, where, "wrong column count",
                  f"{len(fields)} fields, the header has {len(header)}; quote fields that "
                  f"contain {separator}")
            continue
        record = _row_record(dict(zip(header, fields)), line_no, where, report, text_field,
                             pair_field, max_chars)
        if record is not None:
            yield record


# ---------------------------------------------------------------------------------------------
# processes (torchrun)
# ---------------------------------------------------------------------------------------------
@dataclass
class _Group:
    """This process's place among the ranks sharing one file; a no-op for a single process."""

    rank: int = 0
    world_size: int = 1
    backend: str | None = None

    def _device(self):
        import torch

        return torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else None

    def barrier(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            if self.backend == "nccl":
                dist.barrier(device_ids=[self._device().index])
            else:
                dist.barrier()

    def broadcast(self, value: Any) -> Any:
        """Rank 0's `value` (picklable) on every rank."""
        if self.world_size == 1:
            return value
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0, device=self._device())
        return box[0]


def _join_group(distributed: Any) -> _Group:
    """distributed: "auto" (join when WORLD_SIZE > 1), False (one process whatever the environment),
    True (require WORLD_SIZE > 1) or a `bertkit.train.distributed.DistInfo` already set up."""
    if distributed is False:
        return _Group()
    if hasattr(distributed, "world_size") and hasattr(distributed, "rank"):
        return _Group(distributed.rank, distributed.world_size, getattr(distributed, "backend", None))
    if distributed not in ("auto", True):
        raise ValueError(f"distributed must be 'auto', True, False or a DistInfo, got {distributed!r}")
    raw = os.environ.get("WORLD_SIZE", "") or "1"
    try:
        world_size = int(raw)
    except ValueError:
        raise ValueError(f"environment variable WORLD_SIZE={raw!r} is not an integer; start "
                         "several processes with torchrun") from None
    if world_size <= 1:
        if distributed is True:
            raise ValueError(f"distributed=True but WORLD_SIZE is {raw}; start the command with "
                             "torchrun --nproc_per_node N")
        return _Group()
    import torch.distributed as dist

    if dist.is_initialized():  # the caller (e.g. for a model on GPUs) already joined
        return _Group(dist.get_rank(), dist.get_world_size(), dist.get_backend())
    from bertkit.train.distributed import init_distributed

    # Sharing out a file needs only barriers and small messages: gloo on CPU is enough, whatever
    # device the caller's model runs on.
    info = init_distributed("cpu")
    # The group stays for the process's lifetime: a second file in the same process reuses it
    # (leaving and joining again races with ranks still leaving), and it is left at exit.
    atexit.register(_leave_group)
    return _Group(info.rank, info.world_size, info.backend)


def _leave_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _on_rank0(group: _Group, fn: Callable[[], Any]) -> Any:
    """Run `fn` on rank 0 and hand its value to every rank; an error there is raised on every rank
    (the others would otherwise wait for rank 0 until a timeout)."""
    outcome: tuple = ("ok", None)
    error: BaseException | None = None
    if group.rank == 0:
        try:
            outcome = ("ok", fn())
        except Exception as err:  # noqa: BLE001 - re-raised below, on every rank
            error = err
            outcome = ("error", type(err).__name__, str(err))
    outcome = group.broadcast(outcome)
    if error is not None:
        raise error
    if outcome[0] == "error":
        kinds = {"FileExistsError": FileExistsError, "FileNotFoundError": FileNotFoundError,
                 "IsADirectoryError": IsADirectoryError, "NotADirectoryError": NotADirectoryError}
        raise kinds.get(outcome[1], ValueError)(f"(rank 0) {outcome[2]}")
    return outcome[1]


# ---------------------------------------------------------------------------------------------
# the output's files
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OutputFiles:
    """The names beside OUT that a run uses while OUT is being built."""

    out: Path

    @property
    def partial(self) -> Path:
        return self.out.with_name(self.out.name + ".partial")

    def state(self, rank: int, world_size: int) -> Path:
        if world_size == 1:
            return self.out.with_name(self.out.name + ".progress.json")
        return self.out.with_name(f"{self.out.name}.progress-rank{rank}-of-{world_size}.json")

    def part(self, rank: int, world_size: int) -> Path:
        return self.out.with_name(f"{self.out.name}.part-rank{rank}-of-{world_size}")

    def states(self) -> list[Path]:
        return sorted(Path(p) for p in glob.glob(glob.escape(str(self.out)) + ".progress*.json"))

    def leftovers(self) -> list[Path]:
        """Every file of an unfinished run: the partial output, state files, part files."""
        parts = glob.glob(glob.escape(str(self.out)) + ".part-rank*")
        found = self.states() + sorted(Path(p) for p in parts)
        return ([self.partial] if self.partial.exists() else []) + found


def input_fingerprint(path: str | os.PathLike) -> dict[str, Any]:
    """Size, modification time and SHA-256 of the first MiB: what tells a changed input apart."""
    path = Path(path)
    stat = path.stat()
    with open(path, "rb") as f:
        head = hashlib.sha256(f.read(HEAD_BYTES)).hexdigest()
    return {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "head_sha256": head}


def _plain(value: Any) -> Any:
    """`value` as JSON would give it back (tuples → lists, Paths → strings), for comparisons."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def _json_default(value: Any) -> Any:
    """JSON for what `process` typically returns: numpy scalars and arrays, tensors, dataclasses."""
    if isinstance(value, np.generic):
        return value.item()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if hasattr(value, "tolist"):  # np.ndarray, torch.Tensor
        return value.tolist()
    raise TypeError(f"process returned a {type(value).__name__}, which has no JSON form; return "
                    "dicts, lists, strings and numbers")


def _when(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).isoformat(timespec="microseconds")


def _state_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What differs between a partial run's saved state and this run, one phrase per difference."""
    changes = []
    old_in, new_in = saved.get("input", {}), current["input"]
    if old_in.get("size") != new_in["size"]:
        changes.append(f"input size: {old_in.get('size')} → {new_in['size']} bytes")
    if old_in.get("mtime_ns") != new_in["mtime_ns"]:
        old_time = _when(old_in["mtime_ns"]) if isinstance(old_in.get("mtime_ns"), int) else None
        changes.append(f"input modified: {old_time} → {_when(new_in['mtime_ns'])}")
    if old_in.get("head_sha256") != new_in["head_sha256"]:
        changes.append("input's first MiB: different content")
    for key in ("kind", "format", "text_field", "pair_field", "max_chars", "dtype", "dim",
                "world_size", "rank", "chunk_size", "rows"):
        if key == "chunk_size" and current["world_size"] == 1:
            continue  # one process works through the rows in order: any chunk size continues
        if key == "dim" and current.get("dim") is None:
            continue  # not given now: the partial output's own width is used
        if saved.get(key) != current.get(key):
            name = "usable rows" if key == "rows" else key
            changes.append(f"{name}: {saved.get(key)!r} → {current.get(key)!r}")
    old_set, new_set = saved.get("settings", {}), current["settings"]
    for key in sorted(set(old_set) | set(new_set)):
        if old_set.get(key, "(unset)") != new_set.get(key, "(unset)"):
            changes.append(f"{key}: {old_set.get(key, '(unset)')!r} → {new_set.get(key, '(unset)')!r}")
    return changes


# ---------------------------------------------------------------------------------------------
# running a file
# ---------------------------------------------------------------------------------------------
def run_file(input_path: str | os.PathLike, out_path: str | os.PathLike,
             process: Callable[[list[Record]], Sequence[Any] | np.ndarray], *,
             kind: str | None = None, dim: int | None = None, dtype: str = "float32",
             chunk_size: int = DEFAULT_CHUNK_SIZE, resume: bool = False, overwrite: bool = False,
             progress: bool = True, settings: dict[str, Any] | None = None, fmt: str = "auto",
             text_field: str = "text", pair_field: str | None = None,
             max_chars: int = DEFAULT_MAX_CHARS, distributed: Any = "auto",
             desc: str = "rows") -> dict[str, Any]:
    """Map every usable row of `input_path` through `process` into `out_path`, in input order.

    process: list of up to `chunk_size` Records → one result per record, in order: for kind
      "npy" an array-like (len(records), dim) (cast to `dtype`); for "jsonl" a sequence of dicts
      (written as {"line": source line, "id": the row's id if it has one, **result}) or of other
      JSON values (written as {"line": ..., "result": value}).
    kind: "npy" or "jsonl"; None = from the suffix of `out_path`.
    dim: the npy row width; None = measured by calling `process` on the first record once.
    resume: continue a killed run of the same input and settings (see the module docstring);
      with no partial run it starts from row 0, with a complete OUT it does nothing.
    overwrite: start over, removing an existing OUT and any partial run of it.
    settings: whatever must be equal for a resumed run to continue one output (model directory,
      its fingerprint, precision, pooling, ...); JSON-able values, compared key by key.
    fmt, text_field, pair_field, max_chars: reading, as `read_records`.
    distributed: "auto" (several ranks when WORLD_SIZE > 1, e.g. under torchrun), False, True, or
      a `bertkit.train.distributed.DistInfo` whose process group the caller already joined.
    Returns a summary: out, input, kind, rows (written), dim, skipped (count), problems
      {problem: count}, examples (first "file:line: what is wrong"), resumed_from (rows this rank
      had done before), processed (rows this rank computed now), seconds, rows_per_second,
      world_size, rank, already_complete.
    Raises FileExistsError for an existing OUT or partial run without resume / overwrite,
    ValueError for a partial run that does not match (naming what changed) or a `process` result
    of the wrong length or shape.
    """
    started = time.monotonic()
    input_path, out = Path(input_path), Path(out_path)
    kind = kind or {".npy": "npy", ".jsonl": "jsonl"}.get(out.suffix.lower())
    if kind not in KINDS:
        raise ValueError(f"cannot tell the output kind of {out} (suffix {out.suffix!r}); name it "
                         ".npy or .jsonl, or pass kind='npy' / 'jsonl'")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if dim is not None and dim <= 0:
        raise ValueError(f"dim must be positive, got {dim}")
    if resume and overwrite:
        raise ValueError("resume and overwrite exclude each other; pass one")
    if out.is_dir():
        raise IsADirectoryError(f"--out {out} is a directory; pass the path of the {kind} file to write")
    fmt = record_format(input_path, fmt)
    if not input_path.is_file():
        raise FileNotFoundError(f"no such input file: {input_path}")
    dtype = np.dtype(dtype).name
    reading = dict(fmt=fmt, text_field=text_field, pair_field=pair_field, max_chars=max_chars)
    files = OutputFiles(out)

    group = _join_group(distributed)
    decision = _on_rank0(group, lambda: _decide(files, resume, overwrite, group.world_size))
    if decision == "complete":
        return _complete_summary(input_path, out, kind, group, started)
    fingerprint = input_fingerprint(input_path)
    report = RecordReport(str(input_path), quiet=group.rank != 0)
    n_rows = _count_rows(input_path, report, reading, show=progress and group.rank == 0)
    current = {"version": STATE_VERSION, "input": fingerprint, "kind": kind, "format": fmt,
               "text_field": text_field, "pair_field": pair_field, "max_chars": max_chars,
               "dtype": dtype if kind == "npy" else None, "dim": dim if kind == "npy" else None,
               "world_size": group.world_size, "rank": group.rank, "chunk_size": chunk_size,
               "rows": n_rows, "settings": _plain(settings or {})}
    saved = _load_state(files.state(group.rank, group.world_size), current, out) \
        if decision == "resume" else None
    job = _Job(files, group, current, process, reading, input_path, saved)
    if kind == "npy":
        job.open_npy(resume=decision == "resume")
    else:
        job.open_jsonl()
    processed = job.run(progress, desc)
    job.finish()
    seconds = time.monotonic() - started
    if group.rank == 0:
        log.info("%s; wrote %s in %.1f s", report.summary(), out, seconds)
    return {"out": str(out), "input": str(input_path), "kind": kind, "rows": n_rows,
            "dim": job.current.get("dim"), "skipped": report.n_skipped,
            "problems": dict(sorted(report.problems.items())), "examples": report.messages[:5],
            "resumed_from": job.rows_done_before, "processed": processed,
            "seconds": round(seconds, 3),
            "rows_per_second": round(processed / seconds, 1) if seconds > 0 else None,
            "world_size": group.world_size, "rank": group.rank, "already_complete": False}


def _count_rows(path: Path, report: RecordReport, reading: dict[str, Any], show: bool) -> int:
    """The first pass: usable rows counted (bad ones reported), nothing kept. A bar shows that a
    big file is being read (no ETA: its row count is what this pass finds out)."""
    from tqdm.auto import tqdm

    n, step = 0, 1 << 16
    with tqdm(desc="counting rows", unit="rows", unit_scale=True, disable=not show, leave=False) as bar:
        for _ in read_records(path, report=report, **reading):
            n += 1
            if n % step == 0:
                bar.update(step)
    return n


def _decide(files: OutputFiles, resume: bool, overwrite: bool, world_size: int) -> str:
    """On rank 0: "fresh", "resume" or "complete", after refusing to mix runs."""
    out, leftovers = files.out, files.leftovers()
    out.parent.mkdir(parents=True, exist_ok=True)
    if overwrite:
        for path in ([out] if out.exists() else []) + leftovers:
            path.unlink()
        return "fresh"
    if resume:
        if out.exists():
            # A finished output with leftovers: killed between the final rename and the clean-up.
            for path in leftovers:
                path.unlink()
            log.info("%s is already complete; nothing to resume", out)
            return "complete"
        if not leftovers:
            log.info("no partial run of %s yet; starting from row 0", out)
            return "fresh"
        expected = {files.state(r, world_size) for r in range(world_size)}
        other = [p for p in files.states() if p not in expected]
        if other:
            raise ValueError(f"cannot resume {out}: the partial run used another number of processes "
                             f"({other[0].name}; this run has {world_size}). Resume it with the same "
                             "torchrun --nproc_per_node × --nnodes, or pass --overwrite to start over")
        return "resume"
    if out.exists():
        raise FileExistsError(f"--out {out} already exists; pass --overwrite to replace it or choose "
                              "another --out")
    if leftovers:
        names = ", ".join(p.name for p in leftovers[:3])
        raise FileExistsError(f"{out} has a partial run ({names}); pass --resume to continue it or "
                              "--overwrite to start over")
    return "fresh"


def _load_state(path: Path, current: dict[str, Any], out: Path) -> dict[str, Any] | None:
    """This rank's saved state when it matches `current`; None when it never committed a chunk."""
    if not path.exists():
        return None
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot resume {out}: its state file {path} is unreadable ({err}); pass "
                         "--overwrite to start over") from None
    if saved.get("version") != STATE_VERSION:
        raise ValueError(f"cannot resume {out}: {path} has state version {saved.get('version')!r}, "
                         f"this bertkit writes {STATE_VERSION}; pass --overwrite to start over")
    changes = _state_changes(saved, current)
    if changes:
        raise ValueError(f"cannot resume {out}: {'; '.join(changes)} (the partial run is described "
                         f"in {path}). Resume with the original input and settings, or pass "
                         "--overwrite to start over")
    return saved


@dataclass
class _Job:
    """One rank's share of a file: its chunks, its output handle and its state."""

    files: OutputFiles
    group: _Group
    current: dict[str, Any]  # what the state file holds, without the progress counters
    process: Callable[[list[Record]], Any]
    reading: dict[str, Any]
    input_path: Path
    saved: dict[str, Any] | None
    rows_done: int = 0  # rows of this rank's chunks already in the output
    chunks_done: int = 0
    offset: int = 0  # jsonl: bytes of this rank's file that hold committed rows
    rows_done_before: int = 0
    array: Any = None  # npy: the memory-mapped output
    handle: Any = None  # jsonl: this rank's open output file

    def __post_init__(self) -> None:
        if self.saved:
            self.rows_done = self.saved["rows_done"]
            self.chunks_done = self.saved["chunks_done"]
            self.offset = self.saved.get("offset", 0)
        self.rows_done_before = self.rows_done

    # -- the rows this rank computes -------------------------------------------------------------
    def chunks(self) -> list[tuple[int, int]]:
        """[lo, hi) row ranges still to do, in order. One process goes on from its last row (any
        chunk size); rank r of W does chunks r, r + W, ... after the ones it finished."""
        n, size, w, r = self.current["rows"], self.current["chunk_size"], \
            self.current["world_size"], self.current["rank"]
        if w == 1:
            return [(lo, min(lo + size, n)) for lo in range(self.rows_done, n, size)]
        n_chunks = math.ceil(n / size)
        return [(k * size, min((k + 1) * size, n)) for k in range(r + self.chunks_done * w, n_chunks, w)]

    def assigned_rows(self) -> int:
        """Rows of every chunk of this rank, done or not (the progress bar's total)."""
        n, size, w, r = self.current["rows"], self.current["chunk_size"], \
            self.current["world_size"], self.current["rank"]
        if w == 1:
            return n
        return sum(min((k + 1) * size, n) - k * size for k in range(r, math.ceil(n / size), w))

    # -- outputs ---------------------------------------------------------------------------------
    def open_npy(self, resume: bool) -> None:
        partial, n = self.files.partial, self.current["rows"]

        def create_or_check() -> int:
            any_state = bool(self.files.states())
            if resume and partial.exists():
                array = np.lib.format.open_memmap(partial, mode="r")
                shape, dtype = array.shape, array.dtype.name
                del array
                wanted = self.current["dim"] or (shape[1] if len(shape) == 2 else None)
                if shape == (n, wanted) and dtype == self.current["dtype"]:
                    return wanted
                if any_state:
                    raise ValueError(f"cannot resume {self.files.out}: {partial} holds {dtype} rows of "
                                     f"shape {shape}, this run writes ({n}, {wanted}) "
                                     f"{self.current['dtype']}; pass --overwrite to start over")
            elif resume and any_state:
                raise ValueError(f"cannot resume {self.files.out}: {partial} is missing, so the rows "
                                 "its state files count are lost; pass --overwrite to start over")
            dim = self.current["dim"] or self._probe_dim()
            # The header with the final shape goes first; rows are filled in place (zeros until then).
            np.lib.format.open_memmap(partial, mode="w+", dtype=self.current["dtype"],
                                      shape=(n, dim)).flush()
            for path in self.files.states():  # a state without rows behind it would lie
                path.unlink()
            return dim

        self.current["dim"] = _on_rank0(self.group, create_or_check)
        own_state = self.files.state(self.group.rank, self.group.world_size)
        if self.saved is not None and not own_state.exists():  # rank 0 started the file afresh
            self.saved, self.rows_done, self.chunks_done = None, 0, 0
            self.rows_done_before = 0
        if not partial.exists():
            raise FileNotFoundError(f"rank {self.group.rank} cannot see {partial}, which rank 0 created; "
                                    "--out must be on a file system that every node sees")
        self.array = np.lib.format.open_memmap(partial, mode="r+")

    def _probe_dim(self) -> int:
        first = next(iter(read_records(self.input_path, report=RecordReport("probe", quiet=True),
                                       **self.reading)))
        result = np.asarray(self.process([first]))
        if result.ndim != 2 or result.shape[0] != 1:
            raise ValueError(f"process returned shape {result.shape} for 1 record; for an .npy output "
                             "it must return (records, dim)")
        return int(result.shape[1])

    def open_jsonl(self) -> None:
        w, r = self.group.world_size, self.group.rank
        path = self.files.partial if w == 1 else self.files.part(r, w)
        if self.saved is None:
            self.handle = open(path, "wb")  # from row 0: whatever a previous attempt left goes
            return
        size = path.stat().st_size if path.exists() else -1
        if size < self.offset:
            raise ValueError(f"cannot resume {self.files.out}: {path} holds {max(size, 0)} bytes but its "
                             f"state counts {self.offset}; pass --overwrite to start over")
        self.handle = open(path, "r+b")
        self.handle.truncate(self.offset)  # drop rows written after the last committed state
        self.handle.seek(self.offset)

    # -- the loop --------------------------------------------------------------------------------
    def run(self, progress: bool, desc: str) -> int:
        """Compute this rank's remaining chunks; returns the number of rows computed."""
        from tqdm.auto import tqdm

        todo = self.chunks()
        w = self.group.world_size
        label = desc if w == 1 else f"{desc} (rank 0 of {w})"
        # Rate and ETA over this rank's rows (ranks share the work evenly, so rank 0's is the job's).
        bar = tqdm(total=self.assigned_rows(), initial=self.rows_done, unit="rows", unit_scale=True,
                   desc=label, disable=not progress or self.group.rank != 0, dynamic_ncols=True,
                   smoothing=0.05)
        processed, records = 0, None
        try:
            if todo and self.rows_done:
                log.info("resuming %s: %d of this process's %d rows already done", self.files.out,
                         self.rows_done, self.assigned_rows())
            if todo:
                # Bad rows were reported by the counting pass; this pass only skips them again.
                records = read_records(self.input_path, report=RecordReport("again", quiet=True),
                                       **self.reading)
            index, chunk = -1, []
            for lo, hi in todo:
                for index, record in zip(range(index + 1, hi), records):
                    if index >= lo:  # rows before lo are other ranks' or already done
                        chunk.append(record)
                if len(chunk) != hi - lo:
                    raise ValueError(f"{self.input_path} changed while it was read: fewer usable "
                                     f"rows than the {self.current['rows']} counted first")
                self._write(lo, chunk, self.process(chunk))
                processed += len(chunk)
                bar.update(len(chunk))
                chunk = []
        finally:
            if records is not None:
                records.close()
            bar.close()
            self._close()
        return processed

    def _write(self, lo: int, chunk: list[Record], results: Any) -> None:
        """Put one chunk's results on disk, then commit the state that counts them."""
        if self.array is not None:
            values = np.asarray(results)
            wanted = (len(chunk), self.array.shape[1])
            if values.shape != wanted:
                raise ValueError(f"process returned an array of shape {values.shape} for "
                                 f"{len(chunk)} records; expected {wanted}")
            self.array[lo:lo + len(chunk)] = values
            self._flush_rows(lo, lo + len(chunk))
        else:
            if not hasattr(results, "__len__"):  # a generator
                results = list(results)
            if len(results) != len(chunk):
                raise ValueError(f"process returned {len(results)} results for {len(chunk)} records; "
                                 "it must return one per record, in order")
            lines = []
            for record, result in zip(chunk, results):
                obj: dict[str, Any] = {"line": record.line}
                if "id" in record.extra:
                    obj["id"] = record.extra["id"]
                if isinstance(result, dict):
                    if "line" in result:
                        raise ValueError("process returned a result with a 'line' key, which the "
                                         "output reserves for the source line; rename it")
                    obj.update(result)
                else:
                    obj["result"] = result
                lines.append(json.dumps(obj, ensure_ascii=False, default=_json_default) + "\n")
            self.handle.write("".join(lines).encode("utf-8"))
            self.handle.flush()
            os.fsync(self.handle.fileno())  # the rows are on disk before the state that counts them
            self.offset = self.handle.tell()
        self.rows_done += len(chunk)
        self.chunks_done += 1
        atomic_write_json(self.files.state(self.group.rank, self.group.world_size),
                          {**self.current, "rows_done": self.rows_done,
                           "chunks_done": self.chunks_done, "offset": self.offset})

    def _flush_rows(self, lo: int, hi: int) -> None:
        """Write rows [lo, hi) of the memory map to disk. Only their pages: `memmap.flush()` syncs
        the whole mapping, whose cost grows with the file (millions of rows), not with the chunk."""
        base = getattr(self.array, "_mmap", None)  # numpy's mmap.mmap under the array
        if base is None:
            self.array.flush()
            return
        row_bytes = self.array.strides[0]
        # np.memmap maps the file from `start` (its offset rounded down to the allocation
        # granularity); flush offsets are within the mapping and must be page-aligned.
        start = self.array.offset - self.array.offset % mmap.ALLOCATIONGRANULARITY
        first = self.array.offset - start + lo * row_bytes
        aligned = first - first % mmap.PAGESIZE
        base.flush(aligned, first - aligned + (hi - lo) * row_bytes)

    def _close(self) -> None:
        if self.handle is not None:
            self.handle.close()
        if self.array is not None:
            self.array.flush()
            self.array = None  # unmaps

    # -- the end ---------------------------------------------------------------------------------
    def finish(self) -> None:
        """When every rank is done: (merge the parts,) rename the output into place, clean up."""
        self.group.barrier()

        def finalize() -> None:
            files, w = self.files, self.group.world_size
            if self.current["kind"] == "jsonl" and w > 1:
                self._merge_parts()
            os.replace(files.partial, files.out)
            # After the rename: a kill in between leaves a complete OUT whose leftovers the next
            # --resume removes, never a lost output.
            for path in files.leftovers():
                path.unlink()

        _on_rank0(self.group, finalize)

    def _merge_parts(self) -> None:
        """Rank 0: the ranks' part files → OUT.partial in input order (chunk k is in part k mod W)."""
        n, size, w = self.current["rows"], self.current["chunk_size"], self.group.world_size
        parts = [open(self.files.part(r, w), "rb") for r in range(w)]
        try:
            with open(self.files.partial, "wb") as merged:
                for k in range(math.ceil(n / size)):
                    source = parts[k % w]
                    for _ in range(min(size, n - k * size)):
                        line = source.readline()
                        if not line.endswith(b"\n"):
                            raise ValueError(f"{self.files.part(k % w, w)} ends early at chunk {k}; "
                                             "pass --overwrite to start over")
                        merged.write(line)
                merged.flush()
                os.fsync(merged.fileno())
        finally:
            for part in parts:
                part.close()


def _complete_summary(input_path: Path, out: Path, kind: str, group: _Group,
                      started: float) -> dict[str, Any]:
    """The summary of a run that `resume` found already finished."""
    if kind == "npy":
        shape = np.load(out, mmap_mode="r").shape
        rows, dim = shape[0], (shape[1] if len(shape) == 2 else None)
    else:
        with open(out, "rb") as f:
            rows, dim = sum(1 for _ in f), None
    return {"out": str(out), "input": str(input_path), "kind": kind, "rows": rows, "dim": dim,
            "skipped": None, "problems": {}, "examples": [], "resumed_from": rows, "processed": 0,
            "seconds": round(time.monotonic() - started, 3), "rows_per_second": None,
            "world_size": group.world_size, "rank": group.rank, "already_complete": True}
