"""Pre-training: MLM (+ NSP / SOP) on prepared shards, resumable exactly, one process or many.

    pretrain(PretrainConfig(data="DATA_DIR", out="RUN_DIR", model="mini", max_steps=2000))

    config.py   PretrainConfig: every setting of a run; what its run directory holds, starting over, resuming
    batches.py  one DataLoader over the whole run; the statistics of a forward pass
    trainer.py  the run: steps, evaluation, checkpoints, resume, signals (what a step does, and why)
"""

from bertkit.train.pretrain.batches import RunBatches, data_digest, loader_workers, make_loader
from bertkit.train.pretrain.config import (
    CONFIG_FILE,
    RESUMABLE_CHANGES,
    RUN_OUTPUTS,
    SUMMARY_FILE,
    PretrainConfig,
    TrainingDiverged,
    check_resume_config,
    prepare_run_dir,
)
from bertkit.train.pretrain.trainer import Interrupted, Trainer, pretrain

__all__ = ["CONFIG_FILE", "RESUMABLE_CHANGES", "RUN_OUTPUTS", "SUMMARY_FILE", "Interrupted", "PretrainConfig",
           "RunBatches", "Trainer", "TrainingDiverged", "check_resume_config", "data_digest", "loader_workers",
           "make_loader", "prepare_run_dir", "pretrain"]
