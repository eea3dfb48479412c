"""Fine-tuning end to end on small synthetic data with a tiny random model.

Each task trains for a few epochs on data a tiny model can fit: the training loss must fall, the
outputs must have the right shapes and labels, and the output directory must load in
`transformers`' matching class with the same logits (≤ 1e-5).
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors.torch import load_file

from bertkit.data.scoring import squad_scores
from bertkit.data.tokenizer import BertTokenizer
from bertkit.inference.jobs import predict_file
from bertkit.train import finetune as ft

from finetune_fixtures import FILLER, NEG, POS, sentiment_rows, write_jsonl
from pretrain_fixtures import one_thread, tiny_pretrained  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")


# fp32: results must not depend on which precision this machine's probe finds faster.
FAST = dict(lr=2e-3, batch_size=16, max_length=32, progress=False, warmup_ratio=0.0, seed=0,
            precision="fp32")


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory, minilm_dir):
    """A tiny randomly initialised pre-training checkpoint with the MiniLM tokenizer."""
    return tiny_pretrained(tmp_path_factory.mktemp("base"), minilm_dir)


def epochs_of(out_dir):
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def transformers_logits(cls_name, out_dir, batch, field="logits"):
    import transformers

    model = getattr(transformers, cls_name).from_pretrained(out_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        return getattr(model(**batch), field)


# ---------------------------------------------------------------------------------------------
def test_classify_end_to_end_with_transformers_parity(tmp_path, base_dir):
    train = write_jsonl(tmp_path / "train.jsonl", sentiment_rows(128, 1))
    dev = write_jsonl(tmp_path / "dev.jsonl", sentiment_rows(40, 2))
    out = tmp_path / "out"
    result = ft.finetune("classify", base_dir, train, out, eval_file=dev, epochs=4, **FAST)

    records = epochs_of(out)
    assert records[-1]["train_loss"] < 0.5 * records[0]["train_loss"]
    assert result["status"] == "done" and result["metric"] == "accuracy"
    assert result["eval"]["accuracy"] >= 0.9  # keyword sentiment is easy once learned
    assert result["data"]["labels"] == "labels: 2 classes (neg, pos) from column 'label'"
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "neg", "1": "pos"} and config["label2id"] == {"neg": 0, "pos": 1}
    saved = json.loads((out / "finetune_config.json").read_text())
    assert saved["task"] == "classify" and saved["lr"] == 2e-3 and saved["eval"] == str(dev)
    assert (out / "vocab.txt").is_file() and (out / "eval.json").is_file()

    # the output loads in transformers with the same logits
    from bertkit.encoder.heads import BertForSequenceClassification
    tok = BertTokenizer.from_pretrained(out)
    batch = tok(["a great film", "the plot was awful and very poor"], padding=True, return_tensors="pt")
    ours = BertForSequenceClassification.from_pretrained(out).eval()
    with torch.no_grad():
        mine = ours(**batch).logits  # (2, 2)
    theirs = transformers_logits("BertForSequenceClassification", out, batch)
    assert mine.shape == (2, 2)
    assert torch.allclose(mine, theirs, atol=1e-5)

    # predict writes a label and probabilities per row
    preds_path = tmp_path / "pred.jsonl"
    summary = predict_file(out, dev, preds_path, progress=False)
    preds = [json.loads(line) for line in preds_path.read_text().splitlines()]
    assert summary["task"] == "classify" and summary["rows"] == len(preds) == 40
    assert all(p["label"] in ("neg", "pos") and abs(sum(p["scores"].values()) - 1) < 1e-5 for p in preds)
    assert [p["line"] for p in preds] == list(range(1, 41))
    with pytest.raises(FileExistsError, match="--overwrite"):
        predict_file(out, dev, preds_path, progress=False)


def test_pair_regression_inferred_from_float_labels(tmp_path, base_dir):
    rng = random.Random(3)
    rows = []
    for _ in range(64):
        a, b = rng.choice(POS + NEG), rng.choice(POS + NEG)
        rows.append({"s1": f"the film was {a}", "s2": f"a {b} plot", "y": 1.0 if (a in POS) == (b in POS) else 0.5})
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    out = tmp_path / "out"
    result = ft.finetune("pair", base_dir, train, out, eval_file=train, epochs=3, text_column="s1",
                         pair_column="s2", label_column="y", **FAST)
    assert result["metric"] == "mse" and "pearson" in result["eval"]
    assert result["data"]["labels"].startswith("regression: numeric labels from column 'y'")
    # a pair model refuses single texts (a .txt file: one text a line)
    lines = tmp_path / "single.txt"
    lines.write_text("the film was good\n", encoding="utf-8")
    with pytest.raises(ValueError, match="holds single texts .* the model is for text pairs"):
        predict_file(out, lines, tmp_path / "pred.jsonl", progress=False)
    config = json.loads((out / "config.json").read_text())
    assert config["problem_type"] == "regression" and len(config["id2label"]) == 1
    records = epochs_of(out)
    assert records[-1]["train_loss"] < records[0]["train_loss"]


# ---------------------------------------------------------------------------------------------
NAMES, CITIES = ["john", "mary", "peter", "anna"], [["paris"], ["london"], ["new", "york"]]


def ner_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        tokens, tags = [], []
        for _ in range(rng.randint(3, 7)):
            kind = rng.random()
            if kind < 0.25:
                tokens.append(rng.choice(NAMES))
                tags.append("B-PER")
            elif kind < 0.45:
                city = rng.choice(CITIES)
                tokens += city
                tags += ["B-LOC"] + ["I-LOC"] * (len(city) - 1)
            else:
                tokens.append(rng.choice(FILLER))
                tags.append("O")
        rows.append({"tokens": tokens, "tags": tags})
    return rows


def test_ner_end_to_end_with_transformers_parity(tmp_path, base_dir):
    train = write_jsonl(tmp_path / "train.jsonl", ner_rows(160, 1))
    dev = tmp_path / "dev.conll"
    dev.write_text("".join("".join(f"{w}\t{t}\n" for w, t in zip(r["tokens"], r["tags"])) + "\n"
                           for r in ner_rows(30, 2)), encoding="utf-8")
    out = tmp_path / "out"
    result = ft.finetune("ner", base_dir, train, out, eval_file=dev, epochs=4, **FAST)
    records = epochs_of(out)
    assert records[-1]["train_loss"] < 0.5 * records[0]["train_loss"]
    assert result["metric"] == "f1" and result["eval"]["f1"] > 0.5
    assert set(result["eval"]["per_type"]) <= {"PER", "LOC"}
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "O", "1": "B-LOC", "2": "I-LOC", "3": "B-PER", "4": "I-PER"}

    tok = BertTokenizer.from_pretrained(out)
    batch = tok(["john lives in new york", "anna"], padding=True, return_tensors="pt")
    from bertkit.encoder.heads import BertForTokenClassification
    with torch.no_grad():
        mine = BertForTokenClassification.from_pretrained(out).eval()(**batch).logits  # (2, T, 5)
    theirs = transformers_logits("BertForTokenClassification", out, batch)
    assert mine.shape == (2, batch["input_ids"].shape[1], 5)
    mask = batch["attention_mask"].bool()  # padding positions carry no meaning in either model
    assert torch.allclose(mine[mask], theirs[mask], atol=1e-5)

    # raw text in, entities with character offsets out
    text = tmp_path / "raw.txt"
    text.write_text("mary visited paris\n", encoding="utf-8")
    predict_file(out, text, tmp_path / "ents.jsonl", progress=False)
    (row,) = [json.loads(line) for line in (tmp_path / "ents.jsonl").read_text().splitlines()]
    for entity in row["entities"]:
        assert "mary visited paris"[entity["start"]:entity["end"]] == entity["text"]
        assert entity["type"] in ("PER", "LOC")
    # CoNLL words in: tags per word, as evaluation decodes them (the dev F1 is measured on these)
    predict_file(out, dev, tmp_path / "tags.jsonl", progress=False)
    rows = [json.loads(line) for line in (tmp_path / "tags.jsonl").read_text().splitlines()]
    gold = [r["tags"] for r in ner_rows(30, 2)]
    assert [r["tokens"] for r in rows] == [r["tokens"] for r in ner_rows(30, 2)]
    from bertkit.data.scoring import entity_scores
    assert entity_scores([r["tags"] for r in rows], gold).f1 == pytest.approx(result["eval"]["f1"])


# ---------------------------------------------------------------------------------------------
def squad_rows(n: int, seed: int, v2: bool) -> dict:
    rng = random.Random(seed)
    paragraphs = []
    for i in range(n):
        city = rng.choice(["paris", "london", "berlin", "rome"])
        fill = " ".join(rng.choices(FILLER, k=rng.randint(2, 6)))
        context = f"{fill} the capital is {city} . {fill}"
        start = context.index(f"is {city}") + 3
        qa = {"id": f"q{i}", "question": "what is the capital ?",
              "answers": [{"text": city, "answer_start": start}]}
        qas = [qa]
        if v2 and i % 3 == 0:
            qas.append({"id": f"n{i}", "question": "who is the king ?", "answers": [], "is_impossible": True})
        paragraphs.append({"context": context, "qas": qas})
    return {"version": "v2.0" if v2 else "1.1", "data": [{"title": "x", "paragraphs": paragraphs}]}


@pytest.mark.parametrize("v2", [False, True])
def test_qa_end_to_end_with_transformers_parity(tmp_path, base_dir, v2):
    train = tmp_path / "train.json"
    train.write_text(json.dumps(squad_rows(96, 1, v2)), encoding="utf-8")
    dev = tmp_path / "dev.json"
    dev.write_text(json.dumps(squad_rows(20, 2, v2)), encoding="utf-8")
    out = tmp_path / "out"
    result = ft.finetune("qa", base_dir, train, out, eval_file=dev, epochs=3,
                         **{**FAST, "max_length": 48})
    records = epochs_of(out)
    assert records[-1]["train_loss"] < records[0]["train_loss"]
    assert result["metric"] == "f1" and result["eval"]["total"] == (27 if v2 else 20)
    assert (result["eval"]["no_ans_total"] > 0) == v2
    assert json.loads((out / "finetune_config.json").read_text())["version_2_with_negative"] == v2

    tok = BertTokenizer.from_pretrained(out)
    batch = tok(["what is the capital ?"], ["film the capital is rome ."], return_tensors="pt")
    from bertkit.encoder.heads import BertForQuestionAnswering
    with torch.no_grad():
        mine = BertForQuestionAnswering.from_pretrained(out).eval()(**batch)
    for field in ("start_logits", "end_logits"):
        theirs = transformers_logits("BertForQuestionAnswering", out, batch, field)
        assert getattr(mine, field).shape == batch["input_ids"].shape
        assert torch.allclose(getattr(mine, field), theirs, atol=1e-5)

    predict_file(out, dev, tmp_path / "answers.jsonl", progress=False)
    rows = [json.loads(line) for line in (tmp_path / "answers.jsonl").read_text().splitlines()]
    contexts = {qa["id"]: p["context"] for p in json.loads(dev.read_text())["data"][0]["paragraphs"]
                for qa in p["qas"]}
    assert len(rows) == len(contexts)
    for row in rows:  # spans of the passage at their offsets, or ""
        (best,) = row["answers"]
        assert contexts[row["id"]][best["start"]:best["end"]] == best["text"]
    # The answers fine-tuning's evaluation scored are `bertkit qa`'s: the same F1 on the dev file.
    predictions = {row["id"]: row["answers"][0]["text"] for row in rows}
    gold = {qa["id"]: [a["text"] for a in qa["answers"]] for p in json.loads(dev.read_text())["data"][0]["paragraphs"]
            for qa in p["qas"]}
    assert squad_scores(predictions, gold).f1 == pytest.approx(result["eval"]["f1"])
    task = ft.QATask(ft.FinetuneConfig(**json.loads((out / "finetune_config.json").read_text())),
                     BertTokenizer.from_pretrained(out))
    examples, _ = task.read(str(dev), training=False)
    from bertkit.encoder.heads import BertForQuestionAnswering as QA
    assert task.answers(QA.from_pretrained(out), examples) == predictions


# ---------------------------------------------------------------------------------------------
def test_freeze_encoder_trains_the_head_only(tmp_path, base_dir):
    train = write_jsonl(tmp_path / "train.jsonl", sentiment_rows(32, 1))
    out = tmp_path / "out"
    ft.finetune("classify", base_dir, train, out, epochs=1, freeze_encoder=True, **FAST)
    before, after = load_file(str(base_dir / "model.safetensors")), load_file(str(out / "model.safetensors"))
    encoder = [k for k in after if k.startswith("bert.")]
    assert encoder and all(torch.equal(after[k], before[k]) for k in encoder)
    assert "classifier.weight" in after and "classifier.weight" not in before


def test_default_lr_follows_the_model_width(tmp_path, base_dir):
    assert ft.default_lr(128) == ft.default_lr(256) == 1e-3  # tiny, mini
    assert ft.default_lr(512) == 1e-4 and ft.default_lr(768) == ft.default_lr(1024) == 3e-5
    train = write_jsonl(tmp_path / "train.jsonl", sentiment_rows(32, 1))
    settings = {k: v for k, v in FAST.items() if k != "lr"}
    ft.finetune("classify", base_dir, train, tmp_path / "out", epochs=1, **settings)
    saved = json.loads((tmp_path / "out" / "finetune_config.json").read_text())
    assert saved["lr"] == 1e-3  # the tiny model's rate, stored as used
    first = json.loads((tmp_path / "out" / "steps.jsonl").read_text().splitlines()[0])
    assert first["lr"] == 1e-3  # warmup_ratio 0: the first step runs at the peak


def test_bf16_precision_trains_and_is_reported(tmp_path, base_dir):
    train = write_jsonl(tmp_path / "train.jsonl", sentiment_rows(128, 1))
    out = tmp_path / "out"
    result = ft.finetune("classify", base_dir, train, out, eval_file=train, epochs=4,
                         **{**FAST, "precision": "bf16"})
    records = epochs_of(out)  # fp32 on the same data: 0.694 → 0.026, bf16 0.694 → 0.026
    assert records[-1]["train_loss"] < 0.5 * records[0]["train_loss"]
    assert result["data"]["precision"] == "bf16"
    # weights stay fp32 under autocast
    assert load_file(out / "model.safetensors")["classifier.weight"].dtype == torch.float32
    with pytest.raises(ValueError, match="precision must be one of auto, fp32, bf16, got 'fp16'"):
        ft.FinetuneConfig(task="classify", model=str(base_dir), train=str(train),
                          out_dir=str(tmp_path / "x"), precision="fp16")


def test_a_crash_keeps_the_finished_epochs(tmp_path, base_dir, monkeypatch):
    train = write_jsonl(tmp_path / "train.jsonl", sentiment_rows(32, 1))
    calls = []
    real = ft.ClassifyTask.evaluate

    def flaky(self, model, examples, source):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("disk on fire")
        return real(self, model, examples, source)

    monkeypatch.setattr(ft.ClassifyTask, "evaluate", flaky)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="disk on fire"):
        ft.finetune("classify", base_dir, train, out, eval_file=train, epochs=3, **FAST)
    summary = json.loads((out / "eval.json").read_text())
    assert summary["status"] == "failed" and summary["best_epoch"] == 1
    assert "disk on fire" in summary["error"]
    assert len(epochs_of(out)) == 1 and epochs_of(out)[0]["saved"]
    # the epoch-1 model is complete and loads
    from bertkit.encoder.heads import BertForSequenceClassification
    BertForSequenceClassification.from_pretrained(out)


def test_early_stopping_after_patience(tmp_path, base_dir, monkeypatch):
    train = write_jsonl(tmp_path / "train.jsonl", sentiment_rows(16, 1))
    monkeypatch.setattr(ft.ClassifyTask, "evaluate", lambda self, model, examples, source: {"accuracy": 0.5})
    out = tmp_path / "out"
    result = ft.finetune("classify", base_dir, train, out, eval_file=train, epochs=6, patience=2, **FAST)
    assert result["stopped_early"] and result["epochs_run"] == 3 and result["best_epoch"] == 1


def test_bad_inputs_fail_early_with_the_fix(tmp_path, base_dir):
    train = write_jsonl(tmp_path / "train.jsonl", sentiment_rows(16, 1))
    dev = write_jsonl(tmp_path / "dev.jsonl", [{"text": "so so", "label": "neutral"}])
    with pytest.raises(ValueError, match="label 'neutral' was not in the training data"):
        ft.finetune("classify", base_dir, train, tmp_path / "a", eval_file=dev, **FAST)
    with pytest.raises(ValueError, match="--tokenizer"):
        ft.finetune("classify", "tiny", train, tmp_path / "b", **FAST)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        ft.finetune("classify", base_dir, train, tmp_path / "c", **{**FAST, "max_length": 1024})
    with pytest.raises(ValueError, match="use it with --task classify"):
        ft.finetune("ner", base_dir, "builtin:zh-sentiment", tmp_path / "d", **FAST)
    done = tmp_path / "done"
    ft.finetune("classify", base_dir, train, done, epochs=1, **FAST)
    with pytest.raises(FileExistsError, match="--overwrite"):
        ft.finetune("classify", base_dir, train, done, epochs=1, **FAST)
    ft.finetune("classify", base_dir, train, done, epochs=1, overwrite=True, **FAST)


def test_preset_with_tokenizer_and_builtin_dataset(tmp_path, minilm_dir):
    out = tmp_path / "out"
    # Each article scored by its first window (at 32 pieces an article has ~30): what is claimed
    # here is which splits were scored; windows are test_finetune_eval_windows.py's.
    result = ft.finetune("classify", "tiny", "builtin:en-news", out, tokenizer=minilm_dir, epochs=1,
                         max_train_examples=48, eval_windows=False, **FAST)
    # the built-in set brought its dev split for evaluation and its test split for the end
    assert result["eval"]["n"] == 212 and result["test"]["n"] == 214
    config = json.loads((out / "config.json").read_text())
    assert sorted(config["label2id"]) == ["business", "entertainment", "politics", "sports", "tech"]


def test_cli_finetune_predict_and_errors(tmp_path, base_dir, capsys):
    from bertkit import cli

    train = write_jsonl(tmp_path / "train.jsonl", sentiment_rows(16, 1))
    out = tmp_path / "out"
    assert cli.main(["finetune", "--task", "classify", "--model", str(base_dir), "--train", str(train),
                     "--out", str(out), "--epochs", "1", "--max-length", "32", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["status"] == "done"
    assert cli.main(["predict", "--model", str(out), "--input", str(train), "--out",
                     str(tmp_path / "p.jsonl"), "--no-progress"]) == 0
    assert len((tmp_path / "p.jsonl").read_text().splitlines()) == 16
    # a library error is one line on stderr and exit status 2
    assert cli.main(["finetune", "--task", "classify", "--model", str(base_dir), "--train",
                     str(tmp_path / "missing.csv"), "--out", str(tmp_path / "x")]) == 2
    assert "no such file" in capsys.readouterr().err
