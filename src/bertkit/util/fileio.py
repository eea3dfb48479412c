"""Atomic file writes: a temp file in the target's directory, then a rename.

A crash mid-write leaves either the old file or none, never a truncated one that later loads.
`remove_outputs` deletes what a command wrote, and only that, when it is told to start over.
`check_writable_output` is the one pre-flight check of an output location that every command
calls before it starts work, so a bad --out fails in a second, not after the work is done.
`cache_dir` is where bertkit keeps what it measures or compiles once per machine.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

CACHE_ENV = "BERTKIT_CACHE_DIR"


def cache_dir() -> Path:
    """Where bertkit keeps what it computes once per machine (compiled int8 kernels, the precision
    probe's rates): `$BERTKIT_CACHE_DIR`, else `$XDG_CACHE_HOME/bertkit`, else `~/.cache/bertkit`.
    Deleting it loses nothing but time."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "bertkit"


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside `path`; on success it is renamed onto `path`, on error removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    mode = 0o666 & ~_umask()
    os.chmod(tmp, mode)  # mkstemp makes 0600; give the file a normal file's mode
    try:
        yield Path(tmp)
        # Again after the write: a writer that replaces the file (safetensors' save_file does)
        # leaves a new file of mode 0600, which another user could not read.
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def atomic_write_json(path: str | os.PathLike, value: Any) -> None:
    atomic_write_text(path, json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def remove_outputs(directory: str | os.PathLike, names: Iterable[str]) -> None:
    """Delete the files or directories `names` inside `directory` where they exist; nothing else."""
    for name in names:
        path = Path(directory) / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def check_writable_output(path: str | os.PathLike, *, overwrite: bool | None, kind: str = "file",
                          outputs: Iterable[str] | None = None, flag: str = "--out") -> Path:
    """Fail now, before any work, if `path` cannot take a command's output; returns it as a Path.

    kind: "file" (the output is `path` itself) or "dir" (a directory the command fills).
    overwrite: False → an existing output is a FileExistsError; True → it may be replaced; None →
      not checked here (the caller decides, e.g. `--resume` or reusing a finished run).
    outputs: kind "dir" only: the names inside `path` that count as an existing output (the files
      the command writes); None → any entry makes the directory an existing output.
    Raises NotADirectoryError (a file where a directory is needed, or on the way to it),
    IsADirectoryError (a directory where the output file goes), FileExistsError, or ValueError
    when the location cannot be written (permissions, read-only file system), each naming the
    path and the fix. Creates nothing: writability is probed with a temp file in the nearest
    existing directory, removed at once.
    """
    if kind not in ("file", "dir"):
        raise ValueError(f"kind must be 'file' or 'dir', got {kind!r}")
    path = Path(path)
    if kind == "file" and path.is_dir():
        raise IsADirectoryError(f"{flag} {path} is a directory; pass the path of a file to write")
    if kind == "dir" and path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{flag} {path} is a file, not a directory; choose another {flag}")
    # The nearest existing directory on the way: where the first new entry would be created.
    existing = path if kind == "dir" else path.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise NotADirectoryError(f"cannot create {flag} {path}: {existing} is a file, not a "
                                 f"directory; choose another {flag}")
    if overwrite is False:
        if kind == "file" and path.exists():
            raise FileExistsError(f"{flag} {path} already exists; pass --overwrite to replace it "
                                  f"or choose another {flag}")
        if kind == "dir" and path.is_dir():
            names = list(outputs) if outputs is not None else sorted(p.name for p in path.iterdir())
            found = [name for name in names if (path / name).exists()]
            if found:
                shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
                raise FileExistsError(f"{flag} {path} already holds {shown}; pass --overwrite to "
                                      f"replace them or choose another {flag}")
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".bertkit-write-test.", suffix=".tmp")
    except OSError as err:
        reason = err.strerror or str(err)
        raise ValueError(f"cannot write {path}: {reason} (in {existing}); choose another "
                         f"{flag}") from None
    os.close(fd)
    os.unlink(probe)
    if kind == "file" and path.exists() and not os.access(path, os.W_OK):
        # The rename of an atomic write would replace it anyway; say so rather than surprise.
        raise ValueError(f"cannot write {path}: it is read-only; make it writable or choose "
                         f"another {flag}")
    return path


def missing_model_dir(spec: str | os.PathLike, what: str = "model directory") -> str:
    """The message for a model / tokenizer location that is not on disk.

    Names like `bert-base-uncased` or `org/name` are Hub ids that other tools download; say that
    bertkit never does, and what to pass instead.
    """
    return (f"{what} {spec} is not a local directory (it does not exist); bertkit never downloads: "
            "pass a local model directory (e.g. one saved by transformers' save_pretrained)")


def model_directory(spec: str | os.PathLike, what: str = "model") -> Path:
    """`spec` as the Path of a model directory (one holding config.json), or an error that says
    what it is instead and what to pass.

    what: how the caller names the location in messages ("--model", "--teacher", ...).
    Raises FileNotFoundError for a path that is not there (`missing_model_dir`) or a directory
    without config.json, NotADirectoryError for a file (its folder named when that is a model
    directory, as for a config.json or a weights file passed by mistake).
    """
    path = Path(spec)
    if not path.exists():
        raise FileNotFoundError(missing_model_dir(spec, what))
    if not path.is_dir():
        hint = (f"; pass its folder {path.parent}" if (path.parent / "config.json").is_file() else
                "; pass the directory that holds config.json, the weights and the vocabulary")
        raise NotADirectoryError(f"{what} {spec} is a file, not a model directory{hint}")
    if not (path / "config.json").is_file():
        if (path / "adapter_config.json").is_file():  # an adapter where this command needs a whole model
            raise FileNotFoundError(f"{what} {spec} is a LoRA adapter directory, not a whole model; this needs "
                                    "a model directory: save the adapter merged (finetune --lora-save merged)")
        raise FileNotFoundError(f"{what} {spec} is not a model directory (it has no config.json); pass "
                                "a directory saved by bertkit or by transformers' save_pretrained")
    return path


@contextmanager
def staged_directory(out: str | os.PathLike) -> Iterator[Path]:
    """A work directory beside `out` to fill; when the block ends without an error it becomes
    `out` (renamed there when out is new or empty, else each of its entries replaces the same name
    in out, by a rename), and on any error it is removed and out is left as it was."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    work.chmod(0o777 & ~_umask())  # mkdtemp's 0700 would follow the rename: a normal directory's mode
    try:
        yield work
        if not out.exists() or (out.is_dir() and not any(out.iterdir())):
            if out.exists():
                out.rmdir()
            os.replace(work, out)
            return
        for entry in work.iterdir():
            target = out / entry.name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
            os.replace(entry, target)
        work.rmdir()
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
