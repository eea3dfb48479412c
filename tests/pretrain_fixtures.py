"""Tiny pre-training inputs shared by the pre-training tests (a helper module, not collected).

The corpus is synthetic English with learnable structure (subject / verb / object / place slots,
places cycling within a document), so a few dozen steps of a tiny model visibly lower the loss. It
goes through the real pipeline: `train_tokenizer` → `prepare`.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

SUBJECTS = ["the cat", "a dog", "my friend", "the teacher", "our team", "the old man", "a small bird"]
VERBS = ["sees", "likes", "finds", "wants", "paints", "follows", "calls"]
OBJECTS = ["the red ball", "a green apple", "the big house", "a blue car", "the tall tree",
           "a quiet river"]
PLACES = ["in the park", "at home", "near the school", "by the sea", "on the hill"]

# Odd, distinct sizes so that a swapped dimension fails loudly; dropout as in BERT.
TINY_MODEL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
              "intermediate_size": 37, "max_position_embeddings": 48, "type_vocab_size": 2,
              "vocab_size": 99}


def synthetic_documents(n_docs: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        topic = rng.randrange(len(PLACES))
        docs.append([f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} "
                     f"{PLACES[(topic + i) % len(PLACES)]}." for i in range(rng.randint(3, 8))])
    return docs


def make_data(root: Path, *, nsp: bool = True, n_docs: int = 300, vocab_size: int = 120,
              max_seq_len: int = 32, seed: int = 0, tokenizer_dir: Path | None = None) -> Path:
    """A prepared DATA_DIR under `root` (tokenizer trained there unless `tokenizer_dir` is given)."""
    from bertkit.data.corpus import Corpus
    from bertkit.data.prepare import prepare
    from bertkit.data.vocab import train_tokenizer

    corpus = Corpus.from_documents(synthetic_documents(n_docs, seed), name="synthetic")
    if tokenizer_dir is None:
        tokenizer_dir = root / "tokenizer"
        train_tokenizer(corpus, vocab_size, tokenizer_dir)
    out = root / "data"
    prepare(corpus, tokenizer_dir, out, max_seq_len=max_seq_len, nsp=nsp, eval_fraction=0.1,
            seed=seed + 1, progress=False)
    return out


def write_model_config(path: Path, **overrides) -> Path:
    """A tiny config.json (vocab_size is replaced by the data's at training time)."""
    path.write_text(json.dumps({**TINY_MODEL, **overrides}), encoding="utf-8")
    return path


def train_losses(run_dir: Path) -> dict[int, float]:
    """step → train loss from metrics.jsonl."""
    from bertkit.train.state import read_metrics

    return {r["step"]: r["loss"] for r in read_metrics(run_dir) if r["split"] == "train"}


def cli_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "bertkit.cli", *args]


@pytest.fixture(scope="module")
def one_thread():
    """Run torch on one thread: runs compare bit for bit, and tiny models are not slowed down by
    thread hand-offs (on a busy 2-core machine two threads can be 10× slower than one)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def cli_env(threads: int = 1) -> dict[str, str]:
    """Environment for CLI subprocesses: a fixed thread count (see `one_thread`)."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    env.pop("WORLD_SIZE", None)
    env.pop("RANK", None)
    return env


def run_cli(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    result = subprocess.run(cli_command(*args), env=cli_env(), capture_output=True, text=True,
                            timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"bertkit {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


def call_cli(*args: str, check: bool = True) -> SimpleNamespace:
    """`bertkit ARGS` in this process: the same parser, error boundary and exit status as
    `run_cli`'s `python -m bertkit.cli ARGS`, without an interpreter start-up (seconds on a
    busy machine). Returns (returncode, stdout, stderr), stderr holding the INFO log lines the
    command's own handler would print. For tests whose claim is about a run's results, not about
    the process (a kill needs a process of its own)."""
    from bertkit.cli import main

    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(err)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)  # the command's basicConfig does nothing where handlers exist
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(list(args))
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    result = SimpleNamespace(returncode=status, stdout=out.getvalue(), stderr=err.getvalue())
    if check and status != 0:
        raise AssertionError(f"bertkit {' '.join(args)} failed ({status}):\n{result.stderr}")
    return result


def tiny_pretrained(out, minilm_dir):
    """A tiny randomly initialised pre-training checkpoint with the MiniLM tokenizer, in `out`
    (fine-tuning's starting point in the tests)."""
    from bertkit.data.tokenizer import BertTokenizer
    from bertkit.encoder.config import BertConfig
    from bertkit.encoder.model import BertForPreTraining

    torch.manual_seed(0)
    BertForPreTraining(BertConfig.preset("tiny", vocab_size=30522)).save_pretrained(out)
    BertTokenizer.from_pretrained(minilm_dir).save_pretrained(out)
    return out
