"""What a file job keeps beside its output so that a killed run resumes exactly.

The output is built under `OUT.partial` and renamed to OUT when complete. Next to it a small state
file per rank, `OUT.progress.json` (or `OUT.progress-rank{r}-of-{W}.json`, atomic writes), records
the rows done, the committed byte length of a jsonl output, the input's size, mtime and a hash of
its first MiB (`input_fingerprint`), the reading options and the caller's settings. `decide`
refuses to mix runs; `load_state` refuses to resume one whose input or settings changed, naming
what changed.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

HEAD_BYTES = 1 << 20  # the input's first MiB is hashed: a rewritten file is caught, cheaply
STATE_VERSION = 1


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


def plain(value: Any) -> Any:
    """`value` as JSON would give it back (tuples → lists, Paths → strings), for comparisons."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


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
    for key in ("kind", "format", "text_field", "pair_field", "words_field", "max_chars", "dtype", "dim",
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


def decide(files: OutputFiles, resume: bool, overwrite: bool, world_size: int) -> str:
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


def load_state(path: Path, current: dict[str, Any], out: Path) -> dict[str, Any] | None:
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
