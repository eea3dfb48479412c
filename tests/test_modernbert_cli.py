"""A transformers-made ModernBERT directory (byte-level BPE tokenizer.json) through every use and
training path: info, fill-mask, embed (sentence-transformers files too), classify, rerank, ner,
qa, finetune (full and LoRA on Wqkv / Wo / Wi), pretrain from the modern-tiny preset, and
8,192-token inputs; outputs equal to transformers' (and sentence-transformers', PEFT's)."""

from __future__ import annotations

import json

import pytest
import torch

from bertkit.cli import main
from bertkit.inference import Engine, classify, embed, fill_mask, ner, qa, rerank

from family_fixtures import transformers_mean, transformers_top_masked
from modern_fixtures import make_modernbert

transformers = pytest.importorskip("transformers")

TEXTS = ["The cat sat on the mat.", "Paris is the capital of France.", "A dog ran in the park today."]
TOL = 1e-5


@pytest.fixture(scope="module")
def mlm_dir(tmp_path_factory):
    return make_modernbert(tmp_path_factory.mktemp("modern") / "mlm")


def test_info_counts_parameters_as_transformers(mlm_dir, capsys):
    assert main(["info", str(mlm_dir)]) == 0
    out = capsys.readouterr().out
    assert "ModernBertForMaskedLM" in out and "local, ±8 tokens" in out and "final LayerNorm" in out
    total = int(out.strip().splitlines()[-1].split()[-1].replace(",", ""))
    assert total == transformers.AutoModelForMaskedLM.from_pretrained(mlm_dir).num_parameters()


def test_fill_mask_equals_transformers(mlm_dir):
    text = "Paris is the [MASK] of France."
    ours = fill_mask(mlm_dir, [text], top_k=5)[0][0]
    ids, scores = transformers_top_masked(mlm_dir, text)
    assert [c.token_id for c in ours] == ids
    assert max(abs(c.score - p) for c, p in zip(ours, scores)) <= 1e-6


def test_embed_equals_transformers_and_sentence_transformers(mlm_dir, tmp_path):
    ours = embed(mlm_dir, TEXTS, pooling="mean", normalize=False)
    assert float((ours - transformers_mean(mlm_dir, TEXTS)).abs().max()) <= TOL
    pytest.importorskip("sentence_transformers")
    from sentence_transformers import SentenceTransformer, models

    word = models.Transformer(str(mlm_dir))
    pooling = models.Pooling(word.get_embedding_dimension(), pooling_mode="cls")
    model = SentenceTransformer(modules=[word, pooling, models.Normalize()], device="cpu")
    model.save(str(tmp_path / "st"))
    # the pooling file as released ModernBERT embedders (gte-modernbert-base) ship it
    (tmp_path / "st" / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 32, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}))
    model = SentenceTransformer(str(tmp_path / "st"), device="cpu")
    theirs = torch.as_tensor(model.encode(TEXTS, convert_to_numpy=True))
    mine = embed(tmp_path / "st", TEXTS)  # cls + unit length, from its own pooling files
    assert float((mine - theirs).abs().max()) <= TOL


def test_long_inputs_run_whole_and_alone_equals_batched(mlm_dir, tmp_path):
    """An 8,192-token text: no windows, cut only at the model's limit, the same vector (and the same
    class probabilities) alone and in a batch."""
    engine = Engine.load(mlm_dir, use="embed")
    assert engine.max_length == 8192
    long = " ".join(TEXTS * 700)
    assert len(engine.encode([long])[0].ids) == 8192  # cut at the model's 8,192 positions
    alone = embed(engine, [long], normalize=False)
    batched = embed(engine, ["short one", long, TEXTS[0]], normalize=False)
    assert float((batched[1] - alone[0]).abs().max()) <= TOL
    classifier = make_modernbert(tmp_path / "cls", kind="ForSequenceClassification", num_labels=2)
    one = classify(classifier, [long])[0]["scores"]
    many = classify(classifier, [TEXTS[1], long])[1]["scores"]
    assert max(abs(one[k] - many[k]) for k in one) <= TOL


def test_classify_and_rerank_equal_transformers(tmp_path):
    directory = make_modernbert(tmp_path / "cls", kind="ForSequenceClassification", num_labels=3,
                                classifier_pooling="mean")
    ours = classify(directory, TEXTS)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(directory).eval()
    with torch.no_grad():
        probs = model(**tokenizer(TEXTS, padding=True, return_tensors="pt")).logits.softmax(-1)
    labels = [model.config.id2label[i] for i in range(3)]
    assert float((torch.tensor([[r["scores"][n] for n in labels] for r in ours]) - probs).abs().max()) <= TOL

    cross = make_modernbert(tmp_path / "rerank", kind="ForSequenceClassification", num_labels=1)
    ranked = rerank(cross, "capital of France", TEXTS)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(cross).eval()
    with torch.no_grad():
        pairs = tokenizer(["capital of France"] * 3, TEXTS, padding=True, return_tensors="pt")
        scores = model(**pairs).logits[:, 0].sigmoid()
    assert [r["index"] for r in ranked] == scores.argsort(descending=True).tolist()
    assert max(abs(r["score"] - float(scores[r["index"]])) for r in ranked) <= TOL


def test_ner_and_qa_uses_equal_transformers(tmp_path):
    tags = {0: "O", 1: "B-LOC", 2: "I-LOC"}
    directory = make_modernbert(tmp_path / "ner", kind="ForTokenClassification", num_labels=3, id2label=tags)
    engine = Engine.load(directory, use="ner")
    model = transformers.AutoModelForTokenClassification.from_pretrained(directory).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    with torch.no_grad():
        theirs = model(**tokenizer([TEXTS[1]], return_tensors="pt")).logits[0]
    from bertkit.encoder.packing import Packed

    ids = torch.tensor(engine.encode([TEXTS[1]])[0].ids)
    with torch.no_grad():
        mine = engine.model.forward_packed(ids, torch.zeros_like(ids), Packed.from_lengths([len(ids)])).logits
    assert float((mine - theirs).abs().max()) <= TOL
    assert len(ner(engine, [TEXTS[1]])) == 1

    qa_dir = make_modernbert(tmp_path / "qa", kind="ForQuestionAnswering")
    answers = qa(qa_dir, ["What is the capital?"], [TEXTS[1]], max_seq_length=64, doc_stride=16,
                 max_question_length=16)
    assert len(answers) == 1 and answers[0] and answers[0][0]["text"]


def test_finetune_then_predict_match_transformers(mlm_dir, tmp_path):
    data = tmp_path / "train.csv"
    data.write_text("text,label\n" + "".join(f"{t},{'pos' if i % 2 else 'neg'}\n" for i, t in enumerate(TEXTS * 2)))
    out = tmp_path / "model"
    assert main(["finetune", "--task", "classify", "--model", str(mlm_dir), "--train", str(data), "--out", str(out),
                 "--epochs", "1", "--batch-size", "3", "--max-length", "32", "--precision", "fp32",
                 "--no-progress"]) == 0
    assert json.loads((out / "config.json").read_text())["architectures"] == ["ModernBertForSequenceClassification"]
    predictions = tmp_path / "pred.jsonl"
    assert main(["predict", "--model", str(out), "--input", str(data), "--out", str(predictions),
                 "--no-progress"]) == 0
    rows = [json.loads(line) for line in predictions.read_text().splitlines()]
    model, info = transformers.AutoModelForSequenceClassification.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    with torch.no_grad():
        probs = model.eval()(**tokenizer(TEXTS * 2, padding=True, return_tensors="pt")).logits.softmax(-1)
    labels = [model.config.id2label[i] for i in range(probs.shape[1])]
    ours = torch.tensor([[r["scores"][name] for name in labels] for r in rows])
    assert float((ours - probs).abs().max()) <= TOL


def test_lora_on_modernbert_names_loads_in_peft(tmp_path):
    peft = pytest.importorskip("peft")
    from bertkit.encoder.heads import BertForSequenceClassification
    from bertkit.train import lora

    base = make_modernbert(tmp_path / "base", kind="ForSequenceClassification", num_labels=2)
    model = BertForSequenceClassification.from_pretrained(base)
    with pytest.raises(ValueError, match="'query' is not a module of a modernbert model"):
        lora.apply_lora(BertForSequenceClassification.from_pretrained(base), lora.LoraSpec(targets=("query",)))
    report = lora.apply_lora(model, lora.LoraSpec(r=4, alpha=8, dropout=0.0, targets=("Wqkv", "Wo", "Wi")))
    layer = model.bert.layers[0]
    assert all(isinstance(getattr(layer, m), lora.LoRALinear) for m in ("qkv", "attn_out", "ffn_in", "ffn_out"))
    assert report.modules_to_save == ["head", "classifier"]
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.normal_(0, 0.1)
    adapter = lora.save_adapters(model, tmp_path / "adapter", base_model=str(base))
    theirs = peft.PeftModel.from_pretrained(transformers.AutoModelForSequenceClassification.from_pretrained(base),
                                            adapter).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(base)
    inputs = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        assert float((model.eval()(**inputs).logits - theirs(**inputs).logits).abs().max()) <= TOL


def test_pretrain_modern_tiny_masks_30_percent_without_nsp(tmp_path):
    from pretrain_fixtures import make_data

    data = make_data(tmp_path / "d", nsp=False, n_docs=80)
    run = tmp_path / "run"
    assert main(["pretrain", "--data", str(data), "--out", str(run), "--model", "modern-tiny", "--max-steps", "3",
                 "--batch-size", "8", "--log-every", "1", "--precision", "fp32", "--no-progress", "--threads",
                 "1"]) == 0
    settings = json.loads((run / "pretrain_config.json").read_text())
    assert settings["mlm_probability"] == 0.3 and settings["model"] == "modern-tiny"
    model_dir = run / "model" if (run / "model").is_dir() else run
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["ModernBertForMaskedLM"] and config["model_type"] == "modernbert"
    theirs, info = transformers.AutoModelForMaskedLM.from_pretrained(model_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]


def test_explorer_attention_equals_transformers_output_attentions(mlm_dir):
    """The explorer's written-out attention (window and padding applied) is transformers' eager
    `output_attentions`, and its trace ends at the model's hidden states; the views answer."""
    from bertkit.explore import views

    explorer = views.Explorer.load(mlm_dir)
    text = " ".join(TEXTS)  # longer than the 16-token window
    enc = explorer.encode(text)
    ids = torch.tensor([enc.ids])
    trace = views.attention_trace(explorer.encoder, ids, torch.zeros_like(ids))
    model = transformers.AutoModel.from_pretrained(mlm_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        ref = model(input_ids=ids, output_attentions=True)
    assert len(trace.probs) == len(ref.attentions) == 4
    for ours, theirs in zip(trace.probs, ref.attentions):
        assert float((ours - theirs).abs().max()) <= TOL
    assert float((trace.hidden - ref.last_hidden_state).abs().max()) <= TOL
    assert views.attention(explorer, text, pad=2)["layers"] == 4
    assert views.assembly(explorer, TEXTS[0])["vectors"]["position"] is None
    assert views.info(explorer)["model"]["config"]["max_position_embeddings"] == 8192


def test_serve_answers_for_a_modernbert_directory(mlm_dir):
    """The service loads it by its head (fill-mask) and answers embed and fill-mask as the library does."""
    import httpx

    from bertkit.serve import Limits, Service, build_app, load_model

    from web_fixtures import running_app

    service = Service({"modern": load_model("modern", mlm_dir)}, Limits())
    with running_app(build_app(service), 20.0) as url, httpx.Client(base_url=url, timeout=20.0) as client:
        vectors = client.post("/embed", json={"inputs": TEXTS}).json()
        filled = client.post("/fill-mask", json={"inputs": "Paris is the [MASK] of France."})
    assert float((torch.tensor(vectors) - embed(mlm_dir, TEXTS)).abs().max()) <= TOL
    assert filled.status_code == 200, filled.text


def test_the_python_front_door_takes_modernbert(mlm_dir):
    """bertkit.load over a transformers-made ModernBERT: encode is the mean of its states (no
    sentence-transformers files), fill_mask the library's."""
    import numpy as np

    import bertkit

    model = bertkit.load(mlm_dir)
    assert model.use == "fill-mask"
    np.testing.assert_allclose(model.encode(TEXTS), transformers_mean(mlm_dir, TEXTS).numpy(), atol=TOL)
    masked = f"Paris is the {model.tokenizer.special_tokens['mask_token']} of France."
    want = fill_mask(mlm_dir, [masked], top_k=3)[0]
    assert [[c["token_id"] for c in m] for m in model.fill_mask(masked, top_k=3)] == [[c.token_id for c in m]
                                                                                       for m in want]
