"""How fast int8 starts and runs, by how its kernels are compiled (BERTKIT_INT8_KERNELS).

Two measurements, every one in its own process (a mode is chosen when bertkit is imported):

1. **Start**: `bertkit embed MINILM "a text" --precision P`, process start to answer (wall time of
   the whole command), for fp32 and for int8 with `native` (bertkit's C++ kernels, the default),
   `compile` (torch.compile in every process) and `aot` (AOTInductor kernels kept on disk). The
   kernel cache is a fresh directory, so the first `native` and `aot` runs compile (their times
   are printed on their own) and the runs after them load. Interleaved rounds; the median per mode.
2. **Speed**: MiniLM embeddings of the first N BBC sentences (`infer.bbc_sentences`), timed inside
   the process after a warm-up pass, for int8 native / compile / aot / eager; the best of the
   passes per mode, interleaved by round; the ratios native / aot and aot / compile.

    python bench/int8_start.py                      # 5 start rounds, 1,000 sentences × 3 rounds
    python bench/int8_start.py --starts 3 --sentences 500 --rounds 2 --threads 2

The last line is JSON with every figure. Quote it only from a quiet machine (load average < 1.5
before and after; printed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from infer import bbc_sentences, minilm_dir  # noqa: E402

CLI = "import sys; from bertkit.cli import main; sys.exit(main(sys.argv[1:]))"
SPEED = r"""
import json, sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
from bertkit.inference.engine import Engine
texts = json.load(open(sys.argv[2]))
engine = Engine.load(sys.argv[3], use="embed", precision="int8")
from bertkit.inference.embed import embed
embed(engine, texts[:64])
best = float("inf")
for _ in range(int(sys.argv[4])):
    start = time.perf_counter()
    embed(engine, texts)
    best = min(best, time.perf_counter() - start)
print(json.dumps({"seconds": best}))
"""


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def environment(mode: str | None, cache: Path, threads: int) -> dict:
    env = dict(os.environ, BERTKIT_CACHE_DIR=str(cache), OMP_NUM_THREADS=str(threads))
    env.pop("BERTKIT_INT8_EAGER", None)
    if mode:
        env["BERTKIT_INT8_KERNELS"] = mode
    return env


def start_seconds(model: Path, precision: str, mode: str | None, cache: Path, threads: int) -> float:
    """Wall time of one `bertkit embed` call, process start to answer."""
    command = [sys.executable, "-c", CLI, "embed", str(model), "a text to embed",
               "--precision", precision, "--threads", str(threads)]
    started = time.perf_counter()
    done = subprocess.run(command, env=environment(mode, cache, threads), capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return seconds


def speed_seconds(model: Path, texts_file: Path, mode: str, cache: Path, threads: int, passes: int) -> float:
    done = subprocess.run([sys.executable, "-c", SPEED, str(threads), str(texts_file), str(model), str(passes)],
                          env=environment(mode, cache, threads), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the {mode} speed run failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=5, help="rounds of start timings (5)")
    parser.add_argument("--sentences", type=int, default=1000, help="BBC sentences per speed pass (1,000)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved speed rounds (3)")
    parser.add_argument("--passes", type=int, default=2, help="timed passes per speed process (2)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    model = minilm_dir()
    load_before = loadavg()
    result: dict = {"threads": args.threads, "load_before": load_before}
    with tempfile.TemporaryDirectory(prefix="bertkit-int8-start-") as tmp:
        cache = Path(tmp) / "cache"
        for mode in ("native", "aot"):
            first = start_seconds(model, "int8", mode, cache, args.threads)
            print(f"int8 {mode}, first start (compiles its kernels into an empty cache): {first:.1f} s", flush=True)
            result[f"{mode}_first_start_s"] = round(first, 2)
        starts: dict[str, list[float]] = {"fp32": [], "int8 native": [], "int8 compile": [], "int8 aot": []}
        for r in range(args.starts):
            starts["fp32"].append(start_seconds(model, "fp32", None, cache, args.threads))
            for mode in ("native", "compile", "aot"):
                starts[f"int8 {mode}"].append(start_seconds(model, "int8", mode, cache, args.threads))
            print(f"start round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in starts.items()), flush=True)
        medians = {k: statistics.median(v) for k, v in starts.items()}
        result["start_median_s"] = {k: round(v, 2) for k, v in medians.items()}
        result["aot_over_fp32_start_s"] = round(medians["int8 aot"] - medians["fp32"], 2)
        result["compile_over_fp32_start_s"] = round(medians["int8 compile"] - medians["fp32"], 2)
        result["native_over_fp32_start_s"] = round(medians["int8 native"] - medians["fp32"], 2)

        texts_file = Path(tmp) / "texts.json"
        texts_file.write_text(json.dumps(bbc_sentences(args.sentences)))
        speeds: dict[str, list[float]] = {"native": [], "compile": [], "aot": [], "eager": []}
        for r in range(args.rounds):
            for mode in speeds:
                speeds[mode].append(speed_seconds(model, texts_file, mode, cache, args.threads, args.passes))
            print(f"speed round {r + 1}: " + ", ".join(f"{m} {args.sentences / v[-1]:,.0f} sentences/s"
                                                      for m, v in speeds.items()), flush=True)
        best = {m: min(v) for m, v in speeds.items()}
        result["sentences"] = args.sentences
        result["sentences_per_s"] = {m: round(args.sentences / s, 1) for m, s in best.items()}
        result["aot_speed_over_compile"] = round(best["compile"] / best["aot"], 3)
        result["native_speed_over_aot"] = round(best["aot"] / best["native"], 3)
    result["load_after"] = loadavg()
    print(f"start, median of {args.starts}: " + ", ".join(f"{k} {v:.2f} s" for k, v in medians.items())
          + f"; native − fp32 = {result['native_over_fp32_start_s']:+.2f} s, aot − fp32 = "
          f"{result['aot_over_fp32_start_s']:+.2f} s")
    print(f"speed, best of {args.rounds}×{args.passes}: " + ", ".join(
        f"{m} {v:,.0f}/s" for m, v in result["sentences_per_s"].items())
          + f"; native at {result['native_speed_over_aot']:.2f}× aot, "
          f"aot at {result['aot_speed_over_compile']:.2f}× compile")
    print(f"load average {load_before:.2f} before, {result['load_after']:.2f} after")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
