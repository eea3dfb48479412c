"""ELECTRA's question on this machine: at equal compute, does replaced-token detection (RTD) make a
better encoder than masked LM? Both pre-train the same architecture on the demo corpus (People's
Daily 1998, per character, as the quickstart), then fine-tune the same way for zh-ner; entity F1 on
the test split, over seeds, mean ± standard error.

Equal compute is equal CPU time of the training processes, not equal steps: an RTD step runs a
generator beside the discriminator and costs more. Each objective's CPU seconds per step are
measured first (a 2-step and a 2+K-step run in fresh processes, the difference over K, so start-up
and loading cancel), then each run gets `--cpu-minutes` / (seconds per step) steps. CPU time (the
children's user + system time) rather than wall time keeps the budget fair when other work shares
the machine, up to a point: torch's threads spin while they wait for a core, so on a machine
busy with other work CPU time overstates the work done and the calibration drifts (measured:
2.27 CPU s per step for MLM and 1.85 for RTD at load 10, though an RTD step runs the same
encoder plus a generator). Run it on a quiet machine. Both use a constant learning rate after a short warm-up, so
neither is cut short in the middle of a decay.

    python bench/rtd_vs_mlm.py [--cpu-minutes 10] [--seeds 3] [--model mini]

Resumable: every finished stage (data, calibration, each pre-training run, each fine-tuning) is
kept under --out (default runs/rtd_vs_mlm) and skipped when the command is run again; a killed
pre-training run continues from its last checkpoint. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bertkit.data.labelled import load_labelled, write_examples
from bertkit.util.fileio import atomic_write_json

OBJECTIVES = ("mlm", "rtd")
BERTKIT = [sys.executable, "-m", "bertkit.cli"]


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(command: list[str]) -> float:
    """Run a bertkit command; its CPU seconds (user + system, all threads)."""
    before = children_cpu_seconds()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return children_cpu_seconds() - before


def prepare_data(work: Path, max_documents: int) -> Path:
    """The quickstart's Chinese data: People's Daily per character, an 8,000-piece vocabulary."""
    data = work / "data"
    if (data / "meta.json").is_file():
        return data
    corpus = work / "corpus.txt"
    if not corpus.is_file():
        from bertkit.data.corpus import as_corpus

        documents = as_corpus("builtin:peoples-daily").documents[:max_documents]
        corpus.write_text("\n\n".join("\n".join(doc) for doc in documents) + "\n", encoding="utf-8")
    tokenizer = work / "tokenizer"
    if not (tokenizer / "vocab.txt").is_file():
        subprocess.run([*BERTKIT, "tokenizer", "train", "--corpus", str(corpus), "--vocab-size", "8000",
                        "--out", str(tokenizer), "--overwrite"], check=True)
    subprocess.run([*BERTKIT, "prepare", "--corpus", str(corpus), "--tokenizer", str(tokenizer),
                    "--out", str(data), "--max-seq-len", "128", "--no-nsp", "--workers", "1", "--overwrite"],
                   check=True)
    return data


def pretrain_command(data: Path, out: Path, objective: str, steps: int, seed: int,
                     args: argparse.Namespace) -> list[str]:
    return [*BERTKIT, "pretrain", "--data", str(data), "--out", str(out), "--model", args.model,
            "--objective", objective, "--max-steps", str(steps), "--batch-size", str(args.batch_size),
            "--lr", str(args.lr), "--schedule", "constant", "--warmup-steps", str(min(args.warmup, steps)),
            "--seed", str(seed), "--save-every", "200", "--threads", str(args.threads),
            "--precision", args.precision, "--no-progress"]


def calibrate(work: Path, data: Path, objective: str, args: argparse.Namespace) -> float:
    """CPU seconds per step of `objective`: (2 + K steps) − (2 steps), over K."""
    path = work / f"calibration-{objective}.json"
    if path.is_file():
        return json.loads(path.read_text())["cpu_seconds_per_step"]
    k = args.calibration_steps
    costs = {}
    for steps in (2, 2 + k):
        out = work / f"calibration-{objective}-{steps}"
        costs[steps] = run([*pretrain_command(data, out, objective, steps, 0, args), "--overwrite"])
    per_step = max((costs[2 + k] - costs[2]) / k, 1e-3)
    atomic_write_json(path, {"objective": objective, "cpu_seconds": costs, "cpu_seconds_per_step": per_step})
    return per_step


def finetune_ner(model_dir: Path, out: Path, files: dict[str, Path], seed: int,
                 args: argparse.Namespace) -> dict:
    result = out / "ner.json"
    if result.is_file():
        return json.loads(result.read_text())
    from bertkit.train.finetune import finetune

    summary = finetune("ner", model_dir, files["train"], out / "finetune", eval_file=files["dev"],
                       test=str(files["test"]), lr=args.finetune_lr, seed=seed, epochs=args.epochs,
                       batch_size=32, max_length=128, progress=False, overwrite=True)
    record = {"dev_f1": summary["eval"]["f1"], "test_f1": summary["test"]["f1"],
              "best_epoch": summary["best_epoch"]}
    atomic_write_json(result, record)
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/rtd_vs_mlm")
    p.add_argument("--cpu-minutes", type=float, default=10.0, help="pre-training CPU budget per run")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--model", default="mini", help="the architecture both pre-train (a preset)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=5e-4, help="pre-training rate (constant after warm-up)")
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"),
                   help="pre-training precision; auto is measured once here and pinned for every run")
    p.add_argument("--calibration-steps", type=int, default=10)
    p.add_argument("--max-documents", type=int, default=None, help="a prefix of the corpus (a quick check)")
    p.add_argument("--train-size", type=int, default=1000, help="zh-ner training sentences")
    p.add_argument("--dev-size", type=int, default=500)
    p.add_argument("--test-size", type=int, default=None, help="the first N test sentences (default: all)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--finetune-lr", type=float, default=5e-4)
    args = p.parse_args(argv)
    work = Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    began = time.time()
    if args.precision == "auto":  # one measurement for all runs: a per-run probe could differ between them
        import torch

        from bertkit.backend.precision import resolve_precision

        torch.set_num_threads(args.threads)
        args.precision = resolve_precision("auto", "cpu")
        print(f"precision: {args.precision} (measured)", flush=True)

    data = prepare_data(work, args.max_documents)
    splits = {"train": load_labelled("zh-ner", "train")[:args.train_size],
              "dev": load_labelled("zh-ner", "dev")[:args.dev_size],
              "test": load_labelled("zh-ner", "test")[:args.test_size]}
    files = {name: write_examples(items, work / f"zh-ner.{name}.conll") for name, items in splits.items()}
    per_step = {objective: calibrate(work, data, objective, args) for objective in OBJECTIVES}
    steps = {objective: max(1, round(args.cpu_minutes * 60 / cost)) for objective, cost in per_step.items()}
    print(f"CPU seconds per step: {per_step}; steps in {args.cpu_minutes:g} CPU minutes: {steps}", flush=True)

    results: dict[str, dict[int, dict]] = {objective: {} for objective in OBJECTIVES}
    for seed in range(args.seeds):
        for objective in OBJECTIVES:
            run_dir = work / f"{objective}-seed{seed}"
            if not (run_dir / "summary.json").is_file() or json.loads(
                    (run_dir / "summary.json").read_text()).get("steps") != steps[objective]:
                resume = ["--resume"] if (run_dir / "checkpoints").is_dir() else []
                cpu = run([*pretrain_command(data, run_dir, objective, steps[objective], seed, args), *resume])
                atomic_write_json(run_dir / "cpu.json", {"cpu_seconds": cpu, "resumed": bool(resume)})
            record = finetune_ner(run_dir / "model", run_dir, files, seed, args)
            record["pretrain_cpu_s"] = json.loads((run_dir / "cpu.json").read_text())["cpu_seconds"]
            results[objective][seed] = record
            print(f"seed {seed} {objective}: {steps[objective]} steps, {record['pretrain_cpu_s']:.0f} CPU s; "
                  f"zh-ner test F1 {record['test_f1']:.4f} (dev {record['dev_f1']:.4f})", flush=True)

    summary: dict = {"settings": vars(args), "cpu_seconds_per_step": per_step, "steps": steps,
                     "results": results, "seconds": round(time.time() - began, 1)}
    for objective in OBJECTIVES:
        scores = [r["test_f1"] for r in results[objective].values()]
        error = statistics.stdev(scores) / len(scores) ** 0.5 if len(scores) > 1 else float("nan")
        summary[objective] = {"mean_test_f1": statistics.mean(scores), "standard_error": error}
        print(f"{objective}: zh-ner test F1 {statistics.mean(scores):.4f} ± {error:.4f} over {len(scores)} seeds")
    differences = [results["rtd"][s]["test_f1"] - results["mlm"][s]["test_f1"] for s in range(args.seeds)]
    summary["rtd_minus_mlm"] = statistics.mean(differences)
    atomic_write_json(work / "results.json", summary)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
