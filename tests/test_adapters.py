"""Adapters over one base (bertkit.adapters): a row of a mixed batch equals its adapter merged
into a full model and run alone (≤ 1e-5 fp32), PEFT-made adapters load and give PEFT's outputs,
and adapters that do not fit are refused with what differs."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from bertkit.adapters import AdapterError, AdapterHost, load_engine, mixed_embeddings, mixed_logits
from bertkit.adapters.routed import RoutedLinear, Routing
from bertkit.data.tokenizer import BertTokenizer
from bertkit.encoder.heads import BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification
from bertkit.encoder.model import BertModel
from bertkit.inference import Engine, classify, embed, rerank
from bertkit.inference.classify import logits as sequence_logits
from bertkit.inference.ner import token_logits

from adapter_fixtures import make_adapter
from model_fixtures import save_tiny
from pretrain_fixtures import one_thread  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ["Shares fell sharply in early trading.", "The striker scored twice", "a",
         "Parliament passed the bill after a long debate on taxes and spending.", "new phones", "ok then"]


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    return BertTokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory, tokenizer):
    return save_tiny(BertModel, tokenizer, tmp_path_factory.mktemp("base"), seed=3)


@pytest.fixture(scope="module")
def classifiers(tmp_path_factory, base_dir):
    root = tmp_path_factory.mktemp("classifiers")
    return [make_adapter(base_dir, root / "topics", BertForSequenceClassification, seed=1,
                         labels=["business", "sport", "politics"]),
            make_adapter(base_dir, root / "sentiment", BertForSequenceClassification, seed=2,
                         targets=("query", "value"), labels=["neg", "pos"]),
            make_adapter(base_dir, root / "third", BertForSequenceClassification, seed=4,
                         targets=("intermediate", "output"), labels=["x", "y", "z", "w"], r=2)]


def test_mixed_batch_rows_equal_merged_models_alone(base_dir, tokenizer, classifiers):
    host = AdapterHost(Engine.load(base_dir, use="embed"), base_dir)
    loaded = [host.add(f"a{i}", adapter) for i, (adapter, _) in enumerate(classifiers)]
    encodings = host.engine.encode(TEXTS * 2)
    # every text through a different adapter, spread over the batch (packed order is by length)
    slots = [loaded[i % 3].slot for i in range(len(encodings))]
    models = {a.slot: a.engine.model for a in loaded}
    rows = mixed_logits(host.engine, [e.ids for e in encodings], [e.type_ids for e in encodings], slots, models)
    for i, row in enumerate(rows):
        merged = Engine.load(classifiers[i % 3][1], use="classify")
        alone = sequence_logits(merged, [(TEXTS * 2)[i]], None)[0]
        assert row.shape == alone.shape
        assert torch.allclose(row, alone, atol=1e-5), (i, row, alone)
    # and the view engines answer as the merged models do, labels included
    for adapter, (_, merged) in zip(loaded, classifiers):
        ours = classify(adapter.engine, TEXTS)
        theirs = classify(Engine.load(merged, use="classify"), TEXTS)
        assert [o["label"] for o in ours] == [t["label"] for t in theirs]
        assert all(abs(o["score"] - t["score"]) < 1e-5 for o, t in zip(ours, theirs))


def test_base_rows_untouched_and_adapters_drop(base_dir, classifiers):
    plain = embed(Engine.load(base_dir, use="embed"), TEXTS)
    host = AdapterHost(Engine.load(base_dir, use="embed"), base_dir)
    first = host.add("topics", classifiers[0][0])
    assert torch.allclose(embed(host.engine, TEXTS), plain, atol=1e-6)  # the base alone, adapters loaded
    adapted = embed(first.engine, TEXTS)
    assert not torch.allclose(adapted, plain, atol=1e-3)
    host.remove("topics")
    assert all(not m.terms for m in host.routed())
    with pytest.raises(KeyError, match="no adapter 'topics'"):
        host.remove("topics")


def test_routed_linear_gives_each_row_its_own_terms():
    """Rows of one batch in any order, of several slots (ranks 2, 3 and 5, terms on parts of the
    output), the base alone, and a slot with no terms in this layer: each row as W + B_s A_s."""
    torch.manual_seed(0)
    routing = Routing()
    layer = RoutedLinear(torch.nn.Linear(6, 9), routing)
    terms = {0: [(0, 3, torch.randn(2, 6), torch.randn(3, 2)), (6, 9, torch.randn(3, 6), torch.randn(3, 3))],
             1: [(0, 9, torch.randn(5, 6), torch.randn(9, 5))],
             3: [(3, 6, torch.randn(2, 6), torch.randn(3, 2))]}
    for slot, found in terms.items():
        layer.add_slot(slot, found)
    layer.drop_slot(3)

    def alone(x, slot):
        y = layer.base(x)
        for lo, hi, a, b in terms.get(slot, []) if slot != 3 else []:
            y[:, lo:hi] += (x @ a.T) @ b.T
        return y

    lengths, slots = [3, 1, 4, 2, 2, 5], [1, None, 0, 1, 2, 0]  # slot 2: no terms here
    x = torch.randn(sum(lengths), 6)
    with torch.inference_mode(), routing.route(lengths, slots, torch.device("cpu")):
        got = layer(x)
        first = layer(x[:len(lengths)])  # one row per sequence (a [CLS] head's layer)
    rows = [s for s, n in zip(slots, lengths) for _ in range(n)]
    want = torch.cat([alone(x[i:i + 1], s) for i, s in enumerate(rows)])
    assert torch.allclose(got, want, atol=1e-5)
    assert torch.allclose(first, torch.cat([alone(x[i:i + 1], s) for i, s in enumerate(slots)]), atol=1e-5)
    with torch.inference_mode(), routing.route([4, 2], [0, 0], torch.device("cpu")):  # one slot: no gather
        assert torch.allclose(layer(x[:6]), alone(x[:6], 0), atol=1e-5)
    with pytest.raises(RuntimeError, match="got 7 rows"), routing.route(lengths, slots, torch.device("cpu")):
        layer(x[:7])


def test_token_and_span_heads_equal_merged(tmp_path, base_dir, tokenizer):
    ner_adapter, ner_merged = make_adapter(base_dir, tmp_path / "ner", BertForTokenClassification, seed=5,
                                           labels=["O", "B-PER", "I-PER", "B-ORG", "I-ORG"])
    qa_adapter, qa_merged = make_adapter(base_dir, tmp_path / "qa", BertForQuestionAnswering, seed=6)
    for adapter, merged, use, field in ((ner_adapter, ner_merged, "ner", "logits"),
                                        (qa_adapter, qa_merged, "qa", "spans")):
        view = load_engine(base_dir, adapter)
        assert view.use == use
        features = [{"input_ids": e.ids, "token_type_ids": e.type_ids} for e in view.encode(TEXTS)]
        ours = token_logits(view, features, field=field)
        theirs = token_logits(Engine.load(merged, use=use), features, field=field)
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(ours, theirs))


def test_embedding_adapters_mix_with_the_base(tmp_path, base_dir):
    adapter, merged = make_adapter(base_dir, tmp_path / "emb", BertModel, seed=7, use="embed")
    side = json.loads((adapter / "bertkit_adapter.json").read_text())
    assert side["use"] == "embed" and side["base"]["fingerprint"].startswith("sha256:")
    host = AdapterHost(Engine.load(base_dir, use="embed"), base_dir)
    loaded = host.add("emb", adapter)
    encodings = host.engine.encode(TEXTS)
    slots = [loaded.slot if i % 2 else None for i in range(len(TEXTS))]
    rows = mixed_embeddings(host.engine, [e.ids for e in encodings], None, slots, "mean")
    base = embed(Engine.load(base_dir, use="embed"), TEXTS, normalize=False)
    twin = embed(Engine.load(merged, use="embed"), TEXTS, normalize=False)
    for i, row in enumerate(rows):
        assert torch.allclose(row, (twin if i % 2 else base)[i], atol=1e-5)


def test_peft_made_adapter_loads_and_matches_peft(tmp_path, base_dir, tokenizer):
    peft = pytest.importorskip("peft")
    from transformers import BertForSequenceClassification as HFClassifier

    torch.manual_seed(0)
    hf = HFClassifier.from_pretrained(base_dir, num_labels=3)
    # "dense" adapts attention.output, intermediate, output and the pooler: PEFT matches last names
    model = peft.get_peft_model(hf, peft.LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8,
                                                   target_modules=["query", "value", "dense"]))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape) * 0.3)
    model.eval()
    model.save_pretrained(tmp_path / "peft")
    assert not (tmp_path / "peft" / "bertkit_adapter.json").exists()
    view = load_engine(base_dir, tmp_path / "peft")
    ours = sequence_logits(view, TEXTS, None)
    batch = tokenizer(TEXTS, None, max_length=64)
    with torch.no_grad():
        theirs = model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                       attention_mask=batch["attention_mask"]).logits
    assert torch.allclose(ours, theirs, atol=1e-5)


def test_adapters_that_do_not_fit_are_refused(tmp_path, base_dir, tokenizer, classifiers):
    adapter = classifiers[0][0]
    other = save_tiny(BertModel, tokenizer, tmp_path / "other", seed=9)
    both = r"was made for the base .*base\d* \(weights [0-9a-f]{12}\), not .*other \(weights [0-9a-f]{12}\)"
    with pytest.raises(AdapterError, match=both):
        load_engine(other, adapter)
    wider = save_tiny(BertModel, tokenizer, tmp_path / "wider", seed=9, hidden_size=40)
    with pytest.raises(AdapterError, match="hidden_size 36"):
        load_engine(wider, adapter)
    # a peft-made adapter (no side file) is checked by shape
    bare = tmp_path / "bare"
    shutil.copytree(adapter, bare)
    (bare / "bertkit_adapter.json").unlink()
    with pytest.raises(AdapterError, match="sized for a Linear 36"):
        load_engine(wider, bare)
    config = json.loads((bare / "adapter_config.json").read_text())
    (bare / "adapter_config.json").write_text(json.dumps({**config, "r": 8}))
    with pytest.raises(AdapterError, match="rank 4 .* r=8"):
        load_engine(base_dir, bare)
    half = tmp_path / "half"
    shutil.copytree(adapter, half)
    (half / "adapter_config.json").unlink()
    with pytest.raises(AdapterError, match="adapter_config.json is missing"):
        load_engine(base_dir, half)
    torn = tmp_path / "torn"
    shutil.copytree(adapter, torn)
    data = (torn / "adapter_model.safetensors").read_bytes()
    (torn / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(AdapterError, match="truncated or damaged"):
        load_engine(base_dir, torn)


@pytest.mark.parametrize("task", ["embed", "rerank"])
def test_finetune_embed_and_rerank_train_lora_adapters(tmp_path, task):
    """`finetune --task embed|rerank --lora` trains adapters (it used to ignore --lora), saved as
    PEFT files with the side file, and its evaluation runs the adapter over the base."""
    from bertkit.train import retrieval as rt

    from retrieval_fixtures import sentences, tiny_encoder

    base = tiny_encoder(tmp_path / "base")
    texts = sentences(24, seed=11)
    pairs = tmp_path / "p.jsonl"
    pairs.write_text("".join(json.dumps({"query": " ".join(t.split()[:2]), "positive": t}) + "\n"
                             for t in texts), encoding="utf-8")
    out = tmp_path / task
    summary = rt.finetune_retrieval(task=task, model=str(base), train=str(pairs), out_dir=str(out), epochs=1,
                                    batch_size=8, lr=1e-3, progress=False, max_length=24, eval=str(pairs),
                                    lora="r=4,alpha=8,dropout=0,targets=query,value", lora_save="adapters",
                                    negatives=1)
    assert not (out / "model.safetensors").exists()
    side = json.loads((out / "bertkit_adapter.json").read_text())
    assert side["use"] == task and side["max_length"] == 24
    assert summary["eval"]["mrr@10"] > 0
    view = load_engine(base, out)
    assert view.use == task
    if task == "embed":
        assert view.pooling.mode == "mean" and embed(view, ["a cat"]).shape == (1, view.config.hidden_size)
    else:
        assert view.max_length == 24 and len(rerank(view, "a cat", ["the cat runs", "a dog"])) == 2


def test_cli_runs_an_adapter_over_its_base(base_dir, classifiers, capsys):
    from bertkit import cli

    adapter, merged = classifiers[0]
    assert cli.main(["classify", str(base_dir), "--adapter", str(adapter), "--json", *TEXTS[:2]]) == 0
    ours = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert cli.main(["classify", str(merged), "--json", *TEXTS[:2]]) == 0
    theirs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [o["label"] for o in ours] == [t["label"] for t in theirs]
    assert all(abs(o["score"] - t["score"]) < 1e-5 for o, t in zip(ours, theirs))
    assert cli.main(["ner", str(base_dir), "--adapter", str(adapter), "a text"]) == 2
    assert "is a classify adapter; run it with `bertkit classify" in capsys.readouterr().err


def test_front_door_loads_adapters_over_one_base(base_dir, classifiers):
    import bertkit

    models = bertkit.load_adapters(base_dir, {"topics": classifiers[0][0], "sentiment": classifiers[1][0]},
                                   device="cpu")
    assert {m.use for m in models.values()} == {"classify"}
    assert models["topics"].engine.model.bert is models["sentiment"].engine.model.bert  # one base in memory
    for name, (_, merged) in zip(("topics", "sentiment"), classifiers):
        ours = models[name].classify(TEXTS)
        theirs = bertkit.load(merged, device="cpu").classify(TEXTS)
        assert [o["label"] for o in ours] == [t["label"] for t in theirs]
    one = bertkit.load(base_dir, adapter=classifiers[1][0], device="cpu")
    assert one.classify(TEXTS[0])["label"] in ("neg", "pos")


@pytest.mark.parametrize("precision,tolerance", [("bf16", 0.02), ("int8", 0.02)])
def test_bf16_and_int8_bases_keep_close_to_the_merged_twin(base_dir, classifiers, precision, tolerance):
    """The base in bf16 (deltas bf16) or int8 (deltas and head fp32): near the merged twin run in
    the same precision (the logits are ~0.3 here; both measured ~0.004 off fp32); the two round
    differently: the twin rounds W + BA, the adapter W and BA apart."""
    adapter, merged = classifiers[0]
    ours = sequence_logits(load_engine(base_dir, adapter, precision=precision), TEXTS, None)
    theirs = sequence_logits(Engine.load(merged, use="classify", precision=precision), TEXTS, None)
    exact = sequence_logits(Engine.load(merged, use="classify"), TEXTS, None)
    assert (ours - exact).abs().max() < tolerance and (theirs - exact).abs().max() < tolerance


def test_an_adapter_over_an_int8_static_base_is_refused_naming_the_ways_that_work(base_dir, classifiers):
    """Static scales fit the base's activations alone: one line naming int8 and a merged
    calibration; the merged twin itself calibrates and runs near fp32."""
    adapter, merged = classifiers[0]
    with pytest.raises(AdapterError) as err:
        load_engine(base_dir, adapter, precision="int8-static", calibration=TEXTS)
    message = str(err.value)
    assert "\n" not in message and "--precision int8" in message and "--lora-save merged" in message
    exact = sequence_logits(Engine.load(merged, use="classify"), TEXTS, None)
    static = sequence_logits(Engine.load(merged, use="classify", precision="int8-static", calibration=TEXTS),
                             TEXTS, None)
    assert (static - exact).abs().max() < 0.02
