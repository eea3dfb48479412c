"""An index's text side: its documents, its passages, and the passage → document map.

  docs.jsonl       {"id", "text"} of document i on line i
  offsets.npy      (D + 1,) int64 byte offsets of docs.jsonl's lines (one document read alone)
  passages.jsonl   the passages as `bertkit embed`-style records ({"text", "doc", "start", "end",
                   and for late chunking "t0", "t1", "w0", "w1"}): the input the vectors are
                   streamed from, so a killed build resumes on it
  passages.npy     (P, 3) int64: document row, character start, character end of passage i

Both files are rebuilt from the corpus on every start of a build (one pass, small next to the
model's work) and are byte-identical for the same corpus, tokenizer and passage settings, which
is what lets the vector stream resume.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from bertkit.util.fileio import atomic_path

DOCS_FILE = "docs.jsonl"
OFFSETS_FILE = "offsets.npy"
PASSAGES_FILE = "passages.jsonl"
PASSAGE_MAP_FILE = "passages.npy"
_BLOCK = 256  # documents tokenized together


def write_store(records: Iterable[Any], out: Path, id_field: str,
                split: Callable[[Sequence[str]], list[list[dict[str, Any]]]], *,
                resume: bool = False) -> tuple[int, int]:
    """docs.jsonl, offsets.npy, passages.jsonl and passages.npy from the corpus records, atomically.

    split: texts → each text's passages as dicts with "start", "end" (and any late-chunking
    spans); records: `read_records` Records. resume: an existing passages.jsonl must come out
    the same (the vectors done so far are its rows). Returns (documents, passages).
    """
    offsets, spans = [0], []
    seen: dict[str, int] = {}
    pass_tmp = out / (PASSAGES_FILE + ".new")
    try:
        _write(records, out, id_field, split, offsets, spans, seen, pass_tmp)
    except BaseException:
        pass_tmp.unlink(missing_ok=True)
        raise
    if not keep_if_same(pass_tmp, out / PASSAGES_FILE, must_match=resume):
        raise ValueError(f"cannot resume {out}: its passages differ from the ones this corpus, tokenizer "
                         "and passage settings give; resume with the original ones, or pass --overwrite")
    save_npy(out / OFFSETS_FILE, np.asarray(offsets, dtype=np.int64))
    save_npy(out / PASSAGE_MAP_FILE, np.asarray(spans, dtype=np.int64).reshape(-1, 3))
    return len(offsets) - 1, len(spans)


def _write(records, out, id_field, split, offsets, spans, seen, pass_tmp) -> None:
    with atomic_path(out / DOCS_FILE) as docs_tmp:
        with open(docs_tmp, "wb") as docs, open(pass_tmp, "wb") as passages:
            block: list[tuple[str, str]] = []

            def flush() -> None:
                for (doc_id, text), parts in zip(block, split([t for _, t in block])):
                    row = len(offsets) - 1
                    line = (json.dumps({"id": doc_id, "text": text}, ensure_ascii=False) + "\n").encode()
                    docs.write(line)
                    offsets.append(offsets[-1] + len(line))
                    for part in parts:
                        spans.append((row, part["start"], part["end"]))
                        passages.write((json.dumps({"text": text[part["start"]:part["end"]], "doc": row, **part},
                                                   ensure_ascii=False) + "\n").encode())
                block.clear()

            for record in records:
                raw_id = record.extra.get(id_field)
                doc_id = str(raw_id) if raw_id is not None else str(record.line)
                if doc_id in seen:
                    raise ValueError(f"{out}: document id {doc_id!r} appears twice (lines "
                                     f"{seen[doc_id]} and {record.line}); ids must be unique")
                seen[doc_id] = record.line
                block.append((doc_id, record.text))
                if len(block) == _BLOCK:
                    flush()
            flush()


def keep_if_same(new: Path, path: Path, *, must_match: bool = False) -> bool:
    """Move `new` onto `path`, unless `path` already holds the same bytes: then it is left as it
    was (its modification time too, which a resumed vector stream checks). must_match: an
    existing, different `path` is kept and False returned."""
    import filecmp

    if path.is_file() and filecmp.cmp(new, path, shallow=False):
        new.unlink()
    elif path.is_file() and must_match:
        new.unlink()
        return False
    else:
        os.replace(new, path)
    return True


def save_npy(path: Path, array: np.ndarray) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:  # a file object: np.save would append ".npy" to the temp name
            np.save(f, array, allow_pickle=False)


def read_lines(path: Path, offsets: np.ndarray, rows: Sequence[int]) -> list[dict[str, Any]]:
    """The JSON lines `rows` of a file whose line i spans bytes offsets[i]..offsets[i + 1]."""
    with open(path, "rb") as f:
        out = []
        for i in rows:
            f.seek(int(offsets[i]))
            out.append(json.loads(f.read(int(offsets[i + 1] - offsets[i]))))
        return out
