"""The data an evaluation reads: BEIR directories, first-stage runs, scored and labelled pairs,
labelled texts, and the built-in sets in the same shapes.

- A BEIR directory (Thakur et al. 2021, the layout MTEB's retrieval tasks load too):
  `corpus.jsonl` ({"_id", "title", "text"} a line), `queries.jsonl` ({"_id", "text"}),
  `qrels/SPLIT.tsv` (a header `query-id  corpus-id  score`, then one judgement a line, integer
  scores as trec_eval reads them). A document reads as its title, a space and its text, stripped,
  as BEIR and MTEB feed it to a model.
- A first-stage run to rerank: a TREC run file (`qid Q0 docid rank score tag`, whitespace apart),
  what `pytrec_eval`, Pyserini and BEIR's result writers exchange.
- STS and pair-classification files: CSV / TSV / JSON Lines with `sentence1`, `sentence2` and
  `score` (STS) or `label` (0 / 1, pair classification), MTEB's column names.
- Classification files: `text` and `label`, the fine-tuning format (`data.formats.classify`).

Rows that do not parse (invalid JSON, a row without its fields) are reported as file:line, counted
and skipped. A judgement or a candidate naming a query or document the directory does not hold is
an error naming file and line: scoring without it would change the figure silently.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from bertkit.data.formats.classify import ClassifyExample, read_classify
from bertkit.data.labelled import LABELLED_SETS, load_labelled
from bertkit.data.report import DataReport
from bertkit.data.rows import read_rows, text_lines
from bertkit.retrieval.datasets import RETRIEVAL_SETS, load_retrieval
from bertkit.util.fileio import atomic_write_text, check_writable_output

BEIR_FILES = ("corpus.jsonl", "queries.jsonl")


@dataclass
class RetrievalData:
    """A retrieval task: what the model reads and what was judged.

    corpus: document id → text (title and text joined); queries: query id → text, the judged
    ones; qrels: query id → {document id: grade}. A judged query with no grade above 0 stays: it
    scores 0 on every figure and counts in the means, as trec_eval, BEIR and MTEB count it
    (`unanswerable` says how many there are). skipped: file → rows skipped.
    """

    name: str
    corpus: dict[str, str]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def unanswerable(self) -> int:
        return sum(1 for grades in self.qrels.values() if not any(g > 0 for g in grades.values()))


def read_beir(directory: str | os.PathLike, split: str = "test") -> RetrievalData:
    """A BEIR directory's corpus, the queries judged in qrels/SPLIT.tsv and their judgements."""
    root = Path(directory)
    if not root.exists():
        raise FileNotFoundError(f"no such BEIR directory: {root}; check the path")
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is a file; --beir takes a directory holding corpus.jsonl, "
                                 f"queries.jsonl and qrels/{split}.tsv")
    qrels_path = root / "qrels" / f"{split}.tsv"
    for path in (root / BEIR_FILES[0], root / BEIR_FILES[1], qrels_path):
        if not path.is_file():
            splits = sorted(p.stem for p in (root / "qrels").glob("*.tsv")) if (root / "qrels").is_dir() else []
            other = f" (its qrels/ holds {', '.join(splits)}: pass --split)" if splits and path == qrels_path else ""
            raise FileNotFoundError(f"{path}: no such file; a BEIR directory holds corpus.jsonl, "
                                    f"queries.jsonl and qrels/{split}.tsv{other}")
    skipped: dict[str, int] = {}
    corpus = _jsonl_texts(root / "corpus.jsonl", skipped, title=True)
    queries = _jsonl_texts(root / "queries.jsonl", skipped, title=False)
    qrels = _read_qrels(qrels_path, corpus, queries, skipped)
    return RetrievalData(root.name, corpus, {q: queries[q] for q in qrels}, qrels, skipped)


def _jsonl_texts(path: Path, skipped: dict[str, int], *, title: bool) -> dict[str, str]:
    """_id → text of a BEIR JSON Lines file (documents: title + " " + text, stripped)."""
    report = DataReport(str(path))
    out: dict[str, str] = {}
    for line_no, row in read_rows(path, report, fmt="jsonl"):
        where = f"{path}:{line_no}"
        key, text = row.get("_id"), row.get("text")
        if key is None or not isinstance(text, str):
            report.skip(where, f"no {'_id' if key is None else 'text'} field; each line is "
                        '{"_id": ..., "text": ...}')
            continue
        heading = row.get("title") if title else None
        text = (f"{heading} {text}" if heading else text).strip()
        if not text:
            report.skip(where, "empty text")
        elif str(key) in out:
            report.skip(where, f"_id {key!r} again (its first line is kept)")
        else:
            out[str(key)] = text
    if report.n_skipped:
        skipped[path.name] = report.n_skipped
    report.n_kept = len(out)
    report.require_rows()
    return out


def _read_qrels(path: Path, corpus: dict[str, str], queries: dict[str, str],
                skipped: dict[str, int]) -> dict[str, dict[str, int]]:
    report = DataReport(str(path))
    fix = "BEIR's header is query-id<TAB>corpus-id<TAB>score"
    judged: dict[str, dict[str, int]] = {}
    for line_no, row in read_rows(path, report, fmt="tsv", required=dict.fromkeys(
            ("query-id", "corpus-id", "score"), fix)):
        where = f"{path}:{line_no}"
        query, doc, grade = row.get("query-id"), row.get("corpus-id"), row.get("score")
        if query is None or doc is None or grade is None:
            report.skip(where, "fewer than three fields")
            continue
        try:
            grade = int(grade)
        except ValueError:
            raise ValueError(f"{where}: score {grade!r} is not an integer; trec_eval grades are "
                             "integers (0 = not relevant)") from None
        if query not in queries:
            raise ValueError(f"{where}: query-id {query!r} is not in {path.parent.parent / 'queries.jsonl'}; "
                             "add the query or drop the line")
        if doc not in corpus:
            raise ValueError(f"{where}: corpus-id {doc!r} is not in {path.parent.parent / 'corpus.jsonl'}; "
                             "add the document or drop the line")
        judged.setdefault(query, {})[doc] = grade
    if report.n_skipped:
        skipped[path.name] = report.n_skipped
    if not any(g > 0 for grades in judged.values() for g in grades.values()):
        raise ValueError(f"{path}: no query has a document graded above 0; nothing to score")
    return judged


def builtin_retrieval(name: str, split: str = "test") -> RetrievalData:
    """A built-in retrieval set (`retrieval.datasets`) as a BEIR task: its whole corpus, the
    split's queries, one relevant passage each."""
    data = load_retrieval(name)
    if split not in data.queries:
        raise ValueError(f"builtin:{name} has no split {split!r}; choose one of {', '.join(data.queries)}")
    queries = data.queries[split]
    return RetrievalData(name, dict(data.corpus), {q.id: q.text for q in queries},
                         {q.id: dict.fromkeys(q.relevant, 1) for q in queries})


def write_beir(data: RetrievalData, out_dir: str | os.PathLike, *, split: str = "test",
               overwrite: bool = False) -> Path:
    """Write `data` as a BEIR directory (a built-in set for other tools, or to look at); documents
    get an empty title, their text whole. Returns the directory."""
    out = check_writable_output(out_dir, overwrite=overwrite, kind="dir", outputs=[*BEIR_FILES, "qrels"])
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "corpus.jsonl", "".join(json.dumps({"_id": key, "title": "", "text": text},
                                                               ensure_ascii=False) + "\n"
                                                    for key, text in data.corpus.items()))
    atomic_write_text(out / "queries.jsonl", "".join(json.dumps({"_id": key, "text": text}, ensure_ascii=False) + "\n"
                                                     for key, text in data.queries.items()))
    atomic_write_text(out / "qrels" / f"{split}.tsv", "query-id\tcorpus-id\tscore\n" + "".join(
        f"{query}\t{doc}\t{grade}\n" for query, grades in data.qrels.items() for doc, grade in grades.items()))
    return out


def read_run(path: str | os.PathLike, data: RetrievalData, depth: int) -> dict[str, list[str]]:
    """A TREC run file: query id → its `depth` best document ids (trec_eval's order), for every
    judged query (one missing from the run has no candidates)."""
    from bertkit.retrieval.metrics import trec_order

    report = DataReport(str(path))
    scored: dict[str, dict[str, float]] = {}
    for line_no, line in text_lines(path, report):
        fields = line.split()
        if not fields:
            continue
        where = f"{path}:{line_no}"
        if len(fields) != 6:
            raise ValueError(f"{where}: {len(fields)} fields; a TREC run line is `qid Q0 docid rank score tag`")
        query, _, doc, _, score, _ = fields
        try:
            value = float(score)
        except ValueError:
            raise ValueError(f"{where}: score {score!r} is not a number") from None
        if query not in data.qrels:
            continue  # a query of another split, or one without a relevant document
        if doc not in data.corpus:
            raise ValueError(f"{where}: docid {doc!r} is not in the corpus; the run is of another collection")
        scored.setdefault(query, {})[doc] = value
    return {query: trec_order(scored.get(query, {}))[:depth] for query in data.qrels}


@dataclass
class PairData:
    """Text pairs with a gold value: an STS score, or a 0 / 1 label."""

    name: str
    first: list[str]
    second: list[str]
    gold: list[float]
    skipped: int = 0


def read_pairs(path: str | os.PathLike, gold: str) -> PairData:
    """`sentence1`, `sentence2` and the `gold` column ("score" or "label") of a row file."""
    report = DataReport(str(path))
    columns = ("sentence1", "sentence2", gold)
    first, second, values = [], [], []
    for line_no, row in read_rows(path, report, required=dict.fromkeys(columns, f"name them {', '.join(columns)}")):
        where = f"{path}:{line_no}"
        missing = [c for c in columns if row.get(c) is None or str(row.get(c)).strip() == ""]
        if missing:
            report.skip(where, f"missing {', '.join(missing)}")
            continue
        try:
            value = float(row[gold])
        except (TypeError, ValueError):
            report.skip(where, f"{gold} {row[gold]!r} is not a number")
            continue
        if gold == "label" and value not in (0.0, 1.0):
            raise ValueError(f"{where}: label {row[gold]!r}; pair classification labels are 0 and 1")
        first.append(str(row["sentence1"]))
        second.append(str(row["sentence2"]))
        values.append(value)
    report.n_kept = len(values)
    report.require_rows()
    return PairData(Path(path).stem, first, second, values, report.n_skipped)


def classification_splits(name: str | None = None, train: str | os.PathLike | None = None,
                          test: str | os.PathLike | None = None,
                          split: str = "test") -> tuple[str, list[ClassifyExample], list[ClassifyExample]]:
    """(name, train examples, test examples): a built-in set's train and `split`, or two files."""
    if name is not None:
        return name, load_labelled(name, "train"), load_labelled(name, split)
    examples = {}
    for role, path in (("train", train), ("test", test)):
        examples[role], _ = read_classify(path)
        if any(isinstance(e.label, float) for e in examples[role]):
            raise ValueError(f"{path}: non-integer labels; classification needs class labels")
    return Path(test).stem, examples["train"], examples["test"]


def builtin_kind(name: str) -> str:
    """"retrieval" or "classification" for a built-in set's name; ValueError naming the others."""
    if name in RETRIEVAL_SETS:
        return "retrieval"
    if name in LABELLED_SETS and LABELLED_SETS[name].task == "classify":
        return "classification"
    usable = [*RETRIEVAL_SETS, *(n for n, s in LABELLED_SETS.items() if s.task == "classify")]
    raise ValueError(f"built-in set {name!r} is not one eval scores; choose one of {', '.join(usable)}")
