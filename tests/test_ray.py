"""bertkit on Ray: the batch classes inside `map_batches`, and `bertkit embed --ray` on a local
cluster started by the test (`ray start --head`, 2 CPUs, on 127.0.0.1, torn down by its process
group), whose shards equal the single-process job's vectors (≤ 1e-6, row for row by `line`), and
which, killed (the driver, then a worker) and run again, completes only the missing shards.
Skips, saying so, where Ray is not installed (`pip install 'bertkit[ray]'`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install 'bertkit[ray]'): the Ray tests cannot run")
pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install 'bertkit[ray]')")

from bertkit import cli  # noqa: E402
from bertkit.inference import Engine  # noqa: E402
from bertkit.inference.jobs import run_use_on_file  # noqa: E402
from bertkit.ray import embed_on_ray, read_shards  # noqa: E402

from sigkill import kill_when  # noqa: E402
from web_fixtures import free_port, wait_until_up  # noqa: E402

ROWS, CHUNK = 600, 10  # 60 shards: a kill lands with shards done and shards to do
WAIT = 240.0  # seconds: the bound on each run and on the cluster's start
# The cluster and its drivers on loopback without Ray's token authentication (on by default since
# Ray 2.5x; the token file would live in the user's home, outside the test's tmp_path).
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
SENTENCES = ["A man is playing a guitar.", "Stocks fell.", "Paris is the capital of France.",
             "The central bank raised interest rates by a quarter of a point.", "Someone plays an instrument."]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """ROWS texts as JSON Lines, with one bad row (named and skipped, as the file job does)."""
    path = tmp_path_factory.mktemp("ray") / "texts.jsonl"
    rows = [json.dumps({"text": f"{SENTENCES[i % len(SENTENCES)]} ({i})"}) for i in range(ROWS)]
    rows.insert(7, "{not json")
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.fixture(scope="module")
def single(minilm_dir, corpus, tmp_path_factory) -> np.ndarray:
    """The single-process job's vectors (`bertkit embed --input … --out X.npy`)."""
    out = tmp_path_factory.mktemp("single") / "vectors.npy"
    run_use_on_file("embed", Engine.load(minilm_dir, use="embed"), corpus, out, progress=False)
    return np.load(out)


def usable_lines(corpus: Path) -> list[int]:
    return [i for i, line in enumerate(corpus.read_text().splitlines(), 1) if line.startswith("{\"")]


@dataclass(frozen=True)
class Cluster:
    address: str
    pid: int  # of `ray start --block`: the cluster's processes are under it


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A Ray head on 127.0.0.1 with 2 CPUs, in a process group of its own."""
    port = free_port()
    temp = tempfile.mkdtemp(prefix="bkray-", dir="/tmp")  # short: Ray's socket paths live under it
    ray = Path(sys.executable).parent / "ray"
    proc = subprocess.Popen([str(ray), "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
                             "--port", str(port), "--num-cpus", "2", "--include-dashboard", "false",
                             "--disable-usage-stats", "--temp-dir", temp],
                            stdout=subprocess.DEVNULL, stderr=(log := open(Path(temp) / "start.log", "w")),
                            start_new_session=True, env={**os.environ, **RAY_ENV})
    address = f"127.0.0.1:{port}"
    try:
        wait_until_up(proc, lambda: socket.create_connection(("127.0.0.1", port), timeout=1).close() is None,
                      "the Ray head", WAIT, (Path(temp) / "start.log").read_text)
        yield Cluster(address, proc.pid)
    finally:
        # every process of the cluster is in the group (gcs, raylet, agents, actors): a throwaway
        # cluster is stopped at once, not by `ray stop` (which would stop every Ray on the machine)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        log.close()
        for _ in range(50):  # the killed processes' last writes may land after a first removal
            shutil.rmtree(temp, ignore_errors=True)
            if not os.path.exists(temp):
                break
            time.sleep(0.2)


def command(minilm_dir: Path, corpus: Path, out: Path, address: str) -> list[str]:
    return [sys.executable, "-m", "bertkit.cli", "embed", str(minilm_dir), "--input", str(corpus), "--out",
            str(out), "--ray", address, "--ray-actors", "2", "--ray-chunk-size", str(CHUNK), "--no-progress"]


def run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=WAIT, env={**os.environ, **RAY_ENV})


def shards(out: Path) -> int:
    return len(list(out.glob("part-*.parquet")))


def descendants(root: int) -> list[int]:
    """The processes under `root` (by parent id, from /proc)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    found, frontier = [], [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        found += children
        frontier += children
    return found


def map_workers(head_pid: int) -> list[int]:
    """The actor processes of our cluster that run ShardWriter (Ray names them in their title)."""
    out = []
    for pid in descendants(head_pid):
        with contextlib.suppress(OSError):
            if b"ShardWriter" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
    return out


def documented_example() -> str:
    """The Ray Data example of docs/scaling.md: the first ```python block of its Ray section."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "scaling.md").read_text()
    section = page.split("## Ray Data", 1)[1]
    return re.findall(r"^```python\n(.*?)^```", section, flags=re.S | re.M)[0]


def check_equal(out: Path, corpus: Path, single: np.ndarray) -> None:
    lines, vectors = read_shards(out)
    assert lines == usable_lines(corpus)  # the order key: each row's source line
    assert vectors.shape == single.shape and np.abs(vectors - single).max() <= 1e-6


# ---------------------------------------------------------------------------------------------
# bad input: one line each
# ---------------------------------------------------------------------------------------------
def test_ray_without_ray_names_the_extra(minilm_dir, corpus, tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    assert cli.main(["embed", str(minilm_dir), "--input", str(corpus), "--out", str(tmp_path / "o"), "--ray"]) == 2
    assert "--ray needs Ray Data (ray is not installed): pip install 'bertkit[ray]'" in capsys.readouterr().err


def test_an_unreachable_address_is_one_line_naming_it(minilm_dir, corpus, tmp_path, capsys):
    port = free_port()  # nothing listens there
    started = time.monotonic()
    assert cli.main(["embed", str(minilm_dir), "--input", str(corpus), "--out", str(tmp_path / "o"),
                     "--ray", f"127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err
    assert f"cannot reach a Ray cluster at 127.0.0.1:{port}" in err and len(err.strip().splitlines()) == 1
    assert time.monotonic() - started < 30 and not (tmp_path / "o").exists()


def test_another_jobs_manifest_is_refused_without_overwrite(minilm_dir, corpus, tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps({"job": {"model": "/another/model"}, "shards": 0}))
    assert cli.main(["embed", str(minilm_dir), "--input", str(corpus), "--out", str(out), "--ray"]) == 2
    err = capsys.readouterr().err
    assert "manifest.json is another job's" in err and "pass --overwrite" in err
    (out / "manifest.json").unlink()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="holds files and no manifest.json"):
        embed_on_ray(minilm_dir, corpus, out)
    assert (out / "notes.txt").read_text() == "mine"


# ---------------------------------------------------------------------------------------------
# on a cluster: the single-process job's vectors; kills, then only what is missing
# ---------------------------------------------------------------------------------------------
def test_killed_driver_then_killed_worker_then_rerun_equals_the_single_process_job(
        minilm_dir, corpus, single, cluster, tmp_path):
    out = tmp_path / "shards"
    total = ROWS // CHUNK
    args = command(minilm_dir, corpus, out, cluster.address)
    env = {**os.environ, **RAY_ENV, "PYTHONUNBUFFERED": "1"}

    # 1. the driver, SIGKILLed once some shards are written
    kill_when(args, env, lambda: 1 <= shards(out) < total - 20, timeout=WAIT)
    deadline = time.monotonic() + 30  # Ray reaps the dead driver's actors; let them go first
    while map_workers(cluster.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    done = shards(out)
    assert 1 <= done < total

    # 2. a rerun, one of its actors SIGKILLed once it has written a shard: Ray restarts the actor
    #    and the run completes, or the run fails; either way no shard is written twice or lost
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + WAIT
        while shards(out) <= done:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the rerun wrote no shard"
            time.sleep(0.01)
        workers = map_workers(cluster.pid)
        assert workers, "no ShardWriter actor found to kill"
        os.kill(workers[0], signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    second = re.search(r"\((\d+) written now, (\d+) done before\)", stdout)
    if proc.returncode == 0:  # Ray restarted the killed actor and ran its chunk again
        # an actor of the killed driver may finish the shard it was writing after the count above,
        # so the rerun can find more than ``done`` shards, never fewer
        assert second, stdout
        written, before = int(second.group(1)), int(second.group(2))
        assert before >= done and written == total - before, stdout

    # 3. a rerun completes whatever is missing, and the result is the single-process job's
    third = run(args)
    assert third.returncode == 0, third.stderr
    if proc.returncode == 0:
        assert "already complete" in third.stdout
    else:
        written, before = map(int, re.search(r"\((\d+) written now, (\d+) done before\)", third.stdout).groups())
        assert before >= done and written == total - before
    check_equal(out, corpus, single)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["skipped"] == 1 and manifest["rows"] == ROWS
    assert not (out / ".input").exists() and not list(out.glob(".*.tmp"))


def test_the_documented_map_batches_example_runs(minilm_dir, cluster, capsys, monkeypatch):
    import ray

    for key, value in RAY_ENV.items():
        monkeypatch.setenv(key, value)
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    try:
        exec(documented_example(), {"MODEL_DIR": str(minilm_dir)})
    finally:
        ray.shutdown()
    assert capsys.readouterr().out.strip().endswith("2 (384,)")
