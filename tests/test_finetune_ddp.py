"""Fine-tuning under `torchrun --nproc_per_node 2` (gloo on CPU) makes the updates of one process
with the same global batch: per-step losses and final weights agree to 1e-5, for a labelled task
(classify), the bi-encoder (embed: in-batch negatives gathered across ranks; also by GradCache,
cached-mnrl, whose gradients are compared too), the cross-encoder (rerank) and SPLADE (sparse:
gathered negatives and FLOPS), and after a SIGKILL and --resume; NER (a mean over labelled
tokens) and QA (a softmax over padded positions) too, QA's start and end biases aside
(`test_qa_two_processes_match_one` says why). The per-rank batches and shares of NER and QA are
also checked in this process.

Dropout is off in every model: the two ranks draw their own dropout masks, which cannot match
one process's. Batch sizes and row counts are chosen so that batches split unevenly (3 rows on 2
ranks, weighted by their rows) and the last batch of an epoch holds fewer rows than ranks (run
whole on both).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest
import torch
from safetensors.torch import load_file

from bertkit.cli import build_parser
from bertkit.train import state
from bertkit.train.finetune import finetune_settings, run_finetune
from bertkit.train.parallel import Shard, check_batch_size, shard, share
from bertkit.util.distributed import DistInfo, rank_rows

from finetune_fixtures import FILLER, NEG, POS, sentiment_file, write_jsonl
from pretrain_fixtures import cli_env, one_thread  # noqa: F401
from retrieval_fixtures import WORDS, sentences, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

# fp32, dropout off: only the float summation order differs (gradient all-reduce, matmuls over
# 2 rows instead of 4, the gathered candidates' layout).
TOLERANCE = 1e-5
VOCAB = list(dict.fromkeys(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *POS, *NEG, *FILLER]))


def tiny_model(directory: Path, kind: str) -> Path:
    """A random model of `kind` (encoder, mlm, cross-encoder) without dropout, with a tokenizer
    that knows every word of the test data."""
    from bertkit.data.tokenizer import BertTokenizer
    from bertkit.encoder.heads import BertForSequenceClassification
    from bertkit.encoder.model import BertForMaskedLM, BertModel

    config = tiny_config(vocab_size=len(VOCAB), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    if kind == "cross-encoder":
        model = BertForSequenceClassification(config.replace(id2label={0: "LABEL_0"}, label2id={"LABEL_0": 0}))
    else:
        model = (BertForMaskedLM if kind == "mlm" else BertModel)(config)
    model.save_pretrained(directory)
    BertTokenizer.from_vocab({t: i for i, t in enumerate(VOCAB)}).save_pretrained(directory)
    return directory


def pairs_file(path: Path, n: int, negatives: int) -> Path:
    """n query rows; every other row brings `negatives` hard negatives (ranks then hold
    different candidate counts)."""
    texts = sentences(n * (2 + negatives), seed=7)
    rows = []
    for i in range(n):
        row = {"query": texts[2 * i], "positive": texts[2 * i + 1]}
        if i % 2 == 0 or negatives > 1:
            row["negatives"] = texts[2 * n + i * negatives: 2 * n + (i + 1) * negatives]
        rows.append(row)
    return write_jsonl(path, rows)


def torchrun_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            "-m", "bertkit.cli", *args]


def torchrun(*args: str) -> subprocess.CompletedProcess:
    result = subprocess.run(torchrun_command(*args), env=cli_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, worker_error(result.stderr)
    return result


def worker_error(stderr: str) -> str:
    """The first worker traceback of a failed run: torchrun's own summary, which comes last, does
    not say what failed."""
    start = stderr.find("Traceback")
    return stderr[start:start + 4000] if start >= 0 else stderr[-3000:]


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # ended meanwhile
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def kill_workers_when(args: list[str], ready, timeout: float = 120) -> None:
    """Run torchrun; once `ready()`, SIGKILL its workers and then torchrun itself. (torchrun starts
    each worker in a session of its own, so killing torchrun's group would leave them running.)"""
    proc = subprocess.Popen(torchrun_command(*args), env=cli_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            assert proc.poll() is None, f"run ended before it could be killed: {proc.stderr.read()}"
            assert time.monotonic() < deadline, "run made no progress"
            time.sleep(0.002)
        workers = children(proc.pid)
        assert len(workers) == 2, workers
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stderr.close()


def run_one(*args: str) -> None:
    """`bertkit finetune ARGS` in this process, as the command line runs it (one process)."""
    namespace = build_parser().parse_args(["finetune", *args])
    options = {k: v for k, v in vars(namespace).items() if k not in ("command", "func", "threads")}
    run_finetune(finetune_settings(options))


def step_losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in state.read_records(out / "steps.jsonl")}


def assert_same_run(one: Path, two: Path, aside: tuple[str, ...] = ()) -> None:
    """Losses step by step and every weight of the saved model (but those named in `aside`)
    agree within TOLERANCE."""
    a, b = step_losses(one), step_losses(two)
    assert sorted(b) == sorted(a) and a, (a, b)  # rank 0 alone wrote, once per step
    for step in a:
        assert b[step] == pytest.approx(a[step], abs=TOLERANCE), (step, a, b)
    wa, wb = load_file(one / "model.safetensors"), load_file(two / "model.safetensors")
    assert wa.keys() == wb.keys() and set(aside) <= wa.keys()
    worst = max(float((wa[k] - wb[k]).abs().max()) for k in wa if k not in aside)
    assert worst <= TOLERANCE, worst


def one_and_two(tmp_path: Path, args: list[str]) -> tuple[Path, Path]:
    """The run in this process (one process, the global batch) and under torchrun (2 ranks)."""
    one, two = tmp_path / "one", tmp_path / "two"
    run_one(*args, "--out", str(one))
    result = torchrun("finetune", *args, "--out", str(two))
    assert result.stdout.count("model saved in") == 1  # rank 0 reports
    assert json.loads((two / "eval.json").read_text())["processes"] == 2
    return one, two


@pytest.mark.parametrize("task", ["embed", "rerank", "sparse"])
def test_retrieval_tasks_two_processes_match_one(tmp_path, task):
    kind = {"embed": "encoder", "rerank": "cross-encoder", "sparse": "mlm"}[task]
    model = tiny_model(tmp_path / "model", kind)
    # embed / sparse: 9 rows in batches of 4 → 4, 4, 1 (the last one whole on both ranks);
    # rerank: 7 queries → 4, 3 (2 and 1 on the ranks, each weighted by its rows).
    rows = 7 if task == "rerank" else 9
    train = pairs_file(tmp_path / "train.jsonl", rows, 2 if task == "rerank" else 1)
    args = ["--task", task, "--model", str(model), "--train", str(train), "--batch-size", "4",
            "--epochs", "1", "--lr", "0.001", "--max-length", "12", "--mine", "none", "--no-progress"]
    if task == "rerank":
        args += ["--negatives", "2"]
    assert_same_run(*one_and_two(tmp_path, args))


def test_cached_mnrl_two_processes_match_one_and_the_uncached_loss(tmp_path):
    """GradCache under torchrun: each rank embeds its rows by mini-batches without a graph, the
    embeddings are gathered, and each rank replays its own mini-batches, DDP all-reducing once.
    The run is one process's cached run, and one process's plain mnrl run, step by step."""
    model = tiny_model(tmp_path / "model", "encoder")
    # 13 rows in batches of 6: two of 6, then 1 (whole on both ranks). A rank's 3 queries make
    # mini-batches of 2 and 1; its 4 or 5 candidates (every other row brings a hard negative) 2, 2
    # and maybe 1.
    train = pairs_file(tmp_path / "train.jsonl", 13, 1)
    args = ["--task", "embed", "--model", str(model), "--train", str(train), "--batch-size", "6",
            "--epochs", "1", "--lr", "0.001", "--max-length", "12", "--mine", "none", "--no-progress"]
    one, two = one_and_two(tmp_path, [*args, "--loss", "cached-mnrl", "--mini-batch-size", "2"])
    assert_same_run(one, two)
    plain = tmp_path / "plain"
    run_one(*args, "--loss", "mnrl", "--out", str(plain))
    assert_same_run(plain, two)


def step_gradients(model_dir: Path, train: Path, loss: str, info: DistInfo) -> tuple[float, dict[str, torch.Tensor]]:
    """One step of the bi-encoder on the first 6 rows of `train`, taken as the retrieval loop
    takes it (this rank's shard through the DDP engine, its share, backward): the loss and the
    gradients left on the parameters (after DDP's all-reduce under several ranks)."""
    from functools import partial

    from bertkit.data.tokenizer import BertTokenizer
    from bertkit.train import parallel
    from bertkit.train.retrieval import biencoder
    from bertkit.train.retrieval.common import RetrievalTrainConfig, read_pairs

    config = RetrievalTrainConfig(task="embed", model=str(model_dir), train=str(train), out_dir="unused",
                                  max_length=12, loss=loss, mini_batch_size=2)
    model = biencoder.build(config)
    engine = parallel.data_parallel(model, info)
    part = shard(read_pairs(str(train))[0][:6], info)
    value = engine(partial(biencoder.loss, tokenizer=BertTokenizer.from_pretrained(model_dir), rows=part.rows,
                           config=config, device=info.device, group=part.group))
    parallel.for_backward(share(value, part), info).backward()
    return float(value.detach()), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def test_cached_mnrl_gradients_of_two_processes_are_one_process_gradients(tmp_path):
    """The gradients themselves, not only the weights: Adam's update is the same for any uniform
    scale of the gradient, so a share counted twice or not at all (a rank's embeddings' gradient
    taken once where DDP's mean needs it world_size times) leaves the weights of a run unchanged.
    One cached-mnrl step on 2 gloo processes under torchrun (3 rows each, mini-batches of 2) leaves
    on rank 0 the gradients one process's plain mnrl computes on the whole batch. The ranks run
    this file as a script (`rank_step` below), started by torchrun as a user's run is."""
    model = tiny_model(tmp_path / "model", "encoder")
    train = pairs_file(tmp_path / "train.jsonl", 6, 1)
    out = tmp_path / "rank0.pt"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               __file__, str(model), str(train), str(out)]
    result = subprocess.run(command, env=cli_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, worker_error(result.stderr)
    loss_two, two = torch.load(out)
    loss_one, one = step_gradients(model, train, "mnrl", info(0, 1))
    assert loss_two == pytest.approx(loss_one, abs=TOLERANCE)
    assert two.keys() == one.keys() and len(one) > 10
    assert max(float((two[n] - one[n]).abs().max()) for n in one) <= TOLERANCE
    assert max(float(g.abs().max()) for g in one.values()) > 1e-2  # the comparison is not of zeros


def rank_step(model_dir: Path, train: Path, out: Path) -> None:
    """`step_gradients` of cached-mnrl on this torchrun rank; rank 0 saves the loss and gradients."""
    from bertkit.util.distributed import init_distributed, leave_together, shutdown

    torch.set_num_threads(1)
    dist = init_distributed("cpu")
    try:
        result = step_gradients(model_dir, train, "cached-mnrl", dist)
        if dist.rank == 0:
            torch.save(result, out)
        leave_together(dist)  # as `run_finetune` does (its docstring says why)
    finally:
        shutdown(dist)


def test_classify_two_processes_killed_and_resumed_match_one(tmp_path):
    """Kill a 2-process run mid-way, resume it under torchrun: its steps and weights are one process's."""
    model = tiny_model(tmp_path / "model", "mlm")
    # 41 rows in batches of 4: ten of 4 (2 a rank), then 1 (whole on both), an epoch; two epochs.
    train = sentiment_file(tmp_path / "train.jsonl", 41, 1)
    args = ["--task", "classify", "--model", str(model), "--train", str(train), "--batch-size", "4",
            "--epochs", "2", "--lr", "0.001", "--max-length", "12", "--save-every", "3", "--seed", "5",
            "--precision", "fp32", "--no-progress"]

    def steps_written(two: Path) -> int:
        path = two / "steps.jsonl"
        return len(path.read_text().splitlines()) if path.is_file() else 0

    killed_and_resumed(tmp_path, args, lambda two: steps_written(two) >= 5)


def killed_and_resumed(tmp_path: Path, args: list[str], ready: Callable[[Path], bool]) -> None:
    """`finetune ARGS` in one process, then under torchrun SIGKILLed once `ready(OUT)` and resumed
    under torchrun: its steps and weights are one process's."""
    one, two = tmp_path / "one", tmp_path / "two"
    run_one(*args, "--out", str(one))
    kill_workers_when(["finetune", *args, "--out", str(two)], lambda: ready(two))
    ckpt = state.load_trainer_state(state.latest_checkpoint(two))
    assert ckpt["step"] < len(step_losses(one)), "the kill came too late to test anything"
    assert len(ckpt["rank_rngs"]) == 2  # each rank's generators, for its dropout stream

    result = torchrun("finetune", *args, "--out", str(two), "--resume")
    assert "resuming from" in result.stderr
    assert_same_run(one, two)
    assert not (two / "checkpoints").exists()


def squad_file(path: Path, n: int) -> Path:
    """n one-question paragraphs of four lengths, so that a batch's rows pad to unequal widths."""
    import random

    rng = random.Random(5)
    paragraphs = []
    for i in range(n):
        context = " ".join(rng.choice(WORDS) for _ in range(2 + 3 * (i % 4))) + " the city ."
        paragraphs.append({"context": context, "qas": [{"id": f"q{i}", "question": "where is the city ?",
                                                        "answers": [{"text": "city",
                                                                     "answer_start": context.rindex("city")}]}]})
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}),
                    encoding="utf-8")
    return path


def test_qa_two_processes_match_one(tmp_path):
    """QA's loss is a softmax over every position of the padded batch, so each rank pads its rows
    to the whole batch's width: losses and weights are one process's within 1e-5, but for
    qa_outputs.bias. That bias adds one number to every start (end) logit of a row, which a
    softmax ignores: its gradient is zero in exact arithmetic whatever the batch and however it
    is shared out, so the bias cannot show a sharding error. What stands for that zero is rounding
    noise, different in 2 processes and in one, which Adam divides by its own root mean square
    into updates far above the noise: here the bias moves 2.2e-5 in six steps and the two runs end
    4.4e-6 apart, the order of the tolerance. Everything a sharding error moves (the losses, the
    encoder, qa_outputs.weight) is compared: padding each rank to its own width instead puts the
    losses 0.1 apart."""
    model = tiny_model(tmp_path / "model", "mlm")
    # 9 questions in batches of 4: two of 4 (2 a rank, padded to the batch's width), then 1.
    train = squad_file(tmp_path / "train.json", 9)
    args = ["--task", "qa", "--model", str(model), "--train", str(train), "--batch-size", "4", "--epochs", "2",
            "--lr", "0.001", "--max-length", "32", "--doc-stride", "16", "--precision", "fp32", "--no-progress"]
    assert_same_run(*one_and_two(tmp_path, args), aside=("qa_outputs.bias",))


def test_ner_two_processes_match_one(tmp_path):
    """NER's loss is a mean over labelled tokens, which the ranks hold unevenly (rows of 2 to 6
    words, a word of several pieces labelled once): each rank's share weighs its mean by its
    labelled tokens, so losses and weights are one process's within 1e-5."""
    import random

    model = tiny_model(tmp_path / "model", "mlm")
    rng = random.Random(7)
    rows = []
    for _ in range(9):  # batches of 4: two of 4 (2 a rank), then 1 (whole on both)
        tokens = [rng.choice(WORDS) for _ in range(rng.randint(2, 6))]
        rows.append({"tokens": tokens, "tags": [rng.choice(["B-X", "I-X", "O", "O"]) for _ in tokens]})
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    args = ["--task", "ner", "--model", str(model), "--train", str(train), "--batch-size", "4", "--epochs", "2",
            "--lr", "0.001", "--max-length", "16", "--precision", "fp32", "--no-progress"]
    assert_same_run(*one_and_two(tmp_path, args))


def info(rank: int, world: int) -> DistInfo:
    return DistInfo(rank=rank, world_size=world, local_rank=rank, device=torch.device("cpu"),
                    backend="gloo" if world > 1 else None)


def test_batch_size_must_divide_by_the_world_size():
    check_batch_size(6, info(0, 3))
    with pytest.raises(ValueError, match=r"^--batch-size 5 does not divide by the world size 2 .*multiple of 2"):
        check_batch_size(5, info(1, 2))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_shards_hold_the_batch_in_order_and_shares_sum_to_the_loss(world):
    for n in range(0, 11):
        parts = [rank_rows(n, info(r, world)) for r in range(world)]
        assert [i for p in parts for i in range(n)[p]] == list(range(n))
        assert max(p.stop - p.start for p in parts) - min(p.stop - p.start for p in parts) <= 1
    batch = list(range(5))
    shards: list[Shard] = [shard(batch, info(r, world)) for r in range(world)]
    loss = torch.tensor(2.0)
    if world <= 5:  # a mean over rows: each rank's share weighs by its rows
        total = sum(float(share(loss, s, len(s.rows), len(batch))) for s in shards)
        assert total == pytest.approx(2.0)
    assert sum(float(share(loss, s)) for s in shards) == pytest.approx(2.0)  # a gathered loss
    short = [shard(batch[:1], info(r, world)) for r in range(world)]  # fewer rows than ranks
    assert all(s.replicated and s.rows == [0] for s in short)
    assert sum(float(share(loss, s, 1, 1)) for s in short) == pytest.approx(2.0)


def span_head(tags: dict | None = None):
    from bertkit.encoder.heads import BertForQuestionAnswering, BertForTokenClassification

    torch.manual_seed(0)
    settings = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    if tags is None:
        return BertForQuestionAnswering(tiny_config(**settings))
    return BertForTokenClassification(tiny_config(id2label=tags, label2id={v: k for k, v in tags.items()}, **settings))


@pytest.mark.parametrize("task", ["ner", "qa"])
def test_rank_shares_add_up_to_the_global_batch(task):
    """The labelled loop's per-rank batches and shares on 2 ranks, computed here one after the
    other: their losses add up to one process's loss of the whole batch, and so do their
    gradients (DDP's mean completes the sum). NER's loss is a mean over labelled tokens, which
    the ranks hold unevenly; QA's is a softmax over every position, padding included, so each
    rank pads to the whole batch's width."""
    import random

    from bertkit.data.formats.common import pad_batch
    from bertkit.train.finetune.loop import head_loss, loss_terms, rank_batch

    model = span_head({0: "O", 1: "B-X", 2: "I-X"} if task == "ner" else None)
    rng = random.Random(3)
    features = []
    for length in (9, 3, 7, 5, 8):  # unequal lengths (and labelled counts)
        feature = {"input_ids": [2] + [rng.randrange(5, 30) for _ in range(length - 2)] + [3],
                   "token_type_ids": [0] * length}
        if task == "ner":
            feature["labels"] = [-100] + [rng.choice([0, 1, 2, -100]) for _ in range(length - 2)] + [-100]
        else:
            feature["start_positions"] = rng.randrange(length)
            feature["end_positions"] = min(length - 1, feature["start_positions"] + 1)
        features.append(feature)
    rows = list(range(len(features)))

    def loss_and_grads(loss: torch.Tensor) -> tuple[float, list[torch.Tensor]]:
        model.zero_grad()
        loss.backward()
        return float(loss.detach()), [p.grad.clone() for p in model.parameters()]

    whole, whole_grads = loss_and_grads(head_loss(model, pad_batch(features, 0)))
    total, total_grads = 0.0, [torch.zeros_like(g) for g in whole_grads]
    for rank in range(2):
        part = shard(rows, info(rank, 2))
        local = head_loss(model, rank_batch(features, rows, part, 0))
        value, grads = loss_and_grads(share(local, part, loss_terms(features, part.rows), loss_terms(features, rows)))
        total += value
        total_grads = [t + g for t, g in zip(total_grads, grads)]
    assert total == pytest.approx(whole, abs=1e-6)
    assert max(float((t - g).abs().max()) for t, g in zip(total_grads, whole_grads)) < 1e-6


def test_cosent_two_processes_match_one(tmp_path):
    """A loss over every pair of the batch (CoSENT): the gold scores are gathered with the
    embeddings, so two ranks train as one process on the global batch."""
    model = tiny_model(tmp_path / "model", "encoder")
    texts = sentences(18, seed=11)
    train = write_jsonl(tmp_path / "scored.jsonl", [{"sentence1": texts[2 * i], "sentence2": texts[2 * i + 1],
                                                     "score": (i * 7 % 5) / 4} for i in range(8)])
    args = ["--task", "embed", "--loss", "cosent", "--model", str(model), "--train", str(train),
            "--batch-size", "4", "--epochs", "1", "--lr", "0.001", "--max-length", "12", "--mine", "none",
            "--no-progress"]
    assert_same_run(*one_and_two(tmp_path, args))


def test_embed_two_processes_killed_and_resumed_match_one(tmp_path):
    """The bi-encoder under torchrun, killed once its first training state is on disk and resumed
    under torchrun: its steps and weights are one process's (in-batch negatives gathered across
    ranks, the epochs drawn again up to the one in progress)."""
    model = tiny_model(tmp_path / "model", "encoder")
    # 21 rows in batches of 4: five of 4 (2 a rank), then 1 (whole on both), an epoch; two epochs.
    train = pairs_file(tmp_path / "train.jsonl", 21, 1)
    args = ["--task", "embed", "--model", str(model), "--train", str(train), "--batch-size", "4",
            "--epochs", "2", "--lr", "0.001", "--max-length", "12", "--mine", "none", "--save-every", "3",
            "--seed", "5", "--no-progress"]
    killed_and_resumed(tmp_path, args, lambda two: state.latest_checkpoint(two) is not None)


if __name__ == "__main__":  # a torchrun rank of test_cached_mnrl_gradients_of_two_processes_are_one_process_gradients
    rank_step(*map(Path, sys.argv[1:4]))
