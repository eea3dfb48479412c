"""Encoder inference throughput: bertkit vs transformers (sdpa; eager where it has none), same weights, fp32.

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

    python bench/encoder.py --family xlm-roberta|electra|ernie|mpnet|deberta-v2

The families users bring are built from their transformers config at a released base model's
shape (xlm-roberta-base, electra-base-discriminator, ernie-3.0-base-zh with its task-type table,
mpnet-base, deberta-v3-base), dropout off, and compared on the same workloads against
transformers' own class with attn_implementation="sdpa" where transformers 5.25 offers it for the
family (XLM-R, ELECTRA, ERNIE) and "eager" where it does not (MPNet, DeBERTa-v2); the header line
says which.

    python bench/encoder.py --family modernbert [--size base|mini] [--mixed-batch 8]
    python bench/encoder.py --family modernbert --long 512,2048,8192   # cost per token by length
    python bench/encoder.py --family modernbert --sweep-blocks 32,64,128,256

ModernBERT's workloads are its own: fixed 32 × 512, and mixed lengths 64..8,192 (batches of
--mixed-batch, padding to the longest on the transformers side). bertkit runs them as its engine
does, packed without padding (`forward_packed`, sequences sorted by length as the engine sorts
them), against transformers' ModernBertModel (sdpa) on the same random weights. --size base is
ModernBERT-base's shape (22 layers of 768, GeGLU 1152, vocab 50,368), mini the modern-mini preset
with that vocabulary. --long times one sequence of each length alone (µs per token), --sweep-blocks
the packed sliding-window kernel's query block against a full (T, T) band-masked SDPA.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
import transformers

from bertkit.encoder.config import BertConfig
from bertkit.encoder.model import BertModel
from bertkit.encoder.packing import Packed


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
# family: (transformers config class, its base model's shape). Dropout is set off below.
BROUGHT = {
    "xlm-roberta": ("XLMRobertaConfig", dict(vocab_size=250002, max_position_embeddings=514, type_vocab_size=1,
                                             pad_token_id=1, bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5)),
    "electra": ("ElectraConfig", dict(vocab_size=30522, embedding_size=768, hidden_size=768, num_hidden_layers=12,
                                      num_attention_heads=12, intermediate_size=3072)),
    "ernie": ("ErnieConfig", dict(vocab_size=40000, max_position_embeddings=2048, type_vocab_size=4,
                                  use_task_id=True, task_type_vocab_size=3)),
    "mpnet": ("MPNetConfig", dict(vocab_size=30527, max_position_embeddings=514, pad_token_id=1)),
    # DebertaV2Config's defaults are DeBERTa-v2-xlarge's (1,536 wide, 24 layers): the base shape is set here.
    "deberta-v2": ("DebertaV2Config", dict(vocab_size=128100, hidden_size=768, num_hidden_layers=12,
                                           num_attention_heads=12, intermediate_size=3072,
                                           max_position_embeddings=512, relative_attention=True,
                                           position_buckets=256, max_relative_positions=-1,
                                           pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm", share_att_key=True,
                                           position_biased_input=False, type_vocab_size=0, layer_norm_eps=1e-7)),
}
# transformers 5.25 has no SDPA attention for these (MPNetModel / DebertaV2Model: _supports_sdpa False).
EAGER_ONLY = ("mpnet", "deberta-v2")
MODERN_SIZES = {  # ModernBERT-base's shape (Warner et al. 2024, table 5), and the modern-mini preset
    "base": dict(model_type="modernbert", num_hidden_layers=22, hidden_size=768, num_attention_heads=12,
                 intermediate_size=1152, vocab_size=50368, pad_token_id=50283),
    "mini": dict(model_type="modernbert", num_hidden_layers=4, hidden_size=256, num_attention_heads=4,
                 intermediate_size=686, vocab_size=50368, pad_token_id=50283),
}


class Packing(torch.nn.Module):
    """bertkit's engine path over a padded batch: real tokens sorted by length, packed end to end."""

    def __init__(self, model: BertModel):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, **_):
        lengths = attention_mask.sum(1)
        order = lengths.argsort(descending=True, stable=True)
        real = attention_mask[order].bool()
        ids = input_ids[order][real]  # (N,)
        return self.model.forward_packed(ids, torch.zeros_like(ids), Packed.from_lengths(lengths[order].tolist()))


def long_costs(model: BertModel, lengths: list[int], vocab: int, repeats: int) -> None:
    """µs per token of one sequence alone at each length (packed path). The lengths take turns,
    `repeats` rounds after a warm-up round, and each keeps its best: a busy machine slows them alike."""
    g = torch.Generator().manual_seed(3)
    inputs = {n: torch.randint(1000, vocab, (n,), generator=g) for n in lengths}
    best = {n: float("inf") for n in lengths}
    with torch.no_grad():
        for round_ in range(repeats + 1):
            for n, ids in inputs.items():
                start = time.perf_counter()
                model.forward_packed(ids, torch.zeros_like(ids), Packed.from_lengths([n]))
                if round_:  # round 0 warms up
                    best[n] = min(best[n], time.perf_counter() - start)
    for n in lengths:
        print(f"length {n:5d}: {best[n]:8.3f} s  {1e6 * best[n] / n:8.1f} µs/token  "
              f"({best[n] / n / (best[lengths[0]] / lengths[0]):.2f}x the first length's per token)")


def sweep_blocks(blocks: list[int], length: int, config: BertConfig, repeats: int) -> None:
    """The packed sliding-window kernel at each query block size against SDPA over the whole
    (T, T) score matrix with a band mask, on one `length`-token sequence of one layer's shape."""
    from bertkit.encoder.modern import band_mask, local_attention

    g = torch.Generator().manual_seed(4)
    nh, hs, half = config.num_attention_heads, config.head_dim, config.local_attention // 2
    q, k, v = (torch.randn(length, nh, hs, generator=g) for _ in range(3))
    index = torch.zeros(length, dtype=torch.long)

    def best(fn) -> float:
        fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    def dense():
        mask = band_mask(length, half, q.device)
        torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                                         attn_mask=mask)

    with torch.no_grad():
        full = best(dense)
        print(f"{length} tokens, {nh} heads × {hs}, window ±{half}: full band-masked SDPA {1e3 * full:8.2f} ms")
        for block in blocks:
            seconds = best(lambda: local_attention(q, k, v, index, half, block))  # noqa: B023
            print(f"  query block {block:4d}: {1e3 * seconds:8.2f} ms  ({full / seconds:5.1f}x the full matrix)")


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
    parser.add_argument("--family", choices=sorted([*FAMILIES, *BROUGHT, "modernbert"]), default="bert",
                        help="model family (default bert; others are base-sized, see above)")
    parser.add_argument("--size", choices=sorted(MODERN_SIZES), default="base", help="ModernBERT's size")
    parser.add_argument("--mixed-batch", type=int, default=32, help="ModernBERT's mixed batch size (32)")
    parser.add_argument("--long", help="comma-separated lengths: time one sequence alone at each")
    parser.add_argument("--sweep-blocks", help="comma-separated query blocks of the sliding-window kernel")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    if args.family == "modernbert":
        preset, overrides = None, {}
        config = BertConfig.from_dict(MODERN_SIZES[args.size])
    elif args.family in BROUGHT:
        class_name, shape = BROUGHT[args.family]
        preset = f"{args.family}-base"
        config = BertConfig.from_dict(getattr(transformers, class_name)(
            **shape, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).to_dict())
    else:
        preset, overrides = FAMILIES[args.family]
        config = BertConfig.preset(preset or args.model, hidden_dropout_prob=0.0,
                                   attention_probs_dropout_prob=0.0, **overrides)
    if args.sweep_blocks:
        sweep_blocks([int(b) for b in args.sweep_blocks.split(",")], 8192, config, args.repeats)
        return
    ours = BertModel(config).eval()
    if args.long:
        print(f"{args.family} {args.size if args.family == 'modernbert' else preset or args.model}: "
              f"{sum(p.numel() for p in ours.parameters()):,} parameters, fp32, {torch.get_num_threads()} threads")
        long_costs(ours, [int(n) for n in args.long.split(",")], config.vocab_size, args.repeats)
        return
    with tempfile.TemporaryDirectory() as tmp:
        ours.save_pretrained(tmp)
        attention = "eager" if args.family in EAGER_ONLY else "sdpa"
        peer, info = transformers.AutoModel.from_pretrained(tmp, attn_implementation=attention,
                                                            output_loading_info=True)
        peer.eval()
    if info["missing_keys"] or info["mismatched_keys"]:  # the peer must run the very same weights
        raise SystemExit(f"transformers did not load every weight bertkit saved: {info}")
    drop = ("token_type_ids",) if config.model_type in ("distilbert", "modernbert", "mpnet") else ()
    name = args.size if args.family == "modernbert" else preset or args.model
    print(f"model {name} ({config.model_type}, {type(peer).__name__} {attention} on the peer side): "
          f"{sum(p.numel() for p in ours.parameters()):,} parameters, fp32, {torch.get_num_threads()} threads")

    if args.family == "modernbert":
        ours = Packing(ours)
        workloads = {
            "fixed 32x512": list(fixed_batches(args.batches, 32, 512, config.vocab_size,
                                               torch.Generator().manual_seed(1))),
            "mixed 64..8192": list(mixed_batches(args.batches, args.mixed_batch, 64, 8192, config.vocab_size,
                                                 torch.Generator().manual_seed(2), config.pad_token_id)),
        }
    else:
        workloads = {
            "fixed 32x128": list(fixed_batches(args.batches, 32, 128, config.vocab_size,
                                               torch.Generator().manual_seed(1))),
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
