"""Model cards (bertkit.train.card): every saved model gets a README.md whose front matter and
figures are the run's own saved settings and results, whose usage snippets run as written, and
a README.md that bertkit did not write is left as it was."""

from __future__ import annotations

import json
import re

import pytest
import torch
import yaml

from bertkit.data.tokenizer import BertTokenizer
from bertkit.encoder.model import BertModel
from bertkit.train import card
from bertkit.train import finetune as ft

from finetune_fixtures import sentiment_file
from model_fixtures import save_tiny
from pretrain_fixtures import one_thread  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")


def front_matter(text: str) -> dict:
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1])


def snippets(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def table(text: str, heading: str) -> dict[str, str]:
    """The first two columns of the table under `heading` → {first: last}."""
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split("|") for line in section.splitlines() if line.startswith("| ")]
    return {cells[0].strip() if len(cells) == 2 else f"{cells[0].strip()}/{cells[1].strip()}": cells[-1].strip()
            for cells in rows[1:]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, minilm_dir):
    """A tiny base, and two classify runs over it on the same data: full and as a LoRA adapter."""
    root = tmp_path_factory.mktemp("cards")
    base = save_tiny(BertModel, BertTokenizer.from_pretrained(minilm_dir), root / "base", seed=3)
    train, dev = sentiment_file(root / "train.jsonl", 32, 1), sentiment_file(root / "dev.jsonl", 16, 2)
    common = dict(eval_file=str(dev), test=str(dev), epochs=2, batch_size=16, max_length=16, lr=2e-3,
                  progress=False, precision="fp32", device="cpu")
    full = root / "full"
    ft.finetune("classify", str(base), str(train), str(full), **common)
    adapter = root / "adapter"
    ft.finetune("classify", str(base), str(train), str(adapter), lora="r=4,alpha=8,dropout=0,targets=query,value",
                lora_save="adapters", **common)
    return base, train, dev, full, adapter


def test_finetune_card_is_the_runs_own(runs):
    base, train, dev, full, _ = runs
    text = (full / "README.md").read_text(encoding="utf-8")
    meta = front_matter(text)
    assert meta["library_name"] == "transformers" and meta["pipeline_tag"] == "text-classification"
    assert meta["base_model"] == str(base) and {"bertkit", "finetune", "classify"} <= set(meta["tags"])
    assert "datasets" not in meta  # local files name no dataset
    assert card.MARK in text
    config = json.loads((full / "finetune_config.json").read_text())
    summary = json.loads((full / "eval.json").read_text())
    settings = table(text, "### Hyper-parameters")
    assert settings["lr"] == str(config["lr"]) and settings["epochs"] == "2" and settings["batch_size"] == "16"
    assert settings["precision"] == summary["data"]["precision"] and "out_dir" not in settings
    results = table(text, "## Results")
    for split in ("eval", "test"):
        for metric, value in summary[split].items():
            if isinstance(value, float):
                assert results[f"{split}/{metric}"] == f"{value:.4f}"
    assert f"**Data (train):** {train}" in text and f"**Data (test):** {dev}" in text
    assert "**Labels:** neg, pos" in text and "cross-entropy over the labels" in text
    assert f"best epoch {summary['best_epoch']} of 2 by {summary['metric']}" in text
    # both snippets run as written, and agree
    found = {}
    for code in snippets(text):
        scope: dict = {}
        exec(code, scope)
        found["bertkit" if "bertkit" in code else "transformers"] = scope["model"]
    assert set(found) == {"bertkit", "transformers"}
    batch = found["bertkit"].tokenizer(["great film"], None, max_length=16)
    with torch.no_grad():
        theirs = found["transformers"](input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                       token_type_ids=batch["token_type_ids"]).logits.softmax(-1)[0]
    ours = found["bertkit"].classify("great film")["scores"]
    assert torch.allclose(torch.tensor([ours["neg"], ours["pos"]]), theirs, atol=1e-5)


def test_adapter_card_says_peft_and_its_snippet_loads_it(runs):
    peft = pytest.importorskip("peft")
    base, _, _, full, adapter = runs
    text = (adapter / "README.md").read_text(encoding="utf-8")
    meta = front_matter(text)
    assert meta["library_name"] == "peft" and meta["base_model"] == str(base.resolve())
    assert "lora" in meta["tags"] and "PEFT adapter over it" in text
    assert "r=4,alpha=8,dropout=0,targets=query,value" in text
    codes = snippets(text)
    assert len(codes) == 2  # bertkit and transformers + PEFT; no sentence-transformers for a classifier
    for code in codes:
        scope: dict = {}
        exec(code, scope)
        if "PeftModel" in code:
            assert isinstance(scope["model"], peft.PeftModel)
        else:
            assert scope["model"].use == "classify"


def test_a_readme_bertkit_did_not_write_stays(runs, tmp_path):
    _, _, _, full, _ = runs
    own = card.finetune_facts(full)
    own.model_dir = tmp_path
    (tmp_path / "README.md").write_text("# My notes\n", encoding="utf-8")
    assert card.write_card(own) is None
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == "# My notes\n"
    (tmp_path / "README.md").write_text(card.render(own).replace("Training", "Old"), encoding="utf-8")
    assert card.write_card(own) == tmp_path / "README.md"  # ours: written again from the run's files
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == card.render(own)
    # the same files give the same card
    assert card.render(card.finetune_facts(full)) == (full / "README.md").read_text(encoding="utf-8")
    # a run started afresh drops the earlier run's card, never anyone else's README.md
    card.drop_stale(tmp_path)
    assert not (tmp_path / "README.md").exists()
    (tmp_path / "README.md").write_text("# My notes\n", encoding="utf-8")
    card.drop_stale(tmp_path)
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == "# My notes\n"


def test_embedding_run_card_has_a_working_sentence_transformers_snippet(tmp_path):
    pytest.importorskip("sentence_transformers")
    from bertkit.train import retrieval as rt

    from retrieval_fixtures import sentences, tiny_encoder

    base = tiny_encoder(tmp_path / "base")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"query": " ".join(t.split()[:2]), "positive": t}) + "\n"
                             for t in sentences(16, seed=4)), encoding="utf-8")
    out = tmp_path / "embed"
    rt.finetune_retrieval(task="embed", model=str(base), train=str(pairs), out_dir=str(out), epochs=1,
                          batch_size=8, lr=1e-3, progress=False, max_length=24, eval=str(pairs))
    text = (out / "README.md").read_text(encoding="utf-8")
    meta = front_matter(text)
    assert meta["library_name"] == "sentence-transformers" and meta["pipeline_tag"] == "sentence-similarity"
    assert "in-batch negatives" in text and "scale 20.0" in text
    summary = json.loads((out / "eval.json").read_text())
    assert table(text, "## Results")["eval/mrr@10"] == f"{summary['eval']['mrr@10']:.4f}"
    vectors = {}
    for code in snippets(text):
        scope: dict = {}
        exec(code, scope)
        if "SentenceTransformer" in code:
            vectors["st"] = scope["model"].encode(["A sentence"])
        elif "bertkit" in code:
            vectors["bertkit"] = scope["model"].encode(["A sentence"])
    assert set(vectors) == {"st", "bertkit"}
    assert abs(vectors["st"] - vectors["bertkit"]).max() < 1e-5


def test_pretrain_and_distill_cards(tmp_path, runs):
    from bertkit.train import distill as ds
    from bertkit.train.pretrain import PretrainConfig, pretrain

    from pretrain_fixtures import make_data, write_model_config

    data = make_data(tmp_path / "data", n_docs=40)
    run = tmp_path / "run"
    summary = pretrain(PretrainConfig(data=str(data), out=str(run), model=str(write_model_config(tmp_path / "m.json")),
                                      max_steps=3, batch_size=8, log_every=1, eval_every=3, eval_batches=1,
                                      progress=False, num_workers=0, seed=1))
    text = (run / "model" / "README.md").read_text(encoding="utf-8")
    meta = front_matter(text)
    assert meta["pipeline_tag"] == "fill-mask" and "base_model" not in meta
    assert "pre-trained from random weights" in text and f"optimizer steps: {summary['steps']} of 3" in text
    assert f"**Data (data):** {data}" in text and table(text, "### Hyper-parameters")["lr"] == "0.0005"
    assert "NSP sentence-pair cross-entropy" in text  # make_data prepares mlm+nsp
    assert table(text, "## Results")["held-out/mlm_loss"] == f"{summary['eval']['mlm_loss']:.4f}"
    _, train, dev, full, _ = runs
    out = tmp_path / "student"
    summary = ds.distill(ds.DistillConfig(teacher=str(full), out_dir=str(out), task="classify", train=str(train),
                                          eval=str(dev), student_layers=1, epochs=1, batch_size=16, max_length=16,
                                          progress=False, precision="fp32", device="cpu"))
    text = (out / "model" / "README.md").read_text(encoding="utf-8")
    meta = front_matter(text)
    assert meta["base_model"] == str(full) and meta["pipeline_tag"] == "text-classification"
    assert "distilled from the teacher" in text and f"(teacher layers {summary['layers']})" in text
    assert "temperature 2.0" in text


def test_rerank_run_card_has_a_working_cross_encoder_snippet(tmp_path):
    pytest.importorskip("sentence_transformers")
    from bertkit.train import retrieval as rt

    from retrieval_fixtures import sentences, tiny_encoder

    base = tiny_encoder(tmp_path / "base")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"query": " ".join(t.split()[:2]), "positive": t}) + "\n"
                             for t in sentences(16, seed=5)), encoding="utf-8")
    out = tmp_path / "rerank"
    rt.finetune_retrieval(task="rerank", model=str(base), train=str(pairs), out_dir=str(out), epochs=1,
                          batch_size=8, lr=1e-3, progress=False, max_length=24, negatives=1)
    text = (out / "README.md").read_text(encoding="utf-8")
    meta = front_matter(text)
    assert meta["library_name"] == "sentence-transformers" and meta["pipeline_tag"] == "text-ranking"
    assert "listwise over a positive and 1 negatives (mined by bm25)" in text
    ranked = {}
    for code in snippets(text):
        scope: dict = {}
        exec(code, scope)
        model = scope["model"]
        if "CrossEncoder" in code:
            ranked["st"] = model.rank("a query", ["a document", "another"])
        elif "bertkit" in code:
            ranked["bertkit"] = model.rerank("a query", ["a document", "another"])
    assert set(ranked) == {"st", "bertkit"}
    assert [r["corpus_id"] for r in ranked["st"]] == [r["index"] for r in ranked["bertkit"]]
    assert all(abs(a["score"] - b["score"]) < 1e-5 for a, b in zip(ranked["st"], ranked["bertkit"]))
