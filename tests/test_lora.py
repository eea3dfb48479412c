"""LoRA fine-tuning: adapters on the fused qkv slices, merged and PEFT-format saves, resume.

The merged checkpoint computes what the adapted model does (≤ 1e-5); adapters saved by bertkit
load in `peft` onto transformers' BertForSequenceClassification with the same logits (≤ 1e-5);
only the adapters and the head change in training; a run stopped mid-way and resumed repeats the
uninterrupted run's per-step losses.
"""

from __future__ import annotations

import json

import pytest
import torch

from bertkit.data.tokenizer import BertTokenizer
from bertkit.encoder.config import BertConfig
from bertkit.encoder.heads import BertForSequenceClassification
from bertkit.encoder.model import BertForPreTraining
from bertkit.encoder.packing import Packed
from bertkit.train import finetune as ft
from bertkit.train import lora
from bertkit.train import state as train_state

from finetune_fixtures import sentiment_file
from pretrain_fixtures import one_thread  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")

ALL_TARGETS = ("query", "key", "value", "attention.output", "intermediate", "output")
FAST = dict(lr=5e-3, batch_size=16, max_length=16, progress=False, warmup_ratio=0.0, seed=0,
            precision="fp32")


def odd_config(**overrides) -> BertConfig:
    # odd, distinct sizes so a swapped dimension fails loudly
    values = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=37, max_position_embeddings=64, num_labels=3)
    values.update(overrides)
    return BertConfig.from_dict(values)


def randomise_adapters(model, seed: int = 0) -> None:
    """B starts at zero (the adapted model equals the base): give it values so deltas are real."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.2)


def batch(seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 99, (3, 9), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 4:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def test_spec_parsing_and_errors():
    spec = lora.LoraSpec.parse("r=8,alpha=16,dropout=0.05,targets=query,value")
    assert (spec.r, spec.alpha, spec.dropout, spec.targets, spec.scale) == (8, 16.0, 0.05, ("query", "value"), 2.0)
    assert lora.LoraSpec.parse(spec.to_text()) == spec
    assert lora.LoraSpec.parse("targets=query,key,value,attention.output,intermediate,output").targets == ALL_TARGETS
    with pytest.raises(ValueError, match="targets dense unknown; choose among query"):
        lora.LoraSpec.parse("r=4,targets=query,dense")
    with pytest.raises(ValueError, match="r must be a positive integer"):
        lora.LoraSpec.parse("r=0")
    with pytest.raises(ValueError, match="unknown key 'rank'"):
        lora.LoraSpec.parse("rank=4")
    with pytest.raises(ValueError, match="lora and freeze_encoder exclude each other"):
        ft.FinetuneConfig(task="classify", model="tiny", train="x", out_dir="o", lora="r=4",
                          freeze_encoder=True)


def test_merged_equals_adapted_and_only_adapters_and_head_train():
    torch.manual_seed(0)
    model = BertForSequenceClassification(odd_config()).eval()
    base = {k: v.clone() for k, v in model.state_dict().items()}
    report = lora.apply_lora(model, lora.LoraSpec(r=4, alpha=8, dropout=0.1, targets=ALL_TARGETS))
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    assert all(".lora_" in n or n.startswith("classifier.") for n in trainable)
    assert "classifier.weight" in trainable and report.modules_to_save == ["classifier"]
    # per layer: q, k, v (32 × 4 + 4 × 32 each), attn_out (32, 32), ffn_in (32 → 37), ffn_out (37 → 32)
    per_layer = 3 * (4 * 32 + 32 * 4) + (4 * 32 + 32 * 4) + (4 * 32 + 37 * 4) + (4 * 37 + 32 * 4)
    assert report.adapter_parameters == 2 * per_layer
    assert report.trainable == report.adapter_parameters + 32 * 3 + 3

    b = batch()
    with torch.no_grad():
        before = model(**b).logits
    reference = BertForSequenceClassification(odd_config()).eval()
    reference.load_state_dict(base)
    with torch.no_grad():
        assert torch.allclose(before, reference(**b).logits, atol=1e-6)  # B = 0: the base model's function
    randomise_adapters(model)
    with torch.no_grad():
        adapted = model(**b).logits  # (3, 3)
    assert (adapted - before).abs().max() > 1e-3  # the adapters do change the function

    merged = BertForSequenceClassification(odd_config()).eval()
    merged.load_state_dict(lora.plain_state_dict(model, merge=True))
    with torch.no_grad():
        plain = merged(**b).logits
        # and through the inference engine's packed path
        lengths = b["attention_mask"].sum(1).tolist()
        ids = torch.cat([row[:n] for row, n in zip(b["input_ids"], lengths)])
        packed = Packed.from_lengths(lengths)
        packed_adapted = model.forward_packed(ids, torch.zeros_like(ids), packed).logits
    assert torch.allclose(plain, adapted, atol=1e-5)
    assert torch.allclose(packed_adapted, adapted, atol=1e-5)
    # merging touches only the adapted weights; everything else is the base model's
    state = lora.plain_state_dict(model, merge=True)
    assert torch.equal(state["bert.layers.0.attn_norm.weight"], base["bert.layers.0.attn_norm.weight"])
    assert not torch.equal(state["bert.layers.0.qkv.weight"], base["bert.layers.0.qkv.weight"])


def test_trainable_share_of_a_base_model_is_under_one_percent(capsys):
    model = BertForSequenceClassification(BertConfig.preset("base", vocab_size=30522, num_labels=3))
    report = lora.apply_lora(model, lora.LoraSpec.parse("r=8,alpha=16,dropout=0.05,targets=query,value"))
    with capsys.disabled():
        print("\n" + report.summary())
    # 12 layers × 2 targets × (8 × 768 + 768 × 8) adapters + the (768 → 3) classifier
    assert report.adapter_parameters == 12 * 2 * 2 * 8 * 768
    assert report.trainable == report.adapter_parameters + 768 * 3 + 3
    assert report.share < 0.01


@pytest.mark.parametrize("targets", [("query", "value"), ALL_TARGETS])
def test_adapters_load_in_peft_with_the_same_logits(tmp_path, targets):
    peft = pytest.importorskip("peft", reason="peft is not installed (pip install peft; in the test extra)")
    import transformers

    torch.manual_seed(0)
    base_dir = tmp_path / "base"
    BertForSequenceClassification(odd_config()).save_pretrained(base_dir)
    model = BertForSequenceClassification.from_pretrained(base_dir)
    lora.apply_lora(model, lora.LoraSpec(r=4, alpha=12, dropout=0.05, targets=targets))
    randomise_adapters(model)
    with torch.no_grad():  # the head trains too: its saved copy must be the one PEFT uses
        model.classifier.weight.add_(0.5)
    adapter_dir = lora.save_adapters(model, tmp_path / "adapter", base_model=str(base_dir))
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["task_type"] == "SEQ_CLS" and config["r"] == 4
    assert config["modules_to_save"] == ["classifier"] and config["base_model_name_or_path"] == str(base_dir)

    hf = transformers.BertForSequenceClassification.from_pretrained(base_dir, attn_implementation="eager")
    theirs_model = peft.PeftModel.from_pretrained(hf, adapter_dir).eval()
    b = batch()
    model.eval()
    with torch.no_grad():
        ours = model(**b).logits
        theirs = theirs_model(**b).logits
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()

    # and our own reader gets the same model back
    again = BertForSequenceClassification.from_pretrained(base_dir)
    lora.apply_lora(again, lora.LoraSpec(r=4, alpha=12, dropout=0.05, targets=targets))
    lora.load_adapters(again, adapter_dir)
    with torch.no_grad():
        assert torch.allclose(again.eval()(**b).logits, ours, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Through `finetune`
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def inputs(tmp_path_factory, minilm_dir):
    root = tmp_path_factory.mktemp("lora")
    base = root / "base"
    torch.manual_seed(0)
    BertForPreTraining(BertConfig.preset("tiny", vocab_size=30522)).save_pretrained(base)
    BertTokenizer.from_pretrained(minilm_dir).save_pretrained(base)
    return base, sentiment_file(root / "train.jsonl", 96, 1), sentiment_file(root / "dev.jsonl", 32, 2)


def steps_of(out):
    return [json.loads(line)["loss"] for line in (out / ft.STEPS_FILE).read_text().splitlines()]


def test_finetune_with_lora_merged_trains_adapters_only(tmp_path, inputs):
    from safetensors.torch import load_file

    base, train, dev = inputs
    out = tmp_path / "merged"
    result = ft.finetune("classify", base, train, out, eval_file=dev, epochs=3,
                         lora="r=4,alpha=8,dropout=0.0,targets=query,value", **FAST)
    losses = steps_of(out)
    assert sum(losses[-6:]) / 6 < sum(losses[:6]) / 6  # it learns
    assert result["data"]["lora"]["adapter_parameters"] == 2 * 2 * (4 * 128 + 128 * 4)
    before, after = load_file(str(base / "model.safetensors")), load_file(str(out / "model.safetensors"))
    stem = "bert.encoder.layer.0."
    assert torch.equal(before[stem + "attention.self.key.weight"], after[stem + "attention.self.key.weight"])
    assert torch.equal(before[stem + "output.dense.weight"], after[stem + "output.dense.weight"])
    assert not torch.equal(before[stem + "attention.self.query.weight"], after[stem + "attention.self.query.weight"])
    assert not any("lora" in k for k in after)  # a plain checkpoint
    plain = BertForSequenceClassification.from_pretrained(out)
    assert plain.load_report.missing == [] and plain.load_report.unexpected == []


def test_finetune_with_lora_adapters_resumes_exactly(tmp_path, inputs, monkeypatch):
    base, train, dev = inputs
    settings = dict(eval_file=dev, test=str(dev), epochs=2, save_every=4,
                    lora="r=4,alpha=8,dropout=0.1,targets=query,value,output", lora_save="adapters", **FAST)
    whole = tmp_path / "whole"
    done = ft.finetune("classify", base, train, whole, **settings)
    assert (whole / "adapter_config.json").is_file() and (whole / "adapter_model.safetensors").is_file()
    assert done["test"]["accuracy"] == done["eval"]["accuracy"]  # test = dev here: same model reloaded

    real = train_state.save_checkpoint
    calls = []

    def stop_after_second(*args, **kwargs):
        real(*args, **kwargs)
        calls.append(args[1])
        if len(calls) == 2:
            raise RuntimeError("stopped on purpose")

    cut = tmp_path / "cut"
    monkeypatch.setattr(train_state, "save_checkpoint", stop_after_second)
    with pytest.raises(RuntimeError, match="on purpose"):
        ft.finetune("classify", base, train, cut, **settings)
    monkeypatch.setattr(train_state, "save_checkpoint", real)
    assert calls == [4, 6]  # a mid-epoch state, then the end of epoch 1 (6 steps)
    resumed = ft.finetune("classify", base, train, cut, resume=True, **settings)
    assert steps_of(cut) == steps_of(whole)
    assert resumed["eval"] == done["eval"]
