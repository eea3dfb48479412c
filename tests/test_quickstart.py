"""The demo, scaled down (200 People's Daily documents, a tiny model, 30 steps): every stage runs,
the report has its parts, the result line is JSON, and a second run reuses the first."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from bertkit import quickstart as qs
from bertkit.train import state

from pretrain_fixtures import one_thread  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = dict(steps=30, model="tiny", max_seq_len=64, batch_size=16, max_documents=200,
             eval_fraction=0.1, progress=False)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("quickstart") / "run"
    lines: list[str] = []
    result = qs.quickstart(qs.QuickstartConfig(out=str(out), **SMALL), log=lines.append)
    return out, result, "\n".join(lines)


def test_result_and_files(demo):
    out, result, _ = demo
    assert set(result) == {"run_dir", "steps", "tokens_seen", "heldout_mlm_accuracy",
                           "unigram_baseline_accuracy"}
    assert result["run_dir"] == str(out) and result["steps"] == 30 and result["tokens_seen"] > 0
    assert 0.0 <= result["heldout_mlm_accuracy"] <= 1.0
    assert 0.0 < result["unigram_baseline_accuracy"] < 0.2  # one token, many positions
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer.json"):
        assert (out / "model" / name).is_file()
    assert (out / "tokenizer" / "vocab.txt").is_file() and (out / "data" / "meta.json").is_file()
    assert [s for s, _ in state.list_checkpoints(out)] == [30]  # keep=1
    assert json.loads((out / qs.MARKER).read_text())["settings"]["steps"] == 30


def test_pretrains_mlm_only_without_dropout_and_saves_bert_dropout(demo):
    from bertkit.data.shards import PretrainingData
    from bertkit.encoder.config import BertConfig

    out, _, _ = demo
    assert not PretrainingData(out / "data", "train").nsp
    trained = json.loads((out / "pretrain_config.json").read_text())["model_overrides"]
    assert trained == {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    saved = BertConfig.from_json(out / "model" / "config.json")
    assert saved.hidden_dropout_prob == saved.attention_probs_dropout_prob == 0.1
    assert saved.extra["architectures"] == ["BertForPreTraining"]


def test_report_shows_baseline_fill_mask_and_next_steps(demo):
    out, result, report = demo
    assert f"unigram baseline (always '，'): {result['unigram_baseline_accuracy']:.3f}" in report
    candidates = re.findall(r"^    (?:answer \S+:  )?(.+)$", report, flags=re.M)
    # 3 held-out sentences and 3 pairs of contexts, each with 5 candidates, best first.
    assert len(candidates) == 3 + 2 * len(qs.LANGUAGES["zh"].pairs)
    for line in candidates:
        probs = [float(p) for p in re.findall(r" (\d\.\d\d)(?=\s|$)", line)]
        assert len(probs) == 5 and probs == sorted(probs, reverse=True), line
    assert report.count("[MASK]") >= 9
    ner_run = f"--task ner --model {out / 'model'} --dataset zh-ner --out {out.parent / 'zh-ner'}"
    assert f"bertkit finetune {ner_run}" in report
    assert f"bertkit explore {out / 'model'}" in report  # not the default dir, so it is named
    # Every path in the next lines is of one kind: absolute, as --out was given here.
    paths = re.findall(r"(?:--model|--out|--data|--init|plot|fill-mask) (\S+)", report.split("next:")[1])
    assert paths and all(p.startswith("/") for p in paths), paths
    # The warning for a run too short to learn appears exactly when the model did not beat the baseline.
    short = result["heldout_mlm_accuracy"] <= result["unigram_baseline_accuracy"]
    assert ("too few steps to learn" in report) == short, report


def test_too_few_steps_note_names_the_fix():
    assert qs.too_few_steps(30, 0.05, 0.06, asked=30).startswith("warning: after 30 steps the model does not")
    assert "--steps" in qs.too_few_steps(30, 0.06, 0.06, asked=None)
    assert qs.too_few_steps(3000, 0.31, 0.06, asked=None) is None


def test_heldout_examples_mask_a_real_character(demo):
    from bertkit.data.shards import PretrainingData
    from bertkit.data.tokenizer import BertTokenizer

    out, _, _ = demo
    examples = qs.heldout_examples(PretrainingData(out / "data", "eval"),
                                   BertTokenizer.from_pretrained(out / "model"),
                                   qs.LANGUAGES["zh"], n=3, seed=1)
    assert len(examples) == 3
    for text, answer in examples:
        assert text.count("[MASK]") == 1 and " " not in text
        assert len(answer) == 1 and answer.isalpha()


def test_unigram_baseline_counts_the_training_split(demo):
    from collections import Counter

    from bertkit.data.shards import PretrainingData

    out, _, _ = demo
    data = PretrainingData(out / "data", "train")
    counts = Counter()
    for i in range(data.num_instances):
        counts.update(data.instance(i)[0].input_ids.tolist())
    for special in data.meta["special_ids"]:
        counts.pop(special, None)
    assert qs.most_frequent_token(data) == counts.most_common(1)[0][0]


def test_second_run_reuses_the_first(demo):
    out, result, _ = demo
    lines: list[str] = []
    again = qs.quickstart(qs.QuickstartConfig(out=str(out), **SMALL), log=lines.append)
    assert "reusing the vocabulary and data" in "\n".join(lines)
    assert again == result
    with pytest.raises(FileExistsError, match="--overwrite"):
        qs.quickstart(qs.QuickstartConfig(out=str(out), **{**SMALL, "lr": 5e-4}), log=lines.append)


def test_cli_prints_one_json_object_last(tmp_path, capsys, monkeypatch):
    from bertkit.cli import main

    # The command's defaults are the full demo; scale them down through the config class.
    small = dataclasses.make_dataclass("Small", [(k, type(v), dataclasses.field(default=v))
                                                 for k, v in SMALL.items() if k != "steps"],
                                       bases=(qs.QuickstartConfig,))
    monkeypatch.setattr(qs, "QuickstartConfig", small)
    assert main(["quickstart", "--out", str(tmp_path / "cli"), "--steps", "4"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    result = json.loads(last)
    assert result["steps"] == 4 and result["run_dir"] == str(tmp_path / "cli")


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="unknown language 'fr'"):
        qs.quickstart(qs.QuickstartConfig(lang="fr", out=str(tmp_path / "x")))
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="already holds another run"):
        qs.quickstart(qs.QuickstartConfig(out=str(tmp_path / "busy"), **SMALL))
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"


def test_printed_finetune_commands_run_as_printed(demo, tmp_path, capsys, monkeypatch):
    """The "next" commands carry no --lr: the default must suit the demo's tiny model (at BERT-
    base's 3e-5 it learned nothing in an epoch). Each runs here on a sliver of its data set: 64
    training examples, and 64 of the dev and test splits that --dataset scores (the whole sets
    take minutes; their scores are in finetune.default_lr)."""
    from bertkit import cli
    from bertkit.data import labelled

    whole = labelled.load_labelled
    monkeypatch.setattr(labelled, "load_labelled", lambda name, split="train": whole(name, split)[:64])
    _, _, report = demo
    commands = re.findall(r"^  bertkit (finetune .+)$", report, flags=re.M)
    assert len(commands) == len(qs.LANGUAGES["zh"].finetune) == 2
    for k, command in enumerate(commands):
        args = command.split()
        assert "--lr" not in args
        args[args.index("--out") + 1] = str(tmp_path / f"run{k}")
        assert cli.main([*args, "--max-train-examples", "64", "--epochs", "1", "--no-progress"]) == 0
        saved = json.loads((tmp_path / f"run{k}" / "finetune_config.json").read_text())
        assert saved["lr"] == 1e-3
