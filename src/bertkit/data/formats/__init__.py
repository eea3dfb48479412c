"""Fine-tuning data for the four downstream task types.

- `classify` — single texts and sentence pairs (CSV / TSV / JSONL), classes or regression;
- `ner` — token tagging (CoNLL / JSONL, BIO / BIOES), word-piece alignment, window stitching;
- `qa` — extractive QA on SQuAD v1.1 / v2.0 JSON, sliding windows, n-best span decoding;
- `common` — row reading, bad-row reports, word pieces, windows and padding they share.
"""

from bertkit.data.formats.classify import ClassifyColumns, ClassifyExample, LabelSpace, read_classify
from bertkit.data.formats.common import WordPieces
from bertkit.data.formats.ner import NerSentence, read_ner
from bertkit.data.formats.qa import QAExample, QAPrediction, QASettings, read_squad
from bertkit.data.report import DataReport

TASKS = ("classify", "pair", "ner", "qa")

__all__ = ["TASKS", "ClassifyColumns", "ClassifyExample", "LabelSpace", "read_classify", "DataReport",
           "WordPieces", "NerSentence", "read_ner", "QAExample", "QAPrediction", "QASettings",
           "read_squad"]
