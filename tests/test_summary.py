"""`bertkit info`: parameter counts equal the reference's."""

from __future__ import annotations

import pytest
import transformers

from bertkit.cli import main
from bertkit.encoder.summary import build_for_info, parameter_rows


@pytest.mark.parametrize("preset,vocab,expected", [
    ("base", None, 109_482_240), ("large", None, 335_141_888), ("base", 21_128, 102_267_648)])
def test_bert_model_counts_match_the_reference(preset, vocab, expected):
    model = build_for_info(preset, vocab)
    assert sum(p.numel() for p in model.parameters()) == expected
    assert sum(count for _, count in parameter_rows(model)) == expected


def test_count_equals_transformers_for_a_real_checkpoint(minilm_dir):
    reference = transformers.BertModel.from_pretrained(minilm_dir)
    model = build_for_info(minilm_dir)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in reference.parameters())


def test_info_command_prints_a_table(capsys):
    assert main(["info", "base"]) == 0
    out = capsys.readouterr().out
    assert "layer 11 FFN" in out and out.rstrip().endswith("109,482,240")
    assert main(["info", "nonexistent-model"]) == 2
    assert "unknown model 'nonexistent-model'" in capsys.readouterr().err
