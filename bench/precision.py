"""What each inference precision costs in accuracy, measured on the same model and inputs.

    python bench/precision.py CLASSIFIER_DIR [--dataset en-news] [--split test] [--threads 2]

For a fine-tuned sequence classifier (e.g. `bertkit finetune --task classify --dataset en-news`),
scores the built-in set's split at fp32, bf16 and int8 through the inference engine and prints,
per precision: accuracy, the change against fp32 in points, how many predictions differ from
fp32's, the min cosine of the pooled embeddings against fp32's (the classifier's own encoder,
mean pooling) and the throughput. The last line: `accuracy vs fp32: bf16 ±X.XX pt, int8 ±Y.YY pt`.
"""

from __future__ import annotations

import argparse
import time

import torch

from bertkit.data.labelled import load_labelled
from bertkit.inference import Engine, classify, embed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="fine-tuned classifier directory")
    parser.add_argument("--dataset", default="en-news", help="built-in classification set (en-news)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--limit", type=int, default=None, help="first N examples only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    examples = load_labelled(args.dataset, args.split)[:args.limit]
    texts = [e.text for e in examples]
    pairs = [e.text_pair for e in examples] if examples[0].text_pair is not None else None
    gold = [str(e.label) for e in examples]
    print(f"{args.dataset}:{args.split}: {len(examples)} examples, model {args.model}, "
          f"{args.threads} threads")
    reference = None
    deltas = {}
    for precision in ("fp32", "bf16", "int8"):
        engine = Engine.load(args.model, use="classify", precision=precision)
        classify(engine, texts[:8], pairs[:8] if pairs else None)  # warm-up (int8 compiles its kernels)
        started = time.perf_counter()
        rows = classify(engine, texts, pairs)
        seconds = time.perf_counter() - started
        labels = [r["label"] for r in rows]
        vectors = embed(engine, texts, pooling="mean")
        accuracy = sum(p == g for p, g in zip(labels, gold)) / len(gold)
        if reference is None:
            reference = (accuracy, labels, vectors)
        delta = 100 * (accuracy - reference[0])
        deltas[precision] = delta
        changed = sum(a != b for a, b in zip(labels, reference[1]))
        cosine = float(torch.nn.functional.cosine_similarity(vectors, reference[2]).min())
        print(f"  {precision:5} accuracy {accuracy:.4f} ({delta:+.2f} pt vs fp32), {changed} predictions "
              f"differ from fp32, embeddings min cosine {cosine:.5f}, {len(texts) / seconds:,.1f} texts/s")
    print(f"accuracy vs fp32: bf16 {deltas['bf16']:+.2f} pt, int8 {deltas['int8']:+.2f} pt")


if __name__ == "__main__":
    main()
