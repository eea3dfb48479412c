"""ELECTRA's replaced-token detection: labels, shared embeddings, a run saved as transformers'
ElectraForPreTraining (+ generator ElectraForMaskedLM) with equal outputs, and an exact resume."""

from __future__ import annotations

import json

import pytest
import torch

from bertkit.encoder.config import BertConfig
from bertkit.train.pretrain import PretrainConfig, pretrain
from bertkit.train.pretrain.rtd import ReplacedTokenDetection, electra_configs, replaced_token_labels

from pretrain_fixtures import make_data, one_thread, train_losses, write_model_config  # noqa: F401


def test_a_sampled_token_equal_to_the_original_counts_as_original() -> None:
    input_ids = torch.tensor([[1, 5, 9, 7, 2], [1, 4, 9, 2, 0]])     # 9 = [MASK]
    mlm_labels = torch.tensor([[-100, -100, 6, 7, -100], [-100, 4, 8, -100, -100]])
    sampled = torch.tensor([6, 3, 4, 11])                           # row-major: right, wrong, right, wrong
    corrupted, labels = replaced_token_labels(input_ids, mlm_labels, sampled)
    assert corrupted.tolist() == [[1, 5, 6, 3, 2], [1, 4, 11, 2, 0]]
    assert labels.tolist() == [[0, 0, 0, 1, 0], [0, 0, 1, 0, 0]]


def test_generator_is_scaled_and_shares_the_embeddings() -> None:
    config = BertConfig.resolve("mini", vocab_size=120)
    discriminator, generator = electra_configs(config, 0.5)
    assert discriminator.model_type == "electra"
    assert discriminator.embedding_dim == discriminator.hidden_size == config.hidden_size  # BERT's shape kept
    assert (generator.hidden_size, generator.num_attention_heads) == (discriminator.hidden_size // 2,
                                                                      discriminator.num_attention_heads // 2)
    model = ReplacedTokenDetection(config, 0.5)
    shared = model.generator.bert.embeddings.word_embeddings.weight
    assert shared is model.discriminator.bert.embeddings.word_embeddings.weight
    with pytest.raises(ValueError, match="--generator-size"):
        electra_configs(BertConfig.resolve("small", vocab_size=120), 0.33)  # 169 wide, 3 heads


@pytest.fixture(scope="module")
def rtd_run(tmp_path_factory, one_thread):  # noqa: F811
    root = tmp_path_factory.mktemp("rtd")
    data = make_data(root, nsp=False, n_docs=120)
    model = write_model_config(root / "config.json", hidden_dropout_prob=0.0,
                               attention_probs_dropout_prob=0.0)
    config = dict(data=str(data), model=str(model), batch_size=8, lr=2e-3, log_every=1, eval_every=4,
                  eval_batches=2, save_every=2, progress=False, objective="rtd", generator_size=0.25)
    summary = pretrain(PretrainConfig(out=str(root / "run"), max_steps=4, **config))
    return root, config, summary


def test_a_run_saves_an_electra_discriminator_and_generator_that_transformers_loads(rtd_run) -> None:
    transformers = pytest.importorskip("transformers")
    root, _, summary = rtd_run
    assert summary["eval"]["rtd_accuracy"] is not None and summary["train"]["rtd_loss"] > 0
    model_dir = root / "run" / "model"
    assert json.loads((model_dir / "config.json").read_text())["architectures"] == ["ElectraForPreTraining"]
    reference, info = transformers.ElectraForPreTraining.from_pretrained(model_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    generator, info = transformers.ElectraForMaskedLM.from_pretrained(model_dir / "generator",
                                                                      output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert torch.equal(generator.electra.embeddings.word_embeddings.weight,
                       reference.electra.embeddings.word_embeddings.weight)

    from bertkit.encoder.heads import BertForReplacedTokenDetection

    ours = BertForReplacedTokenDetection.from_pretrained(model_dir).eval()
    ids = torch.tensor([[2, 17, 40, 33, 3, 0], [2, 9, 11, 3, 0, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        expected = reference.eval()(input_ids=ids, attention_mask=mask).logits
        got = ours(ids, torch.zeros_like(ids), mask).logits
    assert torch.allclose(got[mask == 1], expected[mask == 1], atol=1e-5)


def test_an_interrupted_rtd_run_resumes_to_the_same_losses(rtd_run, tmp_path) -> None:
    root, config, _ = rtd_run
    uninterrupted = train_losses(root / "run")
    pretrain(PretrainConfig(out=str(tmp_path / "run"), max_steps=2, **config))
    # The same run, told it has 4 steps, stopped after 2: resume continues from its checkpoint.
    pretrain(PretrainConfig(out=str(tmp_path / "run2"), max_steps=4, time_limit=1e-9, **config))
    pretrain(PretrainConfig(out=str(tmp_path / "run2"), max_steps=4, resume=True, **config))
    resumed = train_losses(tmp_path / "run2")
    assert set(resumed) == set(uninterrupted)
    for step, loss in uninterrupted.items():
        assert resumed[step] == pytest.approx(loss, abs=1e-6), step


def test_rtd_refuses_init(rtd_run, tmp_path) -> None:
    root, config, _ = rtd_run
    with pytest.raises(ValueError, match="--init"):
        pretrain(PretrainConfig(out=str(tmp_path / "run"), max_steps=1, init=str(root / "run" / "model"),
                                **config))


def test_the_card_of_an_rtd_run_says_what_was_trained(rtd_run) -> None:
    root, _, _ = rtd_run
    card = (root / "run" / "model" / "README.md").read_text(encoding="utf-8")
    assert "replaced-token detection" in card and "AutoModelForPreTraining" in card
    assert "binary cross-entropy" in card and "fill_mask" not in card
