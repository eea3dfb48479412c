"""The uses' records (`inference/uses.py`): one per name of `constants.USES`, each read by files,
the service and export instead of a branch per use."""

from __future__ import annotations

import pytest

from bertkit.constants import EXPORT_USES, USES
from bertkit.encoder import tasks
from bertkit.inference import uses


def test_every_use_has_one_record_with_its_behaviour():
    assert tuple(uses.USES) == USES
    for name, use in uses.USES.items():
        assert use.name == name and callable(use.function) and callable(use.chunk) and callable(use.runner)
        assert (use.graph is not None) == bool(use.outputs)
    assert sorted(n for n, u in uses.USES.items() if u.outputs) == sorted(EXPORT_USES)
    for task in tasks.PREDICT_TASKS:  # `predict` reads a file for each fine-tuned task's use
        assert uses.USES[tasks.FINETUNE_TASKS[task].use].predict_reading is not None
    with pytest.raises(ValueError, match="unknown use 'tag'; choose one of embed, embed-sparse"):
        uses.use_row("tag")


def test_the_service_and_export_read_the_records():
    from bertkit.export import OUTPUTS
    from bertkit.serve.runners import RUNNERS

    assert set(uses.USES) <= set(RUNNERS)
    assert OUTPUTS == {name: uses.USES[name].outputs for name in EXPORT_USES}
