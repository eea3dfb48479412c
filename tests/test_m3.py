"""BGE-M3's three outputs and its scores (`inference/m3.py`, the head files of `encoder/m3.py`)
against FlagEmbedding, the reference implementation.

The oracle's outputs are a fixture (tests/fixtures/m3_flag/: a tiny random XLM-RoBERTa with M3's
two heads, and what FlagEmbedding 1.4.2's BGEM3FlagModel gave for it), since FlagEmbedding lives
in a venv of its own. Regenerate it with tests/oracles/m3_flag.py (its docstring has the commands).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import bertkit
from bertkit import cli
from bertkit.data.tokenizer import BertTokenizer
from bertkit.encoder.m3 import M3Heads, has_m3_heads, read_m3_heads, write_m3_heads
from bertkit.encoder.model import BertModel
from bertkit.encoder.packing import Packed
from bertkit.inference import Engine
from bertkit.inference.m3 import SCORE_MODES, compute_score, encode_m3

from model_fixtures import save_tiny, save_tiny_m3

FIXTURE = Path(__file__).parent / "fixtures" / "m3_flag"
ORACLE = json.loads((FIXTURE / "outputs.json").read_text(encoding="utf-8"))
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def flag_model():
    return bertkit.load(FIXTURE / "model", device="cpu")


@pytest.fixture(scope="module")
def tiny_dirs(minilm_dir, tmp_path_factory) -> dict[str, Path]:
    """A BERT-vocabulary model in M3's layout, and the same encoder without the heads."""
    root = tmp_path_factory.mktemp("m3")
    tok = BertTokenizer.from_pretrained(minilm_dir)
    return {"m3": save_tiny_m3(tok, root / "m3"), "plain": save_tiny(BertModel, tok, root / "plain")}


# ---------------------------------------------------------------------------------------------
# against FlagEmbedding
# ---------------------------------------------------------------------------------------------
def test_the_fixture_is_an_m3_directory_of_flagembeddings_files():
    assert has_m3_heads(FIXTURE / "model")
    assert {p.name for p in (FIXTURE / "model").glob("*_linear.pt")} == {"colbert_linear.pt", "sparse_linear.pt"}


def test_encode_equals_flagembedding(flag_model):
    got = flag_model.encode(ORACLE["texts"], output=("dense", "sparse", "colbert"))
    assert np.abs(got["dense"] - np.array(ORACLE["dense"])).max() <= TOLERANCE
    for ours, theirs in zip(got["sparse"], ORACLE["sparse"]):
        assert set(ours) == set(theirs) and ours  # the same token ids, special ones dropped
        assert max(abs(ours[k] - theirs[k]) for k in theirs) <= TOLERANCE
    for ours, theirs in zip(got["colbert"], ORACLE["colbert"]):
        assert ours.shape == np.array(theirs).shape  # every token after [CLS], [SEP] included
        assert np.abs(ours - np.array(theirs)).max() <= TOLERANCE


def test_encode_in_chunks_equals_one_call(flag_model):
    whole = flag_model.encode(ORACLE["texts"], output=("dense", "sparse", "colbert"))
    chunked = flag_model.encode(ORACLE["texts"], output=("dense", "sparse", "colbert"), batch_size=4)
    assert np.abs(whole["dense"] - chunked["dense"]).max() <= TOLERANCE
    assert [set(w) for w in whole["sparse"]] == [set(c) for c in chunked["sparse"]]
    assert all(np.abs(w - c).max() <= TOLERANCE for w, c in zip(whole["colbert"], chunked["colbert"]))


def test_one_text_gives_its_own_outputs(flag_model):
    got = flag_model.encode(ORACLE["texts"][1], output=["sparse", "colbert"])
    assert set(got) == {"sparse", "colbert"} and isinstance(got["sparse"], dict)
    assert np.abs(got["colbert"] - np.array(ORACLE["colbert"][1])).max() <= TOLERANCE


@pytest.mark.parametrize("run,weights", [("alone", None), ("alone_weighted", ORACLE["weights"])])
def test_compute_score_equals_flagembedding_pair_by_pair(flag_model, run, weights):
    got = flag_model.compute_score([tuple(p) for p in ORACLE["pairs"]], weights=weights)
    assert set(got) == set(SCORE_MODES)
    for mode in SCORE_MODES:
        assert np.abs(np.array(got[mode]) - ORACLE["scores"][run][mode]).max() <= TOLERANCE, mode


def test_compute_score_differs_from_a_flagembedding_batch_only_by_its_padding(flag_model):
    """FlagEmbedding pads a batch of passages, and a padding position's zero ColBERT vector scores
    0 against every query token: its colbert score is ours or above, never below (the docstring of
    inference/m3.py); dense and sparse do not depend on the batch."""
    got = flag_model.compute_score([tuple(p) for p in ORACLE["pairs"]])
    batched = ORACLE["scores"]["batched"]
    for mode in ("dense", "sparse"):
        assert np.abs(np.array(got[mode]) - batched[mode]).max() <= TOLERANCE
    assert all(theirs >= ours - TOLERANCE for ours, theirs in zip(got["colbert"], batched["colbert"]))


def test_one_pair_gives_floats(flag_model):
    got = flag_model.compute_score(tuple(ORACLE["pairs"][0]))
    assert abs(got["dense"] - ORACLE["scores"]["alone"]["dense"][0]) <= TOLERANCE


# ---------------------------------------------------------------------------------------------
# one forward pass, results independent of the batch
# ---------------------------------------------------------------------------------------------
def test_three_outputs_come_from_one_forward_pass(tiny_dirs):
    engine = Engine.load(tiny_dirs["m3"], use="embed")
    texts = ["a cat sat on the mat", "the dog ran", "hello"]
    got = encode_m3(engine, texts)
    assert engine.stats.batches == 1 and engine.stats.sequences == len(texts)
    assert got["dense"].shape == (3, 36) and got["colbert"][0].shape[1] == 29
    alone = [encode_m3(engine, [t]) for t in texts]
    for i, one in enumerate(alone):
        assert torch.allclose(one["dense"][0], got["dense"][i], atol=TOLERANCE)
        assert torch.equal(one["sparse"][0][0], got["sparse"][i][0])
        assert torch.allclose(one["sparse"][0][1], got["sparse"][i][1], atol=TOLERANCE)
        assert torch.allclose(one["colbert"][0], got["colbert"][i], atol=TOLERANCE)


def test_lexical_weights_keep_each_ids_largest_and_drop_specials(tiny_dirs):
    engine = Engine.load(tiny_dirs["m3"], use="embed")
    text = "the cat and the cat and the dog"
    (indices, values), = encode_m3(engine, [text], "sparse")["sparse"]
    ids = torch.tensor(engine.encode([text])[0].ids)
    hidden = engine.model.forward_packed(ids, torch.zeros_like(ids), Packed.from_lengths([len(ids)], "cpu")).hidden
    weights = engine.m3.sparse_linear(hidden).relu().squeeze(-1)
    tok = engine.tokenizer
    want = {}
    for token, weight in zip(ids.tolist(), weights.tolist()):
        if token not in (tok.cls_token_id, tok.sep_token_id, tok.pad_token_id, tok.unk_token_id) and weight > 0:
            want[token] = max(want.get(token, 0.0), weight)
    assert indices.tolist() == sorted(want)
    assert torch.allclose(values, torch.tensor([want[i] for i in sorted(want)]), atol=1e-6)


def test_dense_alone_runs_on_any_model_and_the_heads_are_asked_for_by_name(tiny_dirs):
    plain = bertkit.load(tiny_dirs["plain"], device="cpu")
    dense = plain.encode(["a cat"], output="dense")["dense"]
    assert np.allclose(dense, plain.encode(["a cat"], normalize=True), atol=TOLERANCE)  # its own pooling
    with pytest.raises(ValueError) as err:
        plain.encode(["a cat"], output=("dense", "colbert"))
    message = str(err.value)
    assert "\n" not in message and str(tiny_dirs["plain"]) in message
    assert "no BGE-M3 heads; output 'colbert' needs" in message and "colbert_linear.pt" in message


@pytest.mark.parametrize("call,message", [
    (lambda m: m.encode(["x"], output="words"), "unknown output 'words'; choose from dense, sparse, colbert"),
    (lambda m: m.encode(["x"], output=()), "no output asked for"),
    (lambda m: m.encode(["x"], output="dense", pooling="mean"), "leave them out"),
    (lambda m: m.compute_score([("a", "b")], weights=[1, 1]), "weights must be three numbers"),
    (lambda m: m.compute_score([("a", "b")], weights=[0, 0, 1]), "sum to 0"),
    (lambda m: m.compute_score([("a", "b", "c")]), "pair 0 is not a (query, passage) pair"),
])
def test_bad_calls_are_one_line(tiny_dirs, call, message):
    model = bertkit.load(tiny_dirs["m3"], device="cpu")
    with pytest.raises(ValueError) as err:
        call(model)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_scores_by_hand(tiny_dirs):
    """compute_score's modes from encode's outputs: inner products, MaxSim / query tokens, means."""
    engine = Engine.load(tiny_dirs["m3"], use="embed")
    q, p = "where is the cat", "the cat sat on the mat"
    got = compute_score(engine, [(q, p)], weights=(2.0, 1.0, 3.0))
    out = encode_m3(engine, [q, p])
    dense = float(out["dense"][0] @ out["dense"][1])
    (qi, qv), (pi, pv) = out["sparse"]
    sparse = sum(float(v) * float(pv[pi.tolist().index(i)]) for i, v in zip(qi.tolist(), qv) if i in pi.tolist())
    colbert = float((out["colbert"][0] @ out["colbert"][1].T).max(dim=1).values.mean())
    assert got["dense"][0] == pytest.approx(dense, abs=1e-6)
    assert got["sparse"][0] == pytest.approx(sparse, abs=1e-6)
    assert got["colbert"][0] == pytest.approx(colbert, abs=1e-6)
    assert got["sparse+dense"][0] == pytest.approx((sparse * 1 + dense * 2) / 3, abs=1e-6)
    assert got["colbert+sparse+dense"][0] == pytest.approx((colbert * 3 + sparse + dense * 2) / 6, abs=1e-6)


# ---------------------------------------------------------------------------------------------
# the head files
# ---------------------------------------------------------------------------------------------
def test_heads_read_the_same_from_pt_and_safetensors(tmp_path):
    pt = read_m3_heads(FIXTURE / "model", 36)
    write_m3_heads(pt, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["colbert_linear.safetensors", "sparse_linear.safetensors"]
    again = read_m3_heads(tmp_path, 36)
    for a, b in zip(pt.state_dict().values(), again.state_dict().values()):
        assert torch.equal(a, b)
    write_m3_heads(pt, tmp_path / "pt", fmt="pt")
    assert torch.equal(torch.load(tmp_path / "pt" / "sparse_linear.pt", weights_only=True)["weight"],
                       pt.sparse_linear.weight)


def _m3_copy(tmp_path: Path) -> Path:
    out = tmp_path / "m3"
    shutil.copytree(FIXTURE / "model", out)
    return out


class _Code:
    """Pickled as a class instance: a weights-only load refuses to build it."""


@pytest.mark.parametrize("damage,message", [
    (lambda d: (d / "sparse_linear.pt").write_bytes(b"not a checkpoint"), "could not be read as a weights-only"),
    (lambda d: torch.save(_Code(), d / "colbert_linear.pt"), "could not be read as a weights-only"),
    (lambda d: torch.save({"weight": torch.zeros(1, 36)}, d / "sparse_linear.pt"), "not a Linear layer's"),
    (lambda d: torch.save({"weight": torch.zeros(2, 36), "bias": torch.zeros(2)}, d / "sparse_linear.pt"),
     "do not make a Linear"),
    (lambda d: (d / "sparse_linear.pt").unlink(), "has colbert_linear.pt but no sparse_linear.pt"),
])
def test_a_bad_head_file_is_one_line_naming_it(tmp_path, damage, message):
    directory = _m3_copy(tmp_path)
    damage(directory)
    with pytest.raises(ValueError) as err:
        Engine.load(directory, use="embed")
    assert message in str(err.value) and "\n" not in str(err.value)
    assert str(directory) in str(err.value)


def test_heads_move_with_the_engines_precision(tiny_dirs):
    engine = Engine.load(tiny_dirs["m3"], use="embed", precision="bf16")
    assert engine.m3.colbert_linear.weight.dtype == torch.bfloat16
    got = encode_m3(engine, ["a cat sat"])
    fp32 = encode_m3(Engine.load(tiny_dirs["m3"], use="embed"), ["a cat sat"])
    assert got["colbert"][0].dtype == torch.float32
    assert torch.nn.functional.cosine_similarity(got["colbert"][0], fp32["colbert"][0]).min() > 0.98


def test_m3_heads_module_sizes():
    heads = M3Heads(36, 29)
    assert heads.colbert_dim == 29 and heads.sparse_linear.out_features == 1


# ---------------------------------------------------------------------------------------------
# the command line
# ---------------------------------------------------------------------------------------------
def test_cli_prints_and_writes_the_outputs(tiny_dirs, tmp_path, capsys):
    model = str(tiny_dirs["m3"])
    assert cli.main(["embed", model, "a cat sat", "--output", "sparse,colbert", "--json"]) == 0
    row = json.loads(capsys.readouterr().out.splitlines()[0])
    assert set(row) == {"text", "sparse", "colbert"} and len(row["colbert"][0]) == 29
    texts = tmp_path / "texts.txt"
    texts.write_text("a cat sat\nthe dog ran far\n", encoding="utf-8")
    out = tmp_path / "m3.jsonl"
    assert cli.main(["embed", model, "--input", str(texts), "--out", str(out), "--output", "dense,sparse,colbert",
                     "--no-progress"]) == 0
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    want = encode_m3(Engine.load(tiny_dirs["m3"], use="embed"), ["a cat sat", "the dog ran far"])
    assert [r["line"] for r in rows] == [1, 2]
    for row, dense, (indices, values), colbert in zip(rows, want["dense"], want["sparse"], want["colbert"]):
        assert np.allclose(row["dense"], dense.numpy(), atol=TOLERANCE)
        assert row["sparse"]["indices"] == indices.tolist()
        assert np.allclose(row["sparse"]["values"], values.numpy(), atol=TOLERANCE)
        assert np.allclose(row["colbert"], colbert.numpy(), atol=TOLERANCE)


@pytest.mark.parametrize("argv,message", [
    (["--output", "colbert", "--sparse"], "--sparse does not go with --output"),
    (["--output", "colbert", "--pooling", "cls"], "--pooling does not go with --output"),
    (["--output", "tokens"], "unknown output 'tokens'"),
])
def test_cli_refuses_what_does_not_go_with_output(tiny_dirs, capsys, argv, message):
    assert cli.main(["embed", str(tiny_dirs["m3"]), "a cat", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
