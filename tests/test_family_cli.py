"""A RoBERTa, an XLM-RoBERTa, a CamemBERT, an ALBERT, a DistilBERT, an ERNIE, an ELECTRA and an MPNet checkpoint made
by transformers go through info, fill-mask, embed, finetune and predict, with outputs equal to
transformers' on the same files."""

from __future__ import annotations

import json

import pytest
import torch

from bertkit.cli import main
from bertkit.inference import embed, fill_mask

from family_fixtures import PREFIX, make_checkpoint, transformers_mean, transformers_top_masked

transformers = pytest.importorskip("transformers")


FAMILIES = tuple(PREFIX)
MASK = {"roberta": "<mask>", "xlm-roberta": "<mask>", "camembert": "<mask>", "albert": "[MASK]",
        "distilbert": "[MASK]", "ernie": "[MASK]", "electra": "[MASK]", "mpnet": "<mask>"}
TEXTS = ["The cat sat on the mat.", "Paris is the capital of France.", "A dog ran in the park today."]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("family")
    return {f: make_checkpoint(f, root / f) for f in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_info_shows_the_family_table(family, checkpoints, capsys):
    assert main(["info", str(checkpoints[family])]) == 0
    out = capsys.readouterr().out
    assert f"{PREFIX[family]}ForMaskedLM" in out
    assert ("embeddings.segment" in out) == (family not in ("distilbert", "mpnet"))
    if family == "albert":
        assert "embedding projection (14 → 36)" in out and "shared by depths 0-2, counted once" in out
    if family == "mpnet":
        assert "relative position bias (32 × 3, all layers)" in out
        assert out.splitlines()[-1].split() == ["total", "30,052"]  # transformers' num_parameters()


@pytest.mark.parametrize("family", FAMILIES)
def test_fill_mask_equals_transformers(family, checkpoints):
    directory = checkpoints[family]
    text = f"Paris is the {MASK[family]} of France."
    ours = fill_mask(directory, [text], top_k=5)[0][0]
    ids, scores = transformers_top_masked(directory, text)
    assert [c.token_id for c in ours] == ids
    assert max(abs(c.score - p) for c, p in zip(ours, scores)) <= 1e-6


@pytest.mark.parametrize("family", FAMILIES)
def test_embed_equals_transformers_mean_pooling(family, checkpoints):
    directory = checkpoints[family]
    ours = torch.as_tensor(embed(directory, TEXTS, pooling="mean", normalize=False))
    theirs = transformers_mean(directory, TEXTS)
    assert float((ours - theirs).abs().max()) <= 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_finetune_then_predict_match_transformers(family, checkpoints, tmp_path):
    data = tmp_path / "train.csv"
    data.write_text("text,label\n" + "".join(f"{t},{'pos' if i % 2 else 'neg'}\n" for i, t in enumerate(TEXTS * 2)))
    out = tmp_path / "model"
    assert main(["finetune", "--task", "classify", "--model", str(checkpoints[family]), "--train", str(data),
                 "--out", str(out), "--epochs", "1", "--batch-size", "3", "--max-length", "32",
                 "--precision", "fp32", "--no-progress"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [f"{PREFIX[family]}ForSequenceClassification"]
    predictions = tmp_path / "pred.jsonl"
    assert main(["predict", "--model", str(out), "--input", str(data), "--out", str(predictions),
                 "--no-progress"]) == 0
    rows = [json.loads(line) for line in predictions.read_text().splitlines()]
    texts = TEXTS * 2
    assert [r["line"] for r in rows] == list(range(2, len(texts) + 2))  # after the header
    model, info = transformers.AutoModelForSequenceClassification.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    with torch.no_grad():
        batch = tokenizer(texts, padding=True, return_tensors="pt")
        probs = model.eval()(**batch).logits.softmax(-1)
    labels = [model.config.id2label[i] for i in range(probs.shape[1])]
    ours = torch.tensor([[r["scores"][name] for name in labels] for r in rows])
    assert float((ours - probs).abs().max()) <= 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_qa_windows_lay_out_as_the_tokenizers_own_pairs(family, checkpoints):
    """A window holding the whole passage is the family tokenizer's pair encoding, as transformers
    feeds its QA models (RoBERTa: `<s> q </s></s> passage </s>`, one segment)."""
    import transformers

    from bertkit.data.formats.common import WordPieces
    from bertkit.data.formats.qa import QAExample, QASettings, qa_features
    from bertkit.data.tokenizer import BertTokenizer

    question, context = "What is the capital?", "Paris is the capital of France."
    pieces = WordPieces.of(BertTokenizer.from_pretrained(checkpoints[family]))
    [feature] = qa_features([QAExample(id="q", question=question, context=context)], pieces,
                            QASettings(max_seq_length=64), training=False).features
    ref = transformers.AutoTokenizer.from_pretrained(checkpoints[family])(question, context,
                                                                          return_token_type_ids=True)
    assert feature["input_ids"] == ref["input_ids"]
    assert feature["token_type_ids"] == ref["token_type_ids"]


def test_finetune_max_length_counts_roberta_position_offset(checkpoints, tmp_path, capsys):
    """RoBERTa's position table holds padding_idx + 1 extra rows: the token limit is 2 less."""
    directory = checkpoints["roberta"]
    positions = json.loads((directory / "config.json").read_text())["max_position_embeddings"]
    data = tmp_path / "train.csv"
    data.write_text("text,label\n" + "".join(f"{t},{'pos' if i % 2 else 'neg'}\n" for i, t in enumerate(TEXTS * 2)))
    assert main(["finetune", "--task", "classify", "--model", str(directory), "--train", str(data),
                 "--out", str(tmp_path / "m"), "--max-length", str(positions), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"limit of {positions - 2} tokens" in err and f"--max-length {positions - 2}" in err


def test_electra_discriminator_directory_shows_and_embeds(tmp_path, capsys):
    """An ElectraForPreTraining directory (the discriminator) is no MLM: `info` names it, and it is
    served as an encoder whose embeddings equal transformers' ElectraModel's."""
    from bertkit.encoder.tasks import use_of

    directory = make_checkpoint("electra", tmp_path / "disc", kind="ForPreTraining")
    assert main(["info", str(directory)]) == 0
    out = capsys.readouterr().out
    assert "ElectraForPreTraining" in out and "discriminator_predictions head" in out
    assert "embedding projection (14 → 36)" in out
    assert use_of(directory) == "embed"
    ours = torch.as_tensor(embed(directory, TEXTS, pooling="mean", normalize=False))
    assert float((ours - transformers_mean(directory, TEXTS)).abs().max()) <= 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_commands_run_each_head_of_the_family(family, checkpoints, tmp_path, capsys):
    """`bertkit classify`, `ner`, `qa`, `embed` and `fill-mask` on transformers-made heads of the
    family: each answers, and classify's probabilities equal transformers' on the same files (embed's
    vectors are compared with transformers' by `test_embed_equals_transformers_mean_pooling`). The
    library's `qa` and `ner` over the same heads answer too (BERT-style pair windows included:
    RoBERTa ignores their segment ids)."""
    from bertkit.inference import ner, qa

    text = "Paris is the capital of France."
    classifier = make_checkpoint(family, tmp_path / "cls", kind="ForSequenceClassification", num_labels=3,
                                 id2label={0: "neg", 1: "neu", 2: "pos"})
    assert main(["classify", str(classifier), "--json", text]) == 0
    scores = json.loads(capsys.readouterr().out)["scores"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(classifier)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(classifier).eval()
    with torch.no_grad():
        probs = model(**tokenizer([text], return_tensors="pt")).logits.softmax(-1)[0]
    assert max(abs(scores[name] - float(p)) for name, p in zip(("neg", "neu", "pos"), probs)) <= 1e-5
    tagger = make_checkpoint(family, tmp_path / "ner", kind="ForTokenClassification", num_labels=3,
                             id2label={0: "O", 1: "B-LOC", 2: "I-LOC"})
    assert main(["ner", str(tagger), "--json", text]) == 0
    assert "entities" in json.loads(capsys.readouterr().out)
    assert len(ner(tagger, [text])) == 1
    reader = make_checkpoint(family, tmp_path / "qa", kind="ForQuestionAnswering")
    assert main(["qa", str(reader), "--json", "--question", "What is the capital?", "--context", text]) == 0
    assert json.loads(capsys.readouterr().out)["answers"]
    answers = qa(reader, ["What is the capital?"], [text], max_seq_length=64, doc_stride=16, max_question_length=16)
    assert len(answers) == 1 and answers[0] and answers[0][0]["text"]
    assert main(["embed", str(classifier), "--json", *TEXTS]) == 0
    vectors = [json.loads(line)["embedding"] for line in capsys.readouterr().out.splitlines()]
    assert len(vectors) == len(TEXTS)
    assert main(["fill-mask", str(checkpoints[family]), "--json", f"Paris is the {MASK[family]} of France."]) == 0
    assert capsys.readouterr().out.strip()


def test_sentence_transformers_mpnet_directory_embeds_as_sentence_transformers(checkpoints, tmp_path):
    """all-mpnet-base-v2's layout (modules.json: Transformer, mean Pooling, Normalize) made by
    sentence-transformers from a tiny MPNet: bertkit's vectors equal its encode, and the tokenizer
    gives transformers' ids on text in several scripts and on pairs."""
    pytest.importorskip("sentence_transformers")
    from sentence_transformers import SentenceTransformer, models

    from bertkit.data.tokenizer import BertTokenizer

    word = models.Transformer(str(checkpoints["mpnet"]))
    pooling = models.Pooling(word.get_embedding_dimension(), pooling_mode="mean")
    SentenceTransformer(modules=[word, pooling, models.Normalize()], device="cpu").save(str(tmp_path / "st"))
    model = SentenceTransformer(str(tmp_path / "st"), device="cpu")
    texts = [*TEXTS, "北京是中国的首都。", "مرحبا بالعالم، كيف حالك؟", "Ça va très bien 🙂"]
    theirs = torch.as_tensor(model.encode(texts, convert_to_numpy=True))
    assert float((torch.as_tensor(embed(tmp_path / "st", texts)) - theirs).abs().max()) <= 1e-5
    ours = BertTokenizer.from_pretrained(checkpoints["mpnet"])
    reference = transformers.AutoTokenizer.from_pretrained(checkpoints["mpnet"])
    pairs = ["x y", "second one", "z", "the end", "b", "c"]
    assert [e.ids for e in ours.encode_batch(texts)] == reference(texts)["input_ids"]
    assert [e.ids for e in ours.encode_batch(texts, pairs)] == reference(texts, pairs)["input_ids"]
