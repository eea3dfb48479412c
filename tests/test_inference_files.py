"""Files of any size (`bertkit.inference.files`): reading, bad rows, bounded memory, exact resume
after SIGKILL, refusals, and torchrun with 2 processes writing the bytes 1 process writes.

No model is needed: `process` maps each record to a hash vector (npy) or to its length (jsonl).
Run as a script, this file is the driver of the subprocess runs (the killed one, the torchrun one):
    python tests/test_inference_files.py INPUT OUT_DIR [--resume] [--chunk N] [--kinds npy,jsonl]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from bertkit.inference.files import Record, RecordReport, RunFileConfig, read_records, run_file

from sigkill import kill_when

DIM = 6
SETTINGS = {"model": "tiny", "precision": "fp32", "pooling": "mean"}
DELAY_ENV = "BERTKIT_TEST_FILES_DELAY"  # seconds each `process` call sleeps (a slow model)
KILL_ENV = "BERTKIT_TEST_FILES_KILL"  # "RANK:KIND:CALLS": that rank SIGKILLs itself at that call


def hash_vectors(records: list[Record]) -> np.ndarray:
    """(B, DIM) float32 in [0, 1) from SHA-256 of text and pair: deterministic, row-independent."""
    out = np.empty((len(records), DIM), dtype=np.float32)
    for i, r in enumerate(records):
        digest = hashlib.sha256(f"{r.text}\x00{r.pair}".encode()).digest()
        out[i] = np.frombuffer(digest[:4 * DIM], dtype="<u4") / 2.0 ** 32
    return out


def text_lengths(records: list[Record]) -> list[dict]:
    return [{"chars": len(r.text), "tail": r.text[-3:]} for r in records]


PROCESS = {"npy": hash_vectors, "jsonl": text_lengths}
_calls: dict[str, int] = {}


def driven(kind: str):
    """PROCESS[kind], slowed by DELAY_ENV and killed by KILL_ENV (for the subprocess runs)."""
    def process(records):
        _calls[kind] = _calls.get(kind, 0) + 1
        kill = os.environ.get(KILL_ENV, "")
        if kill:
            rank, kill_kind, calls = kill.split(":")
            if os.environ.get("RANK", "0") == rank and kill_kind == kind and _calls[kind] > int(calls):
                os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(float(os.environ.get(DELAY_ENV, "0")))
        return PROCESS[kind](records)
    return process


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("input")
    p.add_argument("out_dir")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--chunk", type=int, default=7)
    p.add_argument("--kinds", default="npy,jsonl")
    args = p.parse_args(argv)
    for kind in args.kinds.split(","):
        run_file(args.input, Path(args.out_dir) / f"out.{kind}", driven(kind), kind=kind,
                 dim=DIM if kind == "npy" else None, chunk_size=args.chunk, resume=args.resume,
                 progress=False, settings=SETTINGS)


def driver(*args: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), *map(str, args)]


def driver_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", DELAY_ENV, KILL_ENV)}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


# ---------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------
TEXTS = [f"sentence {i} {'é' * (i % 3)} {'word ' * (i % 5)}".strip() for i in range(1, 61)]


def write_jsonl(path: Path, n: int = 60) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"r{i}", "text": TEXTS[i % len(TEXTS)]}, ensure_ascii=False) + "\n")
    return path


def reference(tmp: Path, source: Path, kind: str, chunk: int = 7) -> bytes:
    out = tmp / f"reference.{kind}"
    run_file(source, out, PROCESS[kind], kind=kind, dim=DIM if kind == "npy" else None,
             chunk_size=chunk, progress=False, settings=SETTINGS)
    return out.read_bytes()


def leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(out.name + "."))


# ---------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------
def test_the_four_formats_give_the_same_records(tmp_path):
    rows = [("a b", "x", "1"), ("zweite, mit Komma", "y", "2"), ("第三句", "z", "3")]
    (tmp_path / "in.txt").write_text("".join(f"{t}\n" for t, _, _ in rows) + "\n", encoding="utf-8")
    (tmp_path / "in.jsonl").write_text(
        "".join(json.dumps({"text": t, "q": q, "id": i}, ensure_ascii=False) + "\n" for t, q, i in rows),
        encoding="utf-8")
    (tmp_path / "in.csv").write_text(
        "id,text,q\n" + "".join(f'{i},"{t}",{q}\n' for t, q, i in rows), encoding="utf-8")
    (tmp_path / "in.tsv").write_text(
        "id\ttext\tq\n" + "".join(f"{i}\t{t}\t{q}\n" for t, q, i in rows), encoding="utf-8")

    txt = list(read_records(tmp_path / "in.txt"))
    assert [(r.line, r.text, r.pair, r.extra) for r in txt] == [(1, "a b", None, {}),
                                                               (2, "zweite, mit Komma", None, {}),
                                                               (3, "第三句", None, {})]
    for suffix in ("jsonl", "csv", "tsv"):
        got = list(read_records(tmp_path / f"in.{suffix}", pair_field="q"))
        assert [(r.line, r.text, r.pair) for r in got] == [(i + 1 + (suffix != "jsonl"), t, q)
                                                          for i, (t, q, _) in enumerate(rows)], suffix
        assert [r.extra for r in got] == [{"id": i} for _, _, i in rows], suffix
    # Windows files: a byte-order mark, CRLF endings, a quoted field over two lines; quotes inside
    # a TSV field are text.
    (tmp_path / "win.csv").write_bytes('\ufeffid,text\r\n1,"multi\r\nline"\r\n2,c\r\n'.encode())
    assert [(r.line, r.text, r.extra) for r in read_records(tmp_path / "win.csv")] == [
        (2, "multi\r\nline", {"id": "1"}), (4, "c", {"id": "2"})]
    (tmp_path / "q.tsv").write_text('text\tlabel\nhe said "hi" there\tpos\n', encoding="utf-8")
    assert [r.text for r in read_records(tmp_path / "q.tsv")] == ['he said "hi" there']
    # fmt overrides the suffix; an unknown suffix names the formats.
    (tmp_path / "data.dat").write_text("one\ntwo\n", encoding="utf-8")
    assert [r.text for r in read_records(tmp_path / "data.dat", fmt="txt")] == ["one", "two"]
    with pytest.raises(ValueError, match=r"suffix '\.dat'.*--input-format txt\|jsonl\|csv\|tsv"):
        read_records(tmp_path / "data.dat")
    with pytest.raises(ValueError, match="no column 'body' in the header.*--text-field"):
        read_records(tmp_path / "in.csv", text_field="body")
    with pytest.raises(ValueError, match="cannot be read from it"):
        read_records(tmp_path / "in.txt", pair_field="q")


def test_bad_rows_are_named_counted_and_skipped(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join([
        b'{"text": "good one", "id": 1}',       # 1
        b'{"text": "broken"',                   # 2 invalid JSON
        b'["a list"]',                          # 3 not an object
        b'{"body": "wrong field"}',             # 4 missing text field
        b'{"text": "   "}',                     # 5 empty text
        b'{"text": 42}',                        # 6 not a string
        b'{"text": "caf\xe9"}',                 # 7 Latin-1, not UTF-8
        b'',                                    # 8 blank: skipped silently
        b'{"text": "good two", "id": 2}',       # 9
    ]) + b"\n")
    report = RecordReport(str(path))
    records = list(read_records(path, report=report))
    assert [(r.line, r.text, r.extra) for r in records] == [(1, "good one", {"id": 1}),
                                                            (9, "good two", {"id": 2})]
    assert report.n_kept == 2 and report.n_skipped == 6
    assert report.problems == {"invalid JSON": 1, "not a JSON object": 1, "missing text field": 1,
                               "empty text": 1, "text not a string": 1, "non-UTF-8 line": 1}
    where = [m.split(": ")[0] for m in report.messages]
    assert where == [f"{path}:{n}" for n in (2, 3, 4, 5, 6, 7)]
    assert "found: body); pass --text-field" in report.messages[2]
    assert "byte 0xe9 at column 14" in report.messages[5]
    assert "6 skipped (1 empty text, 1 invalid JSON" in report.summary()

    csv_path = tmp_path / "bad.csv"
    csv_path.write_text('text,label\n"spans\ntwo lines",a\nonly one field\nok,b,extra\n,c\nfine,d\n',
                        encoding="utf-8")
    report = RecordReport(str(csv_path))
    records = list(read_records(csv_path, report=report))
    assert [(r.line, r.text, r.extra) for r in records] == [(2, "spans\ntwo lines", {"label": "a"}),
                                                            (7, "fine", {"label": "d"})]
    assert report.problems == {"wrong column count": 2, "empty text": 1}
    assert [m.split(": ")[0] for m in report.messages] == [f"{csv_path}:{n}" for n in (4, 5, 6)]


def test_a_file_with_nothing_usable_is_an_error(tmp_path):
    path = tmp_path / "none.jsonl"
    path.write_text('{"body": "a"}\n{"body": "b"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"none.jsonl: no usable rows; 2 rows skipped, e.g. "
                                         r".*none.jsonl:1: missing text field"):
        list(read_records(path))
    (tmp_path / "empty.txt").write_text("\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no usable rows"):
        run_file(tmp_path / "empty.txt", tmp_path / "o.npy", hash_vectors, dim=DIM, progress=False)
    assert not list(tmp_path.glob("o.npy*"))  # nothing created for a file with nothing to do
    (tmp_path / "utf16.txt").write_text("hello\n", encoding="utf-16")
    with pytest.raises(ValueError, match="looks binary"):
        read_records(tmp_path / "utf16.txt")


# ---------------------------------------------------------------------------------------------
# outputs
# ---------------------------------------------------------------------------------------------
def test_outputs_hold_every_usable_row_in_order(tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", n=25)
    with open(source, "a", encoding="utf-8") as f:
        f.write("not json\n")
    records = list(read_records(source, report=RecordReport("x", quiet=True)))

    summary = run_file(source, tmp_path / "v.npy", hash_vectors, chunk_size=4, progress=False)
    assert summary["rows"] == 25 and summary["dim"] == DIM  # dim measured on the first record
    assert summary["skipped"] == 1 and summary["problems"] == {"invalid JSON": 1}
    assert summary["examples"][0].startswith(f"{source}:26: invalid JSON")
    np.testing.assert_array_equal(np.load(tmp_path / "v.npy"), hash_vectors(records))

    run_file(source, tmp_path / "n.jsonl", text_lengths, chunk_size=4, progress=False)
    lines = (tmp_path / "n.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(x) for x in lines] == [
        {"line": r.line, "id": r.extra["id"], **t} for r, t in zip(records, text_lengths(records))]
    assert "é" in "".join(lines)  # written as UTF-8, not \u escapes
    assert leftovers(tmp_path / "v.npy") == [] and leftovers(tmp_path / "n.jsonl") == []

    def short(records):
        return hash_vectors(records)[:-1]
    with pytest.raises(ValueError, match=r"shape \(3, 6\) for 4 records; expected \(4, 6\)"):
        run_file(source, tmp_path / "bad.npy", short, dim=DIM, chunk_size=4, progress=False)


def test_memory_stays_bounded_by_one_chunk(tmp_path):
    source = tmp_path / "big.txt"
    with open(source, "w", encoding="utf-8") as f:
        for i in range(200_000):
            f.write(f"line number {i} of a file far larger than one chunk\n")
    sizes = []

    def process(records):
        sizes.append(len(records))
        return np.zeros((len(records), 4), dtype=np.float32)

    tracemalloc.start()
    try:
        summary = run_file(source, tmp_path / "big.npy", process, dim=4, chunk_size=1000,
                           progress=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert summary["rows"] == 200_000 and sum(sizes) == 200_000 and max(sizes) == 1000
    # All 200k Records at once would take ~50 MB; one chunk of 1000 takes ~0.3 MB. The output
    # is a memory map, which tracemalloc does not count, as it takes no heap.
    assert peak < 4 * 2 ** 20, f"peak {peak / 2 ** 20:.1f} MiB"


# ---------------------------------------------------------------------------------------------
# resume
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["npy", "jsonl"])
def test_sigkill_then_resume_writes_the_uninterrupted_bytes(tmp_path, kind):
    source = write_jsonl(tmp_path / "in.jsonl", n=300)
    expected = reference(tmp_path, source, kind)
    out_dir = tmp_path / "run"
    out = out_dir / f"out.{kind}"
    state = out_dir / f"out.{kind}.progress.json"

    kill_when(driver(source, out_dir, "--kinds", kind), driver_env(**{DELAY_ENV: "0.03"}),
              lambda: state.exists() and json.loads(state.read_text())["rows_done"] >= 70)
    done = json.loads(state.read_text())["rows_done"]
    assert 70 <= done < 300, "the kill came too late to test anything"
    assert not out.exists()  # only the partial output and its state
    assert leftovers(out) == sorted([out.name + ".partial", state.name])
    if kind == "jsonl":  # bytes written after the last committed state must go, however many
        with open(out_dir / f"out.{kind}.partial", "ab") as f:
            f.write(b'{"line": 999, "torn' + b"x" * len(expected))

    summary = run_file(source, out, PROCESS[kind], kind=kind, dim=DIM if kind == "npy" else None,
                       chunk_size=7, resume=True, progress=False, settings=SETTINGS)
    assert summary["resumed_from"] == done and summary["processed"] == 300 - done
    assert out.read_bytes() == expected
    assert leftovers(out) == []


class Interrupt(Exception):
    pass


def interrupted_run(source: Path, out: Path, kind: str, after_chunks: int) -> None:
    """A run that stops (as a kill would) after `after_chunks` chunks were written and committed."""
    calls = []

    def process(records):
        if len(calls) == after_chunks:
            raise Interrupt
        calls.append(1)
        return PROCESS[kind](records)

    with pytest.raises(Interrupt):
        run_file(source, out, process, kind=kind, dim=DIM if kind == "npy" else None, chunk_size=7,
                 progress=False, settings=SETTINGS)


def test_resume_refuses_a_changed_input_or_settings(tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", n=40)
    expected = reference(tmp_path, source, "npy")
    out = tmp_path / "out.npy"
    interrupted_run(source, out, "npy", after_chunks=2)

    def resume(**kw):
        return run_file(source, out, hash_vectors, dim=DIM, chunk_size=7, resume=True,
                        progress=False, settings={**SETTINGS, **kw})

    with pytest.raises(ValueError, match=r"cannot resume .*out.npy: precision: 'fp32' → 'bf16'.*"
                                         r"out.npy.progress.json.*--overwrite"):
        resume(precision="bf16")
    original, stat = source.read_bytes(), os.stat(source)
    with open(source, "a", encoding="utf-8") as f:
        f.write('{"text": "one more"}\n')
    with pytest.raises(ValueError, match=r"input size: \d+ → \d+ bytes.*usable rows: 40 → 41"):
        resume()
    # Same size, one byte changed in the first MiB, and the modification time put back.
    source.write_bytes(original.replace(b"sentence 1 ", b"sentence X ", 1))
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(ValueError, match=r"cannot resume .*input's first MiB: different content"):
        resume()
    source.write_bytes(original)
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    # A different chunk size is fine for one process: it goes on from its last row.
    run_file(source, out, hash_vectors, dim=DIM, chunk_size=5, resume=True, progress=False,
             settings=SETTINGS)
    assert out.read_bytes() == expected


def test_existing_output_or_partial_run_needs_a_flag(tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", n=30)
    out = tmp_path / "out.jsonl"
    interrupted_run(source, out, "jsonl", after_chunks=1)
    with pytest.raises(FileExistsError, match=r"out.jsonl has a partial run \(out.jsonl.partial, "
                                              r"out.jsonl.progress.json\); pass --resume .* --overwrite"):
        run_file(source, out, text_lengths, progress=False, settings=SETTINGS)
    summary = run_file(source, out, text_lengths, chunk_size=7, resume=True, progress=False,
                       settings=SETTINGS)
    assert summary["resumed_from"] == 7 and summary["rows"] == 30
    first = out.read_bytes()
    with pytest.raises(FileExistsError, match="out.jsonl already exists; pass --overwrite"):
        run_file(source, out, text_lengths, progress=False, settings=SETTINGS)
    again = run_file(source, out, text_lengths, resume=True, progress=False, settings=SETTINGS)
    assert again["already_complete"] and again["rows"] == 30 and out.read_bytes() == first
    # --overwrite removes a partial run and an old output alike, and starts from row 0.
    interrupted_run(source, tmp_path / "other.jsonl", "jsonl", after_chunks=2)
    summary = run_file(source, tmp_path / "other.jsonl", text_lengths, chunk_size=3, overwrite=True,
                       progress=False)
    assert summary["resumed_from"] == 0 and (tmp_path / "other.jsonl").read_bytes() == first
    assert leftovers(tmp_path / "other.jsonl") == []
    # --resume with nothing to resume simply runs.
    fresh = run_file(source, tmp_path / "new.npy", hash_vectors, resume=True, progress=False)
    assert fresh["resumed_from"] == 0 and fresh["rows"] == 30


# ---------------------------------------------------------------------------------------------
# torchrun
# ---------------------------------------------------------------------------------------------
def torchrun(*args: str, check: bool = True, **env: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               str(Path(__file__).resolve()), *args]
    result = subprocess.run(command, env=driver_env(**env), capture_output=True, text=True, timeout=180)
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture
def hundred_rows(tmp_path) -> tuple[Path, dict[str, bytes]]:
    source = write_jsonl(tmp_path / "in.jsonl", n=100)  # 15 chunks of 7: rank 0 gets one more
    return source, {kind: reference(tmp_path, source, kind) for kind in ("npy", "jsonl")}


def test_torchrun_two_processes_write_what_one_writes(tmp_path, hundred_rows):
    source, expected = hundred_rows
    torchrun(str(source), str(tmp_path / "plain"))
    for kind in ("npy", "jsonl"):
        assert (tmp_path / "plain" / f"out.{kind}").read_bytes() == expected[kind], kind
        assert leftovers(tmp_path / "plain" / f"out.{kind}") == []


def test_torchrun_resumes_each_rank_after_a_kill(tmp_path, hundred_rows):
    source, expected = hundred_rows
    # The jsonl completes; then rank 1 is SIGKILLed after its 3rd npy chunk (torchrun stops rank 0).
    killed = torchrun(str(source), str(tmp_path / "run"), "--kinds", "jsonl,npy", check=False,
                      **{KILL_ENV: "1:npy:3", DELAY_ENV: "0.05"})
    assert killed.returncode != 0
    out = tmp_path / "run" / "out.npy"
    assert not out.exists() and (tmp_path / "run" / "out.jsonl").exists()
    state = out.with_name("out.npy.progress-rank1-of-2.json")
    assert json.loads(state.read_text())["chunks_done"] == 3
    with pytest.raises(ValueError, match=r"another number of processes \(out.npy.progress-rank"):
        run_file(source, out, hash_vectors, dim=DIM, chunk_size=7, resume=True, progress=False,
                 settings=SETTINGS)
    # Each rank goes on from its own state; the finished jsonl is left as it is.
    torchrun(str(source), str(tmp_path / "run"), "--resume", "--kinds", "jsonl,npy")
    for kind in ("npy", "jsonl"):
        assert (tmp_path / "run" / f"out.{kind}").read_bytes() == expected[kind], kind
        assert leftovers(tmp_path / "run" / f"out.{kind}") == []


if __name__ == "__main__":
    main()


def test_config_resolves_the_kind_and_names_a_bad_setting(tmp_path):
    assert RunFileConfig(input_path=tmp_path / "in.txt", out_path=tmp_path / "v.npy").kind == "npy"
    assert RunFileConfig(input_path=tmp_path / "in.txt", out_path=tmp_path / "r.JSONL").kind == "jsonl"
    with pytest.raises(ValueError, match=r"cannot tell the output kind of .*out\.csv"):
        RunFileConfig(input_path=tmp_path / "in.txt", out_path=tmp_path / "out.csv")
    with pytest.raises(ValueError, match="chunk_size must be positive, got 0"):
        RunFileConfig(input_path=tmp_path / "in.txt", out_path=tmp_path / "v.npy", chunk_size=0)
