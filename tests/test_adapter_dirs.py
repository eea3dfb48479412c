"""A LoRA adapter directory is a model everywhere (`bertkit.adapters.resolve`): `bertkit.load`,
the use commands, predict, eval and serve take ADAPTER_DIR (its base from adapter_config.json,
or --base) or BASE --adapter DIR, and answer as PEFT's merged model (`merge_and_unload`, saved
and run by transformers: the oracle) does."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from bertkit import cli
from bertkit.adapters import AdapterError, base_of, is_adapter_dir, open_engine, resolve
from bertkit.data.tokenizer import BertTokenizer
from bertkit.encoder.model import BertModel
from bertkit.inference.ner import token_logits

from model_fixtures import save_tiny
from pretrain_fixtures import one_thread  # noqa: F401

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ["Shares fell sharply in early trading.", "The striker scored twice", "a",
         "Parliament passed the bill after a long debate on taxes and spending.", "new phones"]
ELSEWHERE = "someone/bert-base-on-the-hub"


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    return BertTokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory, tokenizer):
    return save_tiny(BertModel, tokenizer, tmp_path_factory.mktemp("base"), seed=3)


def peft_adapter(base_dir, out, task_type: str, hf_class, targets, seed: int, **head):
    """A PEFT adapter over `base_dir` with random non-zero LoRA B (out/adapter, written by PEFT's
    save_pretrained), and the oracle: PEFT's model merged, saved by transformers (out/merged)."""
    torch.manual_seed(seed)
    hf = hf_class.from_pretrained(base_dir, **head)
    model = peft.get_peft_model(hf, peft.LoraConfig(task_type=task_type, r=4, lora_alpha=8,
                                                   target_modules=list(targets)))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name or ("modules_to_save" in name and "classifier" in name):
                param.copy_(torch.randn(param.shape) * 0.3)
    model.eval()
    model.save_pretrained(out / "adapter")
    merged = model.merge_and_unload()
    merged.save_pretrained(out / "merged")
    BertTokenizer.from_pretrained(base_dir).save_pretrained(out / "merged")
    return out / "adapter", out / "merged", merged


@pytest.fixture(scope="module")
def topics(tmp_path_factory, base_dir):
    """A sequence classifier adapter, its merged twin, and the merged transformers model."""
    return peft_adapter(base_dir, tmp_path_factory.mktemp("topics"), "SEQ_CLS",
                        transformers.BertForSequenceClassification, ["query", "value", "dense"], seed=1,
                        num_labels=3)


def hf_batch(tokenizer, texts):
    batch = tokenizer(texts, None, max_length=64)
    return {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}


def ordered(scores: dict[str, float]) -> list[float]:
    """A classifier's scores by label index (a PEFT adapter's labels are LABEL_0, LABEL_1, ...)."""
    return [scores[f"LABEL_{i}"] for i in range(len(scores))]


def elsewhere_copy(adapter, tmp_path):
    """The adapter as copied from another machine: its base a name that is no directory here."""
    moved = tmp_path / "moved"
    shutil.copytree(adapter, moved)
    config = json.loads((moved / "adapter_config.json").read_text())
    (moved / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": ELSEWHERE}))
    return moved


def test_resolver(tmp_path, base_dir, topics):
    adapter, merged, _ = topics
    assert is_adapter_dir(adapter) and not is_adapter_dir(merged) and not is_adapter_dir(tmp_path / "none")
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == str(base_dir)
    assert base_of(adapter) == base_dir
    assert resolve(adapter) == (base_dir, adapter)
    assert resolve(base_dir, adapter) == (base_dir, adapter)
    assert resolve(merged) == (merged, None)
    moved = elsewhere_copy(adapter, tmp_path)
    with pytest.raises(AdapterError, match=f"base_model_name_or_path '{ELSEWHERE}', is not a model directory "
                                           "here; pass --base DIR"):
        resolve(moved)
    assert resolve(moved, base=base_dir) == (base_dir, moved)
    with pytest.raises(AdapterError, match="--base goes with a LoRA adapter directory"):
        resolve(merged, base=base_dir)
    with pytest.raises(AdapterError, match="cannot be the base of --adapter"):
        resolve(adapter, adapter)
    with pytest.raises(AdapterError, match="adapter_config.json is missing"):
        resolve(base_dir, merged)
    with pytest.raises(FileNotFoundError, match="is a LoRA adapter directory, not a whole model"):
        BertModel.from_pretrained(adapter)


def test_info_shows_the_base_and_the_adapter(tmp_path, base_dir, topics, capsys):
    from safetensors.torch import load_file

    adapter, _, _ = topics
    saved = sum(t.numel() for t in load_file(str(adapter / "adapter_model.safetensors")).values())
    assert cli.main(["info", str(adapter)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{base_dir}: BertModel") and f"LoRA adapter {adapter} over {base_dir}: classify" in out
    # 2 layers × (query, value, and the three "dense" Linears) + the pooler; the tensors of PEFT's own file
    assert f"r=4, lora_alpha=8, 11 adapted modules, {saved:,} parameters" in out
    assert cli.main(["info", str(elsewhere_copy(adapter, tmp_path)), "--base", str(base_dir)]) == 0
    assert f"{saved:,} parameters" in capsys.readouterr().out


def test_every_entry_point_equals_peft_merged(tmp_path, base_dir, tokenizer, topics, capsys):
    import bertkit

    adapter, merged_dir, merged = topics
    with torch.no_grad():
        oracle = merged(**hf_batch(tokenizer, TEXTS)).logits.softmax(-1)  # (5, 3)
    moved = elsewhere_copy(adapter, tmp_path)
    for model in (bertkit.load(adapter, device="cpu"), bertkit.load(moved, base=base_dir, device="cpu"),
                  bertkit.load(base_dir, adapter=adapter, device="cpu")):
        assert model.use == "classify"
        scores = torch.tensor([ordered(row["scores"]) for row in model.classify(TEXTS)])
        assert torch.allclose(scores, oracle, atol=1e-5)
    # the command line: the use commands, --base, and predict over a file
    for argv in (["classify", str(adapter)], ["classify", str(moved), "--base", str(base_dir)],
                 ["classify", str(base_dir), "--adapter", str(adapter)]):
        assert cli.main([*argv, "--json", *TEXTS]) == 0
        rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert torch.allclose(torch.tensor([ordered(r["scores"]) for r in rows]), oracle, atol=1e-5)
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    for name, argv in (("adapter", ["--model", str(adapter)]), ("twin", ["--model", str(merged_dir)]),
                       ("moved", ["--model", str(moved), "--base", str(base_dir)])):
        assert cli.main(["predict", *argv, "--input", str(texts), "--out", str(tmp_path / f"{name}.jsonl"),
                         "--no-progress", "--device", "cpu"]) == 0, capsys.readouterr().err
    rows = {name: [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
            for name in ("adapter", "twin", "moved")}
    for row, twin, moved_row, want in zip(rows["adapter"], rows["twin"], rows["moved"], oracle):
        assert row["label"] == twin["label"] == moved_row["label"]
        assert np.allclose(ordered(row["scores"]), want.numpy(), atol=1e-5)
    capsys.readouterr()
    # an adapter whose base is elsewhere, without --base: one line naming the base and --base
    assert cli.main(["classify", str(moved), "a text"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and ELSEWHERE in err and "--base" in err
    assert cli.main(["ner", str(adapter), "a text"]) == 2
    assert f"is a classify adapter; run it with `bertkit classify {adapter}`" in capsys.readouterr().err
    assert cli.main(["fill-mask", str(adapter), "a [MASK]"]) == 2
    assert "fill-mask needs a model with a masked-LM head" in capsys.readouterr().err


def test_token_and_embedding_adapters_equal_peft_merged(tmp_path, base_dir, tokenizer, capsys):
    ner_adapter, _, ner_merged = peft_adapter(base_dir, tmp_path / "ner", "TOKEN_CLS",
                                              transformers.BertForTokenClassification, ["query", "key", "value"],
                                              seed=5, num_labels=5)
    engine = open_engine(ner_adapter, device="cpu")
    assert engine.use == "ner"
    features = [{"input_ids": e.ids, "token_type_ids": e.type_ids} for e in engine.encode(TEXTS)]
    ours = token_logits(engine, features, field="logits")
    batch = hf_batch(tokenizer, TEXTS)
    with torch.no_grad():
        theirs = ner_merged(**batch).logits  # (5, T, 5)
    for i, row in enumerate(ours):
        assert torch.allclose(row, theirs[i, : row.shape[0]], atol=1e-5)
    # an embedding adapter (PEFT's FEATURE_EXTRACTION over a bare encoder): mean pooling as sentence-transformers
    emb_adapter, emb_merged_dir, emb_merged = peft_adapter(
        base_dir, tmp_path / "emb", "FEATURE_EXTRACTION", transformers.BertModel, ["query", "value", "dense"],
        seed=7)
    with torch.no_grad():
        hidden = emb_merged(**batch).last_hidden_state  # (5, T, H)
    mask = batch["attention_mask"][..., None].float()  # (5, T, 1)
    oracle = (hidden * mask).sum(1) / mask.sum(1)  # (5, H)
    import bertkit

    vectors = bertkit.load(emb_adapter, device="cpu").encode(TEXTS)
    assert np.allclose(vectors, oracle.numpy(), atol=1e-5)
    # eval scores the adapter as its merged twin
    sts = tmp_path / "sts.jsonl"
    sts.write_text("".join(json.dumps({"sentence1": a, "sentence2": b, "score": s}) + "\n" for a, b, s in
                           zip(TEXTS, TEXTS[1:] + TEXTS[:1], (1, 4, 2, 5, 3))), encoding="utf-8")
    results = []
    for argv in ([str(emb_adapter)], [str(emb_merged_dir)], [str(base_dir), "--adapter", str(emb_adapter)]):
        assert cli.main(["eval", *argv, "--sts", str(sts), "--json", "--device", "cpu"]) == 0
        results.append(json.loads(capsys.readouterr().out))
    assert results[0]["scores"] == pytest.approx(results[1]["scores"], abs=1e-6)
    assert results[2]["scores"] == pytest.approx(results[1]["scores"], abs=1e-6)
    assert results[0]["adapter"] == str(emb_adapter) and "adapter" not in results[1]


def test_serve_takes_an_adapter_dir_as_a_model(tmp_path, base_dir, topics):
    import httpx

    from bertkit.cli.serve import models_and_adapters
    from bertkit.serve import Limits, Service, build_app, load_model
    from bertkit.serve.adapters import ServedAdapters

    from web_fixtures import running_app

    adapter, merged_dir, _ = topics
    moved = elsewhere_copy(adapter, tmp_path)
    # alone: its base joins the models under the base dir's name
    models, adapters = models_and_adapters([("topics", str(adapter))], None)
    assert models == [(base_dir.name, str(base_dir.resolve()))] and adapters == [("topics", str(adapter),
                                                                                   base_dir.name)]
    # beside its base, served already under another name: adapted over that one
    models, adapters = models_and_adapters([("b", str(base_dir)), ("topics", str(moved))], str(base_dir))
    assert models == [("b", str(base_dir))] and adapters == [("topics", str(moved), "b")]
    with pytest.raises(AdapterError, match=f"'{ELSEWHERE}', is not a model directory here; pass --base DIR"):
        models_and_adapters([("topics", str(moved))], None)
    with pytest.raises(ValueError, match="none is one; leave out --base"):
        models_and_adapters([("b", str(base_dir))], str(base_dir))
    served = {"b": load_model("b", base_dir)}
    hosts = ServedAdapters.attach(served)
    served["topics"] = hosts.load("topics", moved, "b")
    with running_app(build_app(Service(served, Limits(), adapters=hosts)), 20.0) as url:
        got = httpx.post(f"{url}/predict", json={"inputs": TEXTS, "model": "topics"}, timeout=20.0)
    assert got.status_code == 200, got.text
    import bertkit

    twin = bertkit.load(merged_dir, device="cpu").classify(TEXTS)
    for ours, theirs in zip(got.json(), twin):
        assert np.allclose(ordered({s["label"]: s["score"] for s in ours}), ordered(theirs["scores"]), atol=1e-5)
