"""Model cards: the README.md every saved model carries, as sentence-transformers and PEFT write one.

A card is YAML front matter (library_name, base_model, tags, pipeline_tag, datasets) and a body:
the base, the data, the task and its loss, the hyper-parameters, the run's results, and how to use
the model from bertkit, sentence-transformers (models saved in its format) and transformers (PEFT
for an adapter). Every fact is read from what the run saved beside the model (its
*_config.json, eval.json or summary.json, adapter_config.json, config.json), never from the
process that trained it: a card written again from the same directory is the same card.

    finetune_card("runs/topics")      # finetune (every task, LoRA merged or as an adapter)
    pretrain_card("runs/mini")        # writes runs/mini/model/README.md
    distill_card("runs/student")      # writes runs/student/model/README.md

A README.md that bertkit did not write (no `MARK` line) is never replaced: the card is then not
written and the function returns None.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertkit.constants import FINETUNE_CONFIG
from bertkit.util.fileio import atomic_write_text

log = logging.getLogger(__name__)

CARD = "README.md"
MARK = "<!-- model card written by bertkit from this run's saved files; delete this line to keep your edits -->"
BUILTIN_PREFIX = "builtin:"

# The Hub's pipeline tag of each task (sentence-transformers' for embed, rerank and sparse).
PIPELINE_TAGS = {"classify": "text-classification", "pair": "text-classification", "ner": "token-classification",
                 "qa": "question-answering", "embed": "sentence-similarity", "rerank": "text-ranking",
                 "sparse": "feature-extraction", "fill-mask": "fill-mask", "rtd": "feature-extraction"}
TASK_WORDS = {"classify": "text classification", "pair": "sentence-pair classification",
              "ner": "named-entity recognition (token classification)", "qa": "extractive question answering",
              "embed": "sentence embeddings (a bi-encoder)", "rerank": "reranking (a cross-encoder)",
              "sparse": "SPLADE sparse embeddings", "fill-mask": "masked-language-model pre-training",
              "rtd": "replaced-token detection pre-training (ELECTRA's discriminator; its generator is in generator/)"}
# transformers' auto class of each task's head
AUTO_CLASSES = {"classify": "AutoModelForSequenceClassification", "pair": "AutoModelForSequenceClassification",
                "rerank": "AutoModelForSequenceClassification", "ner": "AutoModelForTokenClassification",
                "qa": "AutoModelForQuestionAnswering", "embed": "AutoModel", "sparse": "AutoModelForMaskedLM",
                "fill-mask": "AutoModelForMaskedLM", "rtd": "AutoModelForPreTraining"}
# Settings that say where or how a run executed, not what it trained: left out of the table.
NOT_HYPERPARAMETERS = {"out_dir", "out", "progress", "overwrite", "resume", "save_every", "eval_batch_size",
                       "device", "log_every", "num_workers", "eval_batches", "compile", "time_limit",
                       "max_bad_steps", "eval_every", "model", "train", "eval", "test", "tokenizer", "data",
                       "teacher", "unlabeled", "init", "task", "mine_model"}
# FinetuneConfig's settings that only one family of its tasks reads: left out of the others' tables.
TASK_SETTINGS = {("classify", "pair"): {"text_column", "pair_column", "label_column", "problem_type", "eval_windows"},
                 ("ner",): {"tokens_key", "tags_key", "ner_invalid"},
                 ("qa",): {"max_query_length", "max_answer_length", "n_best", "null_score_diff_threshold",
                           "version_2_with_negative"}}


@dataclass
class Facts:
    """What a card says, each read from the run's files (see the module docstring)."""
    model_dir: Path  # where the model (and its card) lies
    task: str  # a key of TASK_WORDS
    trained_by: str  # "finetune", "pretrain", "distill"
    base: str | None  # the model it started from (None: random initialisation)
    start: str  # one sentence on how it started
    data: dict[str, str]  # role (train, eval, test, ...) → source as the run named it
    loss: str
    settings: dict[str, Any]  # the hyper-parameters
    results: dict[str, dict[str, Any]]  # split → metric → value
    notes: list[str] = field(default_factory=list)  # more lines of the run (steps, best epoch, ...)
    adapter: dict[str, Any] | None = None  # adapter_config.json of a LoRA adapter directory
    labels: list[str] | None = None


# ---------------------------------------------------------------------------------------------
# reading a run
# ---------------------------------------------------------------------------------------------
def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _hyperparameters(config: dict[str, Any], **resolved: Any) -> dict[str, Any]:
    others = {key for tasks, keys in TASK_SETTINGS.items() if config.get("task") not in tasks for key in keys}
    settings = {k: v for k, v in config.items()
                if k not in NOT_HYPERPARAMETERS and k not in others and v is not None and v != {}}
    if not config.get("lora"):
        settings.pop("lora_save", None)  # how LoRA would have been saved, in a run without it
    settings.update({k: v for k, v in resolved.items() if v is not None})
    return settings


def _labels(model_dir: Path, side: dict[str, Any]) -> list[str] | None:
    if side.get("labels"):
        return list(side["labels"])
    id2label = _json(model_dir / "config.json").get("id2label") or {}
    return [id2label[k] for k in sorted(id2label, key=int)] if id2label else None


def _scores(value: Any) -> dict[str, Any]:
    """The scalar figures of a result dict (nested reports and lists left out)."""
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def finetune_facts(out_dir: str | Path) -> Facts:
    """A finetune run's facts: finetune_config.json, eval.json (and adapter files) in `out_dir`."""
    out = Path(out_dir)
    config, summary = _json(out / FINETUNE_CONFIG), _json(out / "eval.json")
    task = config.get("task", "classify")
    adapter = _json(out / "adapter_config.json") or None
    side = _json(out / "bertkit_adapter.json")
    model = config.get("model")
    preset = model is not None and not Path(model).is_dir() and config.get("tokenizer") is not None
    base = None if preset else (adapter or {}).get("base_model_name_or_path") or model
    start = (f"randomly initialised from the preset {model!r} (tokenizer {config.get('tokenizer')})" if preset
             else f"fine-tuned from {base}")
    if config.get("lora"):
        kept = "kept as a PEFT adapter over it" if adapter else "merged into the weights"
        start += f", with LoRA ({config['lora']}) {kept}"
    elif config.get("freeze_encoder"):
        start += ", the encoder frozen (the head alone trained)"
    data = {role: config[role] for role in ("train", "eval", "test") if config.get(role)}
    reports = summary.get("data") or {}
    results = {split: _scores(summary.get(split)) for split in ("eval", "test")}
    notes = []
    if summary.get("best_epoch") is not None:
        notes.append(f"best epoch {summary['best_epoch']} of {summary.get('epochs_run')} by {summary.get('metric')}"
                     + (" (stopped early)" if summary.get("stopped_early") else ""))
    for key, words in (("train_loss", "last epoch's mean training loss"), ("first_loss", "first step's loss"),
                       ("last_loss", "last steps' mean loss"), ("steps", "optimizer steps")):
        if summary.get(key) is not None:
            notes.append(f"{words}: {_number(summary[key])}")
    examples = summary.get("train_examples", reports.get("train_examples"))
    if examples is not None:
        notes.append(f"training examples: {examples:,}")
    if summary.get("seconds") is not None:
        notes.append(f"training time: {summary['seconds']:.0f} s")
    return Facts(out, task, "finetune", base, start, data, _finetune_loss(task, config), _hyperparameters(
        config, precision=reports.get("precision")), {k: v for k, v in results.items() if v}, notes, adapter,
        _labels(out, side) if task in ("classify", "pair", "ner") else None)


def _finetune_loss(task: str, config: dict[str, Any]) -> str:
    if task in ("classify", "pair"):
        kind = config.get("problem_type") or "single_label_classification"
        return {"regression": "mean squared error on the one output",
                "multi_label_classification": "binary cross-entropy per label"}.get(
                    kind, "cross-entropy over the labels")
    if task == "ner":
        return "cross-entropy over each word's first piece (other pieces and padding ignored, -100)"
    if task == "qa":
        return "cross-entropy of the answer's start and end positions, averaged"
    if task == "embed":
        return (f"in-batch negatives (sentence-transformers' MultipleNegativesRankingLoss), cosine × scale "
                f"{config.get('scale')}, {config.get('hard_negatives')} hard negative(s) per row")
    if task == "rerank":
        return (f"{config.get('loss')} over a positive and {config.get('negatives')} negatives "
                f"(mined by {config.get('mine')})")
    if task == "sparse":
        return (f"in-batch negatives on SPLADE dot products plus FLOPS regularisation (query "
                f"{config.get('flops_query_weight')}, document {config.get('flops_doc_weight')})")
    return "the task's loss"


def pretrain_facts(run_dir: str | Path) -> Facts:
    """A pre-training run's facts: pretrain_config.json and summary.json of RUN_DIR; the model is
    RUN_DIR/model."""
    run = Path(run_dir)
    config, summary = _json(run / "pretrain_config.json"), _json(run / "summary.json")
    objective = config.get("objective") or _json(Path(config.get("data") or run) / "meta.json").get("objective")
    base = config.get("init")
    start = (f"pre-training continued from {base}" if base
             else f"pre-trained from random weights (architecture {config.get('model')})")
    loss = "masked-language-model cross-entropy at the masked positions"
    if objective == "rtd":
        loss = (f"the generator's {loss} + {config.get('rtd_weight')} × the discriminator's "
                "replaced-or-original binary cross-entropy over every token")
    elif objective and "+" in objective:
        loss += f" plus the {objective.split('+', 1)[1].upper()} sentence-pair cross-entropy"
    notes = [f"optimizer steps: {summary.get('steps')} of {summary.get('total_steps')}"]
    if summary.get("tokens_seen"):
        notes.append(f"tokens seen: {summary['tokens_seen']:,}")
    if summary.get("stopped"):
        notes.append(f"stopped early: {summary['stopped']} (resumable)")
    results = {"train (last window)": _scores(summary.get("train")), "held-out": _scores(summary.get("eval"))}
    task = "rtd" if objective == "rtd" else "fill-mask"
    return Facts(run / "model", task, "pretrain", base, start, {"data": config.get("data", "")}, loss,
                 _hyperparameters(config, objective=objective, precision=summary.get("precision"),
                                  world_size=summary.get("world_size")),
                 {k: v for k, v in results.items() if v}, notes)


def distill_facts(run_dir: str | Path) -> Facts:
    """A distillation run's facts: distill_config.json and summary.json of RUN_DIR; the model is
    RUN_DIR/model."""
    run = Path(run_dir)
    config, summary = _json(run / "distill_config.json"), _json(run / "summary.json")
    task = config.get("task") or "fill-mask"
    teacher = config.get("teacher")
    start = (f"distilled from the teacher {teacher}: {summary.get('layers') and len(summary['layers'])} of its "
             f"{summary.get('teacher_layers')} layers (teacher layers {summary.get('layers')}), "
             f"{summary.get('student_parameters', 0):,} parameters against {summary.get('teacher_parameters', 0):,}")
    loss = (f"{config.get('alpha_ce')} × soft cross-entropy with the teacher at temperature "
            f"{config.get('temperature')} + {config.get('alpha_hard')} × "
            f"{'the MLM loss' if task == 'fill-mask' else 'the labels cross-entropy'} + "
            f"{config.get('alpha_cos')} × cosine loss of the hidden states")
    data = {role: config[role] for role in ("data", "train", "unlabeled", "eval", "test") if config.get(role)}
    results = {split: _scores(summary.get(split)) for split in ("eval", "test")}
    notes = [f"optimizer steps: {summary.get('steps')}"]
    if summary.get("seconds") is not None:
        notes.append(f"training time: {summary['seconds']:.0f} s")
    return Facts(run / "model", task, "distill", teacher, start, data, loss,
                 _hyperparameters(config, precision=summary.get("precision")),
                 {k: v for k, v in results.items() if v}, notes,
                 labels=_labels(run / "model", {}) if task in ("classify", "ner") else None)


# ---------------------------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------------------------
def finetune_card(out_dir: str | Path) -> Path | None:
    return write_card(finetune_facts(out_dir))


def pretrain_card(run_dir: str | Path) -> Path | None:
    return write_card(pretrain_facts(run_dir))


def distill_card(run_dir: str | Path) -> Path | None:
    return write_card(distill_facts(run_dir))


def write_card(facts: Facts) -> Path | None:
    """facts.model_dir/README.md (atomically), unless a README.md that bertkit did not write is
    there: that one stays, and None is returned."""
    path = facts.model_dir / CARD
    if not facts.model_dir.is_dir():  # a run stopped before its first model was saved
        return None
    if path.is_file() and MARK not in path.read_text(encoding="utf-8", errors="replace"):
        log.warning("%s was not written by bertkit; the model card is not written over it", path)
        return None
    atomic_write_text(path, render(facts))
    return path


def drop_stale(model_dir: str | Path) -> None:
    """Remove a card bertkit wrote for an earlier run of this directory (a run started afresh over
    it); a README.md of anyone else's stays."""
    path = Path(model_dir) / CARD
    if path.is_file() and MARK in path.read_text(encoding="utf-8", errors="replace"):
        path.unlink()


def render(facts: Facts) -> str:
    """The card's text: front matter, then the sections."""
    lines = ["---", *_front_matter(facts), "---", MARK, "", f"# {facts.model_dir.name}", "",
             f"A BERT-family model for {TASK_WORDS.get(facts.task, facts.task)}, {facts.start}; trained by "
             f"`bertkit {facts.trained_by}`.", ""]
    lines += ["## Training", "", f"- **Base:** {facts.base or 'none (random initialisation)'}",
              f"- **Task:** {TASK_WORDS.get(facts.task, facts.task)}", f"- **Loss:** {facts.loss}"]
    lines += [f"- **Data ({role}):** {source}" for role, source in facts.data.items()]
    if facts.labels:
        lines.append(f"- **Labels:** {', '.join(map(str, facts.labels))}")
    lines += [f"- {note}" for note in facts.notes]
    lines += ["", "### Hyper-parameters", "", "| setting | value |", "|---|---|"]
    lines += [f"| {key} | {_cell(value)} |" for key, value in facts.settings.items()]
    if facts.results:
        lines += ["", "## Results", "", "| split | metric | value |", "|---|---|---|"]
        lines += [f"| {split} | {metric} | {_number(value)} |" for split, scores in facts.results.items()
                  for metric, value in scores.items()]
    lines += ["", "## Usage", "", *_usage(facts), ""]
    return "\n".join(lines)


def _front_matter(facts: Facts) -> list[str]:
    adapter = facts.adapter is not None
    sentence_transformers = _sentence_transformers(facts)
    library = "peft" if adapter else "sentence-transformers" if sentence_transformers else "transformers"
    tags = ["bertkit", facts.trained_by, facts.task]
    if adapter:
        tags.append("lora")
    if sentence_transformers:
        tags.append("sentence-transformers")
    out = [f"library_name: {library}"]
    if facts.base:
        out.append(f"base_model: {_yaml(facts.base)}")
    out += ["tags:", *[f"- {_yaml(tag)}" for tag in tags],
            f"pipeline_tag: {PIPELINE_TAGS.get(facts.task, 'feature-extraction')}"]
    datasets = [source.split(":")[1] for source in facts.data.values() if source.startswith(BUILTIN_PREFIX)]
    if datasets:  # known by name only when the run used a built-in set; a local file is not a dataset id
        out += ["datasets:", *[f"- {_yaml(name)}" for name in dict.fromkeys(datasets)]]
    return out


def _usage(facts: Facts) -> list[str]:
    where = str(facts.model_dir)
    call = {"classify": 'model.classify(["A text to label"])', "pair": 'model.classify(["A text"], ["its pair"])',
            "ner": 'model.ner(["Ada Lovelace worked in London."])',
            "qa": 'model.qa("Who wrote it?", "It was written by Ada.")',
            "embed": 'model.encode(["A sentence", "Another one"])',
            "rerank": 'model.rerank("a query", ["a document", "another"])',
            "sparse": 'model.encode_sparse(["A sentence"])',
            "fill-mask": f'model.fill_mask("Paris is the {_mask_token(facts)} of France.")',
            "rtd": 'model.encode(["A sentence"])  # the discriminator as an encoder'}[facts.task]
    out = ["With bertkit:", "", "```python", "import bertkit", "", f"model = bertkit.load({where!r})", call, "```"]
    if facts.adapter is not None:
        out += ["", f"The adapter runs over its base, {facts.base} (`bertkit.load(ADAPTER_DIR, base=BASE_DIR)` "
                "where the base lies elsewhere); `bertkit serve` serves it beside other adapters of that base."]
    if _sentence_transformers(facts):
        kind = {"rerank": "CrossEncoder", "sparse": "SparseEncoder"}.get(facts.task, "SentenceTransformer")
        use = {"rerank": 'model.rank("a query", ["a document", "another"])'}.get(facts.task,
                                                                               'model.encode(["A sentence"])')
        out += ["", "With sentence-transformers:", "", "```python", f"from sentence_transformers import {kind}", "",
                f"model = {kind}({where!r})", use, "```"]
    auto = AUTO_CLASSES.get(facts.task, "AutoModel")
    out += ["", "With transformers" + (" and PEFT" if facts.adapter is not None else "") + ":", "", "```python"]
    if facts.adapter is not None:
        count = 1 if facts.task == "rerank" else len(facts.labels) if facts.labels else None
        labels = f", num_labels={count}" if count else ""
        out += ["from peft import PeftModel", f"from transformers import AutoTokenizer, {auto}", "",
                f"base = {auto}.from_pretrained({str(facts.base)!r}{labels})",
                f"model = PeftModel.from_pretrained(base, {where!r})",
                f"tokenizer = AutoTokenizer.from_pretrained({where if _has_tokenizer(facts) else str(facts.base)!r})"]
    else:
        out += [f"from transformers import AutoTokenizer, {auto}", "",
                f"model = {auto}.from_pretrained({where!r})", f"tokenizer = AutoTokenizer.from_pretrained({where!r})"]
    return [*out, "```"]


def _sentence_transformers(facts: Facts) -> bool:
    """Whether sentence-transformers loads the model: its own files (modules.json), or a full
    one-logit classifier, which its CrossEncoder reads as it is."""
    if facts.adapter is not None:
        return False
    return (facts.model_dir / "modules.json").is_file() or facts.task == "rerank"


def _has_tokenizer(facts: Facts) -> bool:
    return any((facts.model_dir / name).is_file() for name in ("tokenizer.json", "vocab.txt"))


def _mask_token(facts: Facts) -> str:
    return str(_json(facts.model_dir / "tokenizer_config.json").get("mask_token") or "[MASK]")


def _number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 1e4 else f"{value:.4g}"
    return str(value)


def _cell(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if isinstance(value, (dict, list)) else str(value)
    return text.replace("|", "\\|")


def _yaml(text: str) -> str:
    """A YAML scalar: quoted when plain style would change its meaning."""
    plain = text and not any(c in text for c in ":#{}[],&*!|>'\"%@`") and text.strip() == text
    return text if plain else json.dumps(text, ensure_ascii=False)


__all__ = ["CARD", "MARK", "Facts", "drop_stale", "finetune_card", "pretrain_card", "distill_card", "finetune_facts",
           "pretrain_facts", "distill_facts", "write_card", "render"]
