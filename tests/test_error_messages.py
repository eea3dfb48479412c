"""Regression tests for the error contract: one or more per defect once found.

The CLI-wide matrix (every command × every bad input) is tests/test_cli_contract.py; these pin the
library-level fixes behind it, so Python callers get the same messages.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from bertkit import cli
from bertkit.data.corpus import CorpusStats
from bertkit.data.report import DataReport, plural, read_text
from bertkit.encoder import checkpoint, tasks
from bertkit.encoder.config import BertConfig
from bertkit.encoder.heads import BertForSequenceClassification
from bertkit.encoder.model import BertForPreTraining, BertModel
from bertkit.util.fileio import check_writable_output


def tiny() -> BertConfig:
    return BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                      intermediate_size=37, max_position_embeddings=40)


# ------------------------------------------------------------------ item 1: output locations
def test_check_writable_output_cases(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    with pytest.raises(NotADirectoryError, match="blocker is a file"):
        check_writable_output(blocker / "out.jsonl", overwrite=False)
    with pytest.raises(NotADirectoryError, match="is a file, not a directory"):
        check_writable_output(blocker, overwrite=False, kind="dir")
    (tmp_path / "d").mkdir()
    with pytest.raises(IsADirectoryError, match="is a directory"):
        check_writable_output(tmp_path / "d", overwrite=True)
    with pytest.raises(FileExistsError, match="--overwrite"):
        check_writable_output(blocker, overwrite=False)
    assert check_writable_output(blocker, overwrite=True) == blocker
    (tmp_path / "d" / "vocab.txt").write_text("x")
    with pytest.raises(FileExistsError, match="vocab.txt"):
        check_writable_output(tmp_path / "d", overwrite=False, kind="dir", outputs=["vocab.txt"])
    check_writable_output(tmp_path / "d", overwrite=False, kind="dir", outputs=["meta.json"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker", "d"]  # nothing created


def test_unwritable_location_is_named_with_the_fix(tmp_path, monkeypatch):
    import tempfile

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refused)
    with pytest.raises(ValueError, match=r"cannot write .*out.*Permission denied.*choose another --out"):
        check_writable_output(tmp_path / "a" / "out", overwrite=False, kind="dir")


def test_predict_checks_the_output_before_loading_anything(tmp_path):
    from bertkit.inference.jobs import predict_file as predict

    # The model does not even exist: the output error must come first, before any work.
    (tmp_path / "out").mkdir()
    with pytest.raises(IsADirectoryError, match="is a directory"):
        predict(tmp_path / "no-model", tmp_path / "in.txt", tmp_path / "out", overwrite=True)


def test_predict_on_a_model_without_labels_or_of_another_kind(tmp_path):
    from bertkit.inference.jobs import predict_file as predict

    pt = tmp_path / "pt"
    BertForPreTraining(tiny()).save_pretrained(pt)
    with pytest.raises(ValueError, match="pre-trained encoder.*fine-tune it first"):
        predict(pt, tmp_path / "in.txt", tmp_path / "p.jsonl", task="classify")
    clf = tmp_path / "clf"
    BertForSequenceClassification(tiny().replace(num_labels=2)).save_pretrained(clf)
    with pytest.raises(ValueError, match="is a sequence classifier.*pass --task classify"):
        predict(clf, tmp_path / "in.txt", tmp_path / "p.jsonl", task="ner")
    # A config.json naming no architecture and no labels (once a TypeError on None).
    bare = tmp_path / "bare"
    BertModel(tiny()).save_pretrained(bare)
    values = json.loads((bare / "config.json").read_text())
    del values["architectures"]
    (bare / "config.json").write_text(json.dumps(values))
    from bertkit.data.tokenizer import BertTokenizer

    (tmp_path / "vocab.txt").write_text("".join(f"{t}\n" for t in
                                                ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"]))
    BertTokenizer.from_pretrained(tmp_path / "vocab.txt").save_pretrained(bare)
    (tmp_path / "in.txt").write_text("a\n")
    with pytest.raises(ValueError, match="has no labels .*not a fine-tuned classifier"):
        predict(bare, tmp_path / "in.txt", tmp_path / "p.jsonl", task="classify", progress=False)
    assert not (tmp_path / "p.jsonl").exists()


def test_check_architecture_lets_matching_and_unnamed_models_through():
    config = tiny()
    tasks.check_architecture("m", config, "ForTokenClassification", "fix")  # no architectures
    named = BertConfig.from_dict({**config.to_dict(), "architectures": ["BertForTokenClassification"]})
    tasks.check_architecture("m", named, "ForTokenClassification", "fix")
    with pytest.raises(ValueError, match="token classifier.*not a sequence classifier; fix"):
        tasks.check_architecture("m", named, "ForSequenceClassification", "fix")


# ------------------------------------------------------------------ item 2: weights' mode, permissions
def test_weights_are_written_with_a_normal_file_mode(tmp_path):
    BertModel(tiny()).save_pretrained(tmp_path)
    mask = os.umask(0)
    os.umask(mask)
    for name in ("model.safetensors", "config.json"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~mask, name


def test_unreadable_weights_are_a_permission_error_not_corrupt(tmp_path, monkeypatch):
    BertModel(tiny()).save_pretrained(tmp_path)

    def denied(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    # Root reads any file whatever its mode; simulate the refusal another user would get.
    monkeypatch.setattr(checkpoint, "open", denied, raising=False)
    with pytest.raises(PermissionError, match="cannot read .*permission denied.*chmod a\\+r") as info:
        BertModel.from_pretrained(tmp_path)
    assert "corrupt" not in str(info.value)


# ------------------------------------------------------------------ item 3: --resume and the --out spelling
def test_resume_settings_ignore_how_out_is_spelled(tmp_path):
    from bertkit.train.pretrain import PretrainConfig, check_resume_config

    saved = PretrainConfig(data="d", out="runD/").to_dict()
    for out in ("runD", str(tmp_path / "runD"), str(tmp_path / "moved")):
        check_resume_config(saved, PretrainConfig(data="d", out=out), Path("x"))
    with pytest.raises(ValueError, match="lr"):
        check_resume_config(saved, PretrainConfig(data="d", out="runD", lr=1.0), Path("x"))


# ------------------------------------------------------------------ item 5: --model-arg keys
def test_unknown_override_key_names_the_closest_field():
    with pytest.raises(ValueError, match="'hiden_dropout_prob'.*did you mean 'hidden_dropout_prob'"):
        BertConfig.preset("tiny", hiden_dropout_prob=0)
    with pytest.raises(ValueError, match="did you mean 'num_labels'"):
        tiny().replace(num_label=3)
    assert BertConfig.preset("tiny", hidden_dropout_prob=0).hidden_dropout_prob == 0


def test_pretrain_rejects_a_mistyped_model_arg_before_reading_data():
    from bertkit.train.pretrain import PretrainConfig

    with pytest.raises(ValueError, match="did you mean 'hidden_dropout_prob'"):
        PretrainConfig(data="nowhere", out="o", model_overrides={"hiden_dropout_prob": 0}).validate()


# ------------------------------------------------------------------ item 6: non-UTF-8 task files
def test_task_files_name_file_line_and_column_of_a_bad_byte(tmp_path):
    from bertkit.data.formats import classify, ner, qa

    path = tmp_path / "train.csv"
    path.write_bytes(b"text,label\ngood,pos\ncaf\xe9,neg\n")
    message = r"train.csv line 3: not UTF-8 text \(byte 0xe9 at column 4\); re-save the file as UTF-8"
    with pytest.raises(ValueError, match=message):
        classify.read_classify(path)
    conll = tmp_path / "train.conll"
    conll.write_bytes(b"Paris\tB-LOC\n\nfa\xe7ade\tO\n")
    with pytest.raises(ValueError, match=r"line 3: not UTF-8 text \(byte 0xe7 at column 3\)"):
        ner.read_ner(conll)
    squad = tmp_path / "dev.json"
    squad.write_bytes(b"\x00\x01binary")
    with pytest.raises(ValueError, match="binary data"):
        qa.read_squad(squad, training=False)
    assert read_text(_utf8_with_bom(tmp_path)) == "text\n"


def _utf8_with_bom(tmp_path: Path) -> Path:
    path = tmp_path / "bom.txt"
    path.write_bytes(b"\xef\xbb\xbftext\n")
    return path


# ------------------------------------------------------------------ item 10: the smaller ones
def test_info_checks_weights_and_refuses_vocab_size_for_a_model(tmp_path):
    from bertkit.encoder.summary import format_parameter_table

    BertModel(tiny()).save_pretrained(tmp_path)
    assert "total" in format_parameter_table(tmp_path)
    with pytest.raises(ValueError, match="--vocab-size is for presets"):
        format_parameter_table(tmp_path, vocab_size=50)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:300])
    with pytest.raises(checkpoint.CheckpointError, match="truncated or corrupt"):
        format_parameter_table(tmp_path)
    weights.unlink()
    with pytest.raises(FileNotFoundError, match="weights are missing"):
        format_parameter_table(tmp_path)


def test_hub_ids_are_told_nothing_is_downloaded():
    with pytest.raises(FileNotFoundError, match="not a local directory.*never downloads"):
        BertModel.from_pretrained("bert-base-uncased")
    with pytest.raises(ValueError, match="never downloads"):
        BertConfig.resolve("bert-base-uncased")
    from bertkit.data.tokenizer import BertTokenizer

    with pytest.raises(FileNotFoundError, match="never downloads"):
        BertTokenizer.from_pretrained("bert-base-uncased")


def test_plot_draws_a_finetune_run_and_keeps_an_existing_image(tmp_path):
    pytest.importorskip("matplotlib")
    from bertkit.plot import plot_run

    records = [{"epoch": e, "step": 3 * e, "train_loss": 1.0 / e, "lr": 1e-4,
                "eval": {"accuracy": 0.5 + e / 10, "macro_f1": 0.4, "n": 20}, "saved": True}
               for e in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out = plot_run(tmp_path)
    assert out == tmp_path / "curves.png" and out.read_bytes()[:4] == b"\x89PNG"
    plot_run(tmp_path)  # its own image is redrawn
    mine = tmp_path / "mine.png"
    mine.write_text("keep")
    with pytest.raises(FileExistsError, match="--overwrite"):
        plot_run(tmp_path, mine)
    assert mine.read_text() == "keep"


def test_squad_eval_answer_at_a_wrong_offset_is_reported(tmp_path):
    from bertkit.data.formats import qa

    data = {"version": "v1.1", "data": [{"paragraphs": [{"context": "Paris is in France.", "qas": [
        {"id": "q1", "question": "Where is Paris?", "answers": [{"text": "France", "answer_start": 3}]},
        {"id": "q2", "question": "What is in France?", "answers": [{"text": "Paris", "answer_start": 0}]},
    ]}]}]}
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(data, indent=1))
    examples, report, _ = qa.read_squad(path, training=False)
    assert len(examples) == 2 and report.n_noted == 1
    assert "'q1'" in report.notes[0] and "answer_start 3 (it occurs at 12)" in report.notes[0]


def test_too_few_instances_names_a_real_flag(tmp_path):
    from bertkit.data.shards import PretrainingBatches, PretrainingData

    from pretrain_fixtures import make_data

    data = PretrainingData(make_data(tmp_path, n_docs=20), "eval")
    with pytest.raises(ValueError, match="lower --batch-size") as info:
        PretrainingBatches(data, data.num_instances + 1, seed=0, epoch=0)
    assert "drop_last" not in str(info.value)


def test_version_and_threads(capsys):
    from bertkit import __version__

    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip() == f"bertkit {__version__}"
    before = torch.get_num_threads()
    try:
        assert cli.main(["info", "tiny", "--threads", "1"]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    for command in cli.command_parsers(cli.build_parser()).values():
        assert any("--threads" in a.option_strings for a in command._actions)


def test_summary_lines():
    line = cli.finetune_summary_line({"metric": "accuracy", "best_epoch": 2, "epochs_run": 3,
                                      "eval": {"accuracy": 0.8125}, "test": {"accuracy": 0.75}}, "ft")
    assert line == ("model saved in ft (epoch 2 of 3); eval accuracy 0.8125; test accuracy 0.7500; "
                    "details in ft/eval.json")
    line = cli.pretrain_summary_line({"model_dir": "run/model", "steps": 1000, "total_steps": 2000,
                                      "eval": {"mlm_accuracy": 0.31, "loss": 4.2}, "stopped": "time_limit"})
    assert line.startswith("model saved in run/model after 1,000 of 2,000 steps; held-out MLM accuracy 0.310")
    assert line.endswith("continue with --resume")


def test_plurals_in_reports(caplog):
    assert (plural(1, "file"), plural(2, "file")) == ("1 file", "2 files")
    stats = CorpusStats(["a.txt"], files=1, documents=1, sentences=1, characters=1)
    stats.skip("a.txt:3", "non-UTF-8 line")
    stats.skip("b.bin", "binary file")
    text = stats.summary()
    assert "1 file, 1 document, 1 sentence, 1 character" in text
    assert "1 binary file, 1 non-UTF-8 line" in text
    assert "(line skipped)" in caplog.text and "b.bin: binary file (file skipped)" in caplog.text
    assert "1 row kept" in DataReport("x", n_kept=1).summary()


def test_one_line_for_an_os_error():
    err = PermissionError(13, "Permission denied", "/x/y")
    assert cli.error_line(err) == ("/x/y: Permission denied; check the path and its permissions, "
                                   "or choose another path")
    assert cli.error_line(ValueError("two\nlines")) == "two lines"
