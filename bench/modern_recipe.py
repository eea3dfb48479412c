"""Does the modern recipe learn faster here? BERT-tiny against modern-tiny, pre-trained alike.

Both models have the same depth, width, heads and encoder parameters (396,544; `config.PRESETS`):
BERT-tiny is post-LN with learned positions, GELU and biases; modern-tiny is ModernBERT's recipe
(pre-LN, rotary positions, GeGLU, no biases, global attention every third layer with a 128-token
window in the others). Everything else is the demo's (`bertkit quickstart`, People's Daily): the
same WordPiece vocabulary and prepared data (32-token rows, MLM only), AdamW at 2e-3, batch 128,
6% warmup then linear decay, no dropout, the same number of steps. Each trains with its own
masking rate (15% vs 30%, `pretrain --mlm-probability` defaults) and both are scored at 15% on the
held-out People's Daily rows (the same masks: `quickstart.heldout_accuracy`), at the positions
shown as [MASK]. Then each 8-minute model is fine-tuned on zh-ner with the same settings and its
entity F1 read from the run's eval.json.

    python bench/modern_recipe.py --out runs/modern-recipe            # the whole study (hours)
    python bench/modern_recipe.py --out runs/modern-recipe --seeds 1 --long-seeds 0 --no-ner   # one seed

Budgets: `--minutes` (8, the demo's) sizes the step count once, from BERT-tiny's measured speed on
this machine (written to OUT/plan.json and reused), for `--seeds` seeds; `--long-minutes` (30) is
the same count scaled, for `--long-seeds` seeds. Both models run the same steps; their wall times
are reported. Resumable: every finished run leaves OUT/results/<name>.json and is skipped next
time; an interrupted run continues from its checkpoint (`pretrain --resume`). Progress goes to the
terminal, results to OUT/summary.json; mean ± standard error over seeds, printed last.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from bertkit.cli import main as cli
from bertkit.util.fileio import atomic_write_json

MODELS = ("tiny", "modern-tiny")


def setup(out: Path, minutes: float) -> dict:
    """Vocabulary, data and the step count (once); OUT/plan.json records them."""
    from bertkit.data.corpus import as_corpus
    from bertkit.data.prepare import prepare
    from bertkit.data.shards import PretrainingData
    from bertkit.data.vocab import train_tokenizer
    from bertkit.encoder.config import BertConfig
    from bertkit.quickstart import LANGUAGES, QuickstartConfig, fastest_threads, seconds_per_step

    plan_file = out / "plan.json"
    if plan_file.is_file():
        return json.loads(plan_file.read_text())
    demo, lang = QuickstartConfig(), LANGUAGES["zh"]
    corpus = as_corpus(lang.corpus)
    train_tokenizer(corpus, lang.vocab_size, out / "tokenizer", lowercase=lang.lowercase)
    prepare(corpus, out / "tokenizer", out / "data", max_seq_len=demo.max_seq_len, nsp=False,
            eval_fraction=demo.eval_fraction, seed=0, progress=True)
    data = PretrainingData(out / "data", "train")
    config = BertConfig.resolve("tiny", vocab_size=data.vocab_size, hidden_dropout_prob=0.0,
                                attention_probs_dropout_prob=0.0)
    threads, per_step = fastest_threads(lambda: seconds_per_step(data, config, demo.batch_size, "fp32", seed=0))
    steps = max(10, int(0.85 * minutes * 60 / per_step))  # as the demo sizes itself
    plan = {"steps": steps, "threads": threads, "seconds_per_step_tiny": per_step, "minutes": minutes,
            "batch_size": demo.batch_size, "lr": demo.lr, "max_seq_len": demo.max_seq_len}
    atomic_write_json(plan_file, plan)
    return plan


def pretrain_and_score(out: Path, plan: dict, model: str, seed: int, steps: int, name: str) -> dict:
    """One pre-training run (resumable) and its held-out score at 15%; OUT/results/NAME.json."""
    from bertkit.data.shards import PretrainingData
    from bertkit.encoder.model import BertForPreTraining
    from bertkit.quickstart import heldout_accuracy

    result_file = out / "results" / f"{name}.json"
    if result_file.is_file():
        return json.loads(result_file.read_text())
    run = out / "runs" / name
    start = time.perf_counter()
    args = ["pretrain", "--data", str(out / "data"), "--out", str(run), "--model", model,
            "--max-steps", str(steps), "--batch-size", str(plan["batch_size"]), "--lr", str(plan["lr"]),
            "--seed", str(seed), "--precision", "fp32", "--model-arg", "hidden_dropout_prob=0",
            "--model-arg", "attention_probs_dropout_prob=0", "--log-every", str(max(1, steps // 50)),
            "--eval-every", str(max(1, steps // 5)), "--save-every", str(max(1, steps // 10)), "--keep", "1",
            "--num-workers", "0", "--threads", str(plan["threads"])]
    if (run / "pretrain_config.json").is_file():
        args.append("--resume")
    if cli(args) != 0:
        raise SystemExit(f"pre-training {name} failed")
    seconds = time.perf_counter() - start
    settings = json.loads((run / "pretrain_config.json").read_text())
    data, eval_data = PretrainingData(out / "data", "train"), PretrainingData(out / "data", "eval")
    scores = heldout_accuracy(BertForPreTraining.from_pretrained(run / "model"), eval_data, data, seed=0,
                              precision="fp32")
    result = {"model": model, "seed": seed, "steps": steps, "train_mlm_probability": settings["mlm_probability"],
              "scored_at": 0.15, "wall_seconds_this_session": round(seconds, 1), **scores}
    atomic_write_json(result_file, result)
    return result


def ner_f1(out: Path, name: str, seed: int, epochs: int, max_examples: int | None) -> float:
    """zh-ner entity F1 of the pre-trained run NAME after one fine-tuning (the same for every model)."""
    done = out / "ner" / name / "eval.json"
    if not done.is_file():
        args = ["finetune", "--task", "ner", "--dataset", "zh-ner", "--model", str(out / "runs" / name / "model"),
                "--out", str(out / "ner" / name), "--epochs", str(epochs), "--seed", str(seed), "--precision",
                "fp32", "--max-length", "128", "--overwrite"]
        if max_examples:
            args += ["--max-train-examples", str(max_examples)]
        if cli(args) != 0:
            raise SystemExit(f"fine-tuning {name} on zh-ner failed")
    report = json.loads(done.read_text())
    return _find_f1(report.get("test") or report)


def _find_f1(report) -> float:
    """The entity F1 in an eval.json section (test metrics when the run has them, else the best epoch's)."""
    if isinstance(report, dict):
        if isinstance(report.get("f1"), (int, float)):
            return float(report["f1"])
        for value in report.values():
            found = _find_f1(value)
            if not math.isnan(found):
                return found
    return float("nan")


def mean_se(values: list[float]) -> str:
    if not values:
        return "—"
    mean = sum(values) / len(values)
    if len(values) < 2:
        return f"{mean:.4f} (1 seed)"
    se = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))
    return f"{mean:.4f} ± {se:.4f} ({len(values)} seeds)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for everything (resumable)")
    parser.add_argument("--minutes", type=float, default=8.0, help="the short budget (the demo's 8)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds at the short budget (3)")
    parser.add_argument("--long-minutes", type=float, default=30.0, help="the long budget (30)")
    parser.add_argument("--long-seeds", type=int, default=1, help="seeds at the long budget (1)")
    parser.add_argument("--no-ner", action="store_true", help="skip the zh-ner fine-tuning")
    parser.add_argument("--ner-epochs", type=int, default=1)
    parser.add_argument("--ner-max-examples", type=int, default=None)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plan = setup(out, args.minutes)
    torch.set_num_threads(plan["threads"])
    long_steps = round(plan["steps"] * args.long_minutes / plan["minutes"])
    print(f"plan: {plan['steps']} steps (short), {long_steps} (long); BERT-tiny "
          f"{plan['seconds_per_step_tiny']:.2f} s/step here")
    runs = [(model, seed, plan["steps"], f"{model}-s{seed}-short") for seed in range(args.seeds) for model in MODELS]
    runs += [(model, seed, long_steps, f"{model}-s{seed}-long") for seed in range(args.long_seeds) for model in MODELS]
    results = {name: pretrain_and_score(out, plan, model, seed, steps, name) for model, seed, steps, name in runs}
    if not args.no_ner:
        for name, result in results.items():
            if name.endswith("-short"):
                result["zh_ner_f1"] = ner_f1(out, name, 0, args.ner_epochs, args.ner_max_examples)
    summary = {"plan": plan, "runs": results}
    atomic_write_json(out / "summary.json", summary)
    for budget in ("short", "long"):
        for model in MODELS:
            rows = [r for n, r in results.items() if n.startswith(model + "-") and n.endswith(budget)]
            if not rows:
                continue
            line = (f"{budget:5s} {model:12s} [MASK] accuracy {mean_se([r['mask_accuracy'] for r in rows])}, "
                    f"MLM loss {mean_se([r['mlm_loss'] for r in rows])}, "
                    f"wall {mean_se([r['wall_seconds_this_session'] for r in rows])} s")
            if any("zh_ner_f1" in r for r in rows):
                line += f", zh-ner F1 {mean_se([r['zh_ner_f1'] for r in rows if 'zh_ner_f1' in r])}"
            print(line)


if __name__ == "__main__":
    main()
