"""Encoder inference throughput: bertkit vs transformers (sdpa), same weights, same inputs, fp32.

Two workloads, each timed for both sides in the same run, interleaved:
  fixed  — batches of 32 × 128 tokens, no padding;
  mixed  — lengths drawn uniformly from 8..256, batches of 32 in arrival order (padding to the
           longest in each batch), the way requests come to a server.
Prints sequences/s and real tokens/s per side and, last, the ratios (ours / transformers).

    python bench/encoder.py [--model base] [--batches 3] [--threads N]
    python bench/encoder.py --family roberta|albert|distilbert   # base-sized, vs transformers' own class

--family builds the family's base size (RoBERTa: BERT-base with RoBERTa's positions and one
segment; ALBERT: the albert-base preset, 12 shared layers; DistilBERT: 6 layers of 768) and
compares against the matching transformers model (AutoModel on the saved directory).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
import transformers

from bertkit.config import BertConfig
from bertkit.model import BertModel


def fixed_batches(n: int, batch: int, length: int, vocab: int, g: torch.Generator):
    for _ in range(n):
        ids = torch.randint(1000, vocab, (batch, length), generator=g)
        yield {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": torch.ones_like(ids)}


def mixed_batches(n: int, batch: int, low: int, high: int, vocab: int, g: torch.Generator, pad_id: int = 0):
    for _ in range(n):
        lengths = torch.randint(low, high + 1, (batch,), generator=g)
        width = int(lengths.max())
        ids = torch.randint(1000, vocab, (batch, width), generator=g)
        mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
        yield {"input_ids": ids.masked_fill(mask == 0, pad_id), "token_type_ids": torch.zeros_like(ids),
               "attention_mask": mask}


FAMILIES = {  # family: (preset, overrides) for a base-sized model of that family
    "bert": (None, {}),
    "roberta": ("base", {"model_type": "roberta"}),
    "albert": ("albert-base", {}),
    "distilbert": ("base", {"model_type": "distilbert", "num_hidden_layers": 6}),
}


@torch.no_grad()
def timed(model, batches, drop: tuple[str, ...] = ()) -> tuple[float, int, int]:
    """Seconds, sequences and real tokens for one pass over `batches` (inputs in `drop` left out)."""
    start = time.perf_counter()
    seqs = tokens = 0
    for b in batches:
        model(**{k: v for k, v in b.items() if k not in drop})
        seqs += b["input_ids"].shape[0]
        tokens += int(b["attention_mask"].sum())
    return time.perf_counter() - start, seqs, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="base", help="preset name (default base)")
    parser.add_argument("--batches", type=int, default=3, help="batches per workload and side")
    parser.add_argument("--repeats", type=int, default=2, help="timed repeats (best kept)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--family", choices=sorted(FAMILIES), default="bert",
                        help="model family (default bert; others are base-sized, see above)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    preset, overrides = FAMILIES[args.family]
    config = BertConfig.preset(preset or args.model, hidden_dropout_prob=0.0,
                               attention_probs_dropout_prob=0.0, **overrides)
    ours = BertModel(config).eval()
    with tempfile.TemporaryDirectory() as tmp:
        ours.save_pretrained(tmp)
        peer = transformers.AutoModel.from_pretrained(tmp, attn_implementation="sdpa").eval()
    drop = ("token_type_ids",) if config.model_type == "distilbert" else ()
    print(f"model {preset or args.model} ({config.model_type}, {type(peer).__name__} on the peer side): "
          f"{sum(p.numel() for p in ours.parameters()):,} parameters, fp32, {torch.get_num_threads()} threads")

    workloads = {
        "fixed 32x128": list(fixed_batches(args.batches, 32, 128, config.vocab_size, torch.Generator().manual_seed(1))),
        "mixed 8..256": list(mixed_batches(args.batches * 2, 32, 8, 256, config.vocab_size,
                                           torch.Generator().manual_seed(2), config.pad_token_id)),
    }
    ratios = {}
    for name, batches in workloads.items():
        timed(ours, batches[:1], drop), timed(peer, batches[:1], drop)  # warm-up
        best = {"bertkit": float("inf"), "transformers": float("inf")}
        for _ in range(args.repeats):  # interleaved so drift hits both sides alike
            for side, model in (("bertkit", ours), ("transformers", peer)):
                seconds, seqs, tokens = timed(model, batches, drop)
                best[side] = min(best[side], seconds)
        for side in best:
            print(f"{name:14s} {side:13s} {seqs / best[side]:8.2f} seq/s  {tokens / best[side]:9.1f} real tokens/s")
        ratios[name] = best["transformers"] / best["bertkit"]
    for name, ratio in ratios.items():
        print(f"ratio {name}: {ratio:.2f}x (bertkit / transformers throughput)")


if __name__ == "__main__":
    main()
