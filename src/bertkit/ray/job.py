"""A file of any size embedded on a Ray cluster into Parquet shards, resumable shard by shard.

    OUT/manifest.json         the job: input fingerprint, model, settings, rows per shard; "complete"
    OUT/part-000000.parquet   rows [0, chunk_size) of the usable input rows: `line`, `embedding`
    OUT/part-000001.parquet   ...

The driver reads the input once with the file job's reader (`read_records`: bad rows named with
file:line, counted and skipped), cuts the usable rows into chunks of `chunk_size` and writes each
as an input chunk (OUT/.input/, Parquet of `line` and `text`), then the manifest. A Ray Data
pipeline of chunk numbers runs `ShardWriter` on an actor pool (one engine per actor, loaded once,
`num_cpus` = its threads): an actor reads input chunk k, embeds it with `Embedder` and writes
shard k under a temporary name, renamed when complete. So a shard on disk is always whole, and
its presence is the record that chunk k is done: a run killed anywhere (a worker, the driver) and
run again with the same input and settings computes only the shards that are missing. When every
shard is there the manifest says "complete" and the input chunks are removed.

Row r of shard k is usable row k·chunk_size + r of the input, as row k·chunk_size + r of the
single-process job's output (`bertkit embed --input … --out X.npy`), with the same vector
(each chunk runs through `embed` on the same engine settings).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

from bertkit.inference.columns import Embedder
from bertkit.inference.files.records import DEFAULT_MAX_CHARS, RecordReport, read_records
from bertkit.inference.files.state import input_fingerprint, plain
from bertkit.util.fileio import atomic_path, atomic_write_json

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
INPUTS = ".input"  # the input chunks, while the job is not complete
MANIFEST_VERSION = 1
# Rows per shard: ~15 MB of float32 vectors at 384 dimensions, a few seconds of an actor's work,
# so a killed worker loses little and 100M rows are ~10,000 files, not millions.
DEFAULT_CHUNK_SIZE = 10_000


def need_ray() -> None:
    """Ray Data (and pyarrow), or an error with the line that installs them."""
    for module in ("ray", "pyarrow"):
        if importlib.util.find_spec(module) is None:
            raise ValueError(f"--ray needs Ray Data ({module} is not installed): pip install 'bertkit[ray]'")


def shard_name(k: int) -> str:
    return f"part-{k:06d}.parquet"


def check_reachable(address: str | None, timeout: float = 5.0) -> None:
    """A HOST:PORT address (ray://HOST:PORT too) that takes no TCP connection is one error naming
    it, at once: ray.init itself retries an unreachable cluster for minutes."""
    if not address or address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--ray {address}: not a Ray address; give HOST:PORT (the head's GCS port, 6379 "
                         "unless `ray start --head --port` said otherwise) or ray://HOST:PORT")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as err:
        raise ConnectionError(f"cannot reach a Ray cluster at {address} ({err.strerror or err}); start one "
                              "there (`ray start --head`) or pass its address as --ray HOST:PORT") from None


def connect(address: str | None) -> None:
    """ray.init on `address` (None: the cluster this machine runs, else a new local one)."""
    import ray

    check_reachable(address)
    try:
        ray.init(address=address or None, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.WARNING, configure_logging=False)
    except (ConnectionError, RuntimeError, TimeoutError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConnectionError(f"cannot reach a Ray cluster at {address}: {first}; start one there "
                              "(`ray start --head`) or pass its address as --ray HOST:PORT") from None


class ShardWriter:
    """A Ray Data map_batches class over chunk numbers: embeds input chunk k into shard k."""

    def __init__(self, out_dir: str, embedder: Embedder):
        self.out_dir, self.embedder = Path(out_dir), embedder

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = []
        for k in batch["chunk"].tolist():
            chunk = pq.read_table(self.out_dir / INPUTS / shard_name(k))
            vectors = self.embedder.compute(chunk.column("text").to_pylist())  # (n, H) float32
            embedding = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), vectors.shape[1])
            with atomic_path(self.out_dir / shard_name(k)) as tmp:
                pq.write_table(pa.table({"line": chunk.column("line"), "embedding": embedding}), tmp)
            rows.append(len(vectors))
        return {"chunk": batch["chunk"], "rows": np.array(rows)}


def embed_on_ray(model_dir: str | os.PathLike, input_path: str | os.PathLike, out_dir: str | os.PathLike, *,
                 address: str | None = None, actors: int = 2, actor_cpus: int = 1,
                 chunk_size: int = DEFAULT_CHUNK_SIZE, overwrite: bool = False, fmt: str = "auto",
                 text_field: str = "text", max_chars: int = DEFAULT_MAX_CHARS,
                 engine_options: dict[str, Any] | None = None, **options: Any) -> dict[str, Any]:
    """Embed every usable row of `input_path` into Parquet shards under `out_dir` on Ray (see the
    module docstring). A rerun of the same job writes only the missing shards.

    address: a Ray cluster (HOST:PORT, "auto"); None: the one this machine runs, else a local one.
    actors: the actor pool's size; actor_cpus: each actor's num_cpus, hence its torch threads.
    engine_options: Engine.load's (precision, max_batch_tokens, max_length, truncate, device);
    options: embed's (pooling, normalize, prompt, truncate_dim).
    Returns: out, rows, dim, shards, written (shards computed now), done_before, skipped,
    problems, seconds, already_complete.
    Raises FileExistsError when `out_dir` holds another job (without `overwrite`) or files that
    are not a job's; ConnectionError for an unreachable `address`.
    """
    started = time.monotonic()
    need_ray()
    for name, value in (("actors", actors), ("actor_cpus", actor_cpus), ("chunk_size", chunk_size)):
        if value < 1:
            raise ValueError(f"--ray-{name.replace('_', '-')} must be at least 1, got {value}")
    model_dir, input_path, out = Path(model_dir).resolve(), Path(input_path), Path(out_dir)
    if not input_path.is_file():
        raise FileNotFoundError(f"no such input file: {input_path}")
    check_reachable(address)  # before reading the input: a wrong address is told at once
    engine_options = {k: v for k, v in (engine_options or {}).items() if v is not None}
    job = plain({"version": MANIFEST_VERSION, "input": input_fingerprint(input_path), "model": str(model_dir),
                 "format": fmt, "text_field": text_field, "max_chars": max_chars, "chunk_size": chunk_size,
                 "engine": engine_options, "embed": options})
    manifest = _existing_manifest(out, job, overwrite)
    if manifest is not None and manifest.get("complete"):
        return _summary(out, manifest, 0, started, already_complete=True)
    if manifest is None:
        manifest = _split(input_path, out, job, fmt=fmt, text_field=text_field, max_chars=max_chars)
    missing = [k for k in range(manifest["shards"]) if not (out / shard_name(k)).is_file()]
    if missing:
        _run(out, missing, Embedder(model_dir, threads=actor_cpus, **engine_options, **options),
             address, actors, actor_cpus)
    absent = [k for k in range(manifest["shards"]) if not (out / shard_name(k)).is_file()]
    if absent:
        raise RuntimeError(f"{len(absent)} shards were not written ({shard_name(absent[0])} first); run again "
                           "to compute them")
    manifest["complete"] = True
    atomic_write_json(out / MANIFEST, manifest)
    shutil.rmtree(out / INPUTS, ignore_errors=True)
    for leftover in out.glob(".part-*.tmp"):  # the temporary shards of killed writers
        leftover.unlink()
    return _summary(out, manifest, len(missing), started)


def _existing_manifest(out: Path, job: dict[str, Any], overwrite: bool) -> dict[str, Any] | None:
    """This job's manifest in `out`, or None to start afresh (removing our files when `overwrite`)."""
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {out} is a file; the Ray job writes a directory of Parquet shards")
    if not out.is_dir():
        return None
    path = out / MANIFEST
    if path.is_file():
        manifest = json.loads(path.read_text())
        if manifest.get("job") == job and not overwrite:
            return manifest
        if not overwrite:
            differs = sorted(k for k in set(job) | set(manifest.get("job", {}))
                             if manifest.get("job", {}).get(k) != job.get(k))
            raise FileExistsError(f"{path} is another job's (its {', '.join(differs)} differ); pass "
                                  "--overwrite to replace it, or choose another --out")
    elif any(p.name != INPUTS and not (p.name.startswith(".") and p.name.endswith(".tmp")) for p in out.iterdir()):
        raise FileExistsError(f"--out {out} holds files and no {MANIFEST}; the Ray job writes into a new or "
                              "empty directory, so choose another --out")
    for p in [*out.glob("part-*.parquet"), *out.glob(".*.tmp")]:  # ours only: shards, temporaries, inputs
        p.unlink()
    shutil.rmtree(out / INPUTS, ignore_errors=True)
    path.unlink(missing_ok=True)
    return None


def _split(input_path: Path, out: Path, job: dict[str, Any], **reading: Any) -> dict[str, Any]:
    """Input chunk files of `chunk_size` usable rows (bad rows reported), then the manifest."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    inputs = out / INPUTS
    inputs.mkdir(parents=True, exist_ok=True)
    report = RecordReport(str(input_path))
    size, k, rows, lines, texts = job["chunk_size"], 0, 0, [], []

    def flush() -> None:
        nonlocal k
        with atomic_path(inputs / shard_name(k)) as tmp:
            pq.write_table(pa.table({"line": pa.array(lines, pa.int64()), "text": pa.array(texts, pa.string())}),
                           tmp)
        k += 1
        lines.clear()
        texts.clear()

    for record in read_records(input_path, report=report, **reading):
        lines.append(record.line)
        texts.append(record.text)
        rows += 1
        if len(lines) == size:
            flush()
    if lines:
        flush()
    log.info("%s", report.summary())
    manifest = {"job": job, "rows": rows, "shards": k, "skipped": report.n_skipped,
                "problems": dict(sorted(report.problems.items())), "examples": report.messages[:5],
                "complete": False}
    atomic_write_json(out / MANIFEST, manifest)
    return manifest


def _run(out: Path, missing: list[int], embedder: Embedder, address: str | None, actors: int,
         actor_cpus: int) -> None:
    """The missing shards, written by a pool of `actors` ShardWriters on the cluster."""
    import ray

    connect(address)
    try:
        ray.data.DataContext.get_current().enable_progress_bars = False
        chunks = ray.data.from_items([{"chunk": k} for k in missing], override_num_blocks=len(missing))
        written = chunks.map_batches(ShardWriter, fn_constructor_args=(str(out), embedder), batch_size=1,
                                     compute=ray.data.ActorPoolStrategy(size=min(actors, len(missing))),
                                     num_cpus=actor_cpus)
        for row in written.iter_rows():
            log.info("shard %s: %d rows", row["chunk"], row["rows"])
    except ray.exceptions.RayError as err:  # an actor that died past Ray's retries, a lost node, ...
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise RuntimeError(f"the Ray job stopped ({type(err).__name__}: {first}); the shards written so far "
                           f"are kept in {out}: run the same command again to compute the rest") from err
    finally:
        ray.shutdown()


def _summary(out: Path, manifest: dict[str, Any], written: int, started: float, *,
             already_complete: bool = False) -> dict[str, Any]:
    import pyarrow.parquet as pq

    first = out / shard_name(0)
    dim = pq.read_schema(first).field("embedding").type.list_size if first.is_file() else None
    return {"out": str(out), "rows": manifest["rows"], "dim": dim, "shards": manifest["shards"],
            "written": written, "done_before": manifest["shards"] - written, "skipped": manifest["skipped"],
            "problems": manifest["problems"],
            "examples": manifest["examples"], "seconds": round(time.monotonic() - started, 3),
            "already_complete": already_complete}


def read_shards(out_dir: str | os.PathLike) -> tuple[list[int], Any]:
    """A complete job's rows in input order: (source lines, (N, dim) float32 array)."""
    import numpy as np
    import pyarrow.parquet as pq

    out = Path(out_dir)
    manifest = json.loads((out / MANIFEST).read_text())
    if not manifest.get("complete"):
        raise ValueError(f"{out} holds an unfinished Ray job; run it again to complete it")
    lines: list[int] = []
    vectors = []
    for k in range(manifest["shards"]):
        table = pq.read_table(out / shard_name(k))
        lines.extend(table.column("line").to_pylist())
        column = table.column("embedding").combine_chunks()
        vectors.append(column.values.to_numpy().reshape(len(table), column.type.list_size))
    return lines, np.concatenate(vectors) if vectors else np.zeros((0, 0), np.float32)
