"""ELECTRA's pre-training objective: replaced-token detection (Clark et al., ICLR 2020).

A small generator (an MLM) fills the selected positions with tokens it samples from its own
predictions; the discriminator, the model that is kept, sees the result and says for every token
whether it is the original or a replacement. The discriminator learns from every token of the
input rather than the 15% selected, which is why ELECTRA reaches a given fine-tuning score with
less compute than MLM.

    loss = MLM loss of the generator (selected positions)
           + rtd_weight × binary cross-entropy of the discriminator (every real token)

following the paper (λ = 50) and google-research/electra's `run_pretraining.py`:
- generator and discriminator share the token, position and segment embeddings (and their
  LayerNorm): "we share the embeddings of the generator and discriminator" (§3.2); each projects
  them to its own width where that differs from embedding_size;
- the generator is the discriminator's shape scaled by `generator_size` in width, heads and
  feed-forward (the paper finds 1/4 to 1/2 of the discriminator best, figure 3);
- sampled tokens are drawn from the generator's softmax without gradient (the discriminator's loss
  does not reach the generator: the sampling step is not differentiable, §2);
- a sampled token equal to the original counts as original ("if the generator happens to
  generate the correct token, that token is considered real", §2).
Where it differs on purpose: the positions the generator sees as [MASK] follow the data's masks
(bertkit's 80% [MASK] / 10% random / 10% kept, made when the data were prepared, so a run resumes
exactly), where ELECTRA's code replaces 85% with [MASK] and keeps 15%.

On disk the run's model directory is the discriminator, as transformers' ElectraForPreTraining
(what users fine-tune), with the generator beside it in `generator/` as ElectraForMaskedLM; each
loads in transformers with no missing or unexpected keys.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.constants import IGNORE_INDEX
from bertkit.encoder.checkpoint import load_into, read_state_dict
from bertkit.encoder.config import BertConfig
from bertkit.encoder.heads import BertForReplacedTokenDetection
from bertkit.encoder.model import BertForMaskedLM, PreTrainingOutput, mlm_logits_and_loss
from bertkit.families import family_storing

GENERATOR_DIR = "generator"
# The paper's weight of the discriminator's loss (§3.1: "we use λ = 50").
RTD_WEIGHT = 50.0
# The paper's best generator width against the discriminator's (figure 3: 1/4 to 1/2).
GENERATOR_SIZE = 0.25


def electra_configs(config: BertConfig, generator_size: float = GENERATOR_SIZE
                    ) -> tuple[BertConfig, BertConfig]:
    """(discriminator, generator) configs: `config` as an ELECTRA, and the generator scaled by
    `generator_size` in hidden width, heads and feed-forward width, with the same embeddings."""
    if not 0 < generator_size <= 1:
        raise ValueError(f"generator_size must be in (0, 1], got {generator_size!r}")
    electra = family_storing("ForReplacedTokenDetection").model_type
    # Another family's config becomes an ELECTRA of the same shape, its embedding width included
    # (ELECTRA's family default would otherwise factorise the embeddings to 128).
    discriminator = (config if config.model_type == electra
                     else config.replace(model_type=electra, embedding_size=config.embedding_dim))
    heads = max(1, round(discriminator.num_attention_heads * generator_size))
    hidden = round(discriminator.hidden_size * generator_size)
    if hidden % heads:
        raise ValueError(f"a generator of {generator_size} × hidden_size {discriminator.hidden_size} "
                         f"= {hidden} does not divide into {heads} attention heads; choose another "
                         "--generator-size")
    generator = discriminator.replace(
        hidden_size=hidden, num_attention_heads=heads,
        intermediate_size=max(1, round(discriminator.intermediate_size * generator_size)),
        # The shared embeddings are embedding_size wide: the discriminator's width unless it set one.
        embedding_size=discriminator.embedding_dim)
    return discriminator, generator


def replaced_token_labels(input_ids: torch.Tensor, mlm_labels: torch.Tensor,
                          sampled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The discriminator's input and labels.

    input_ids: (B, T) the generator's input; mlm_labels: (B, T) original ids at the M selected
    positions, -100 elsewhere; sampled: (M,) the generator's tokens there, in row-major order.
    Returns corrupted ids (B, T) (sampled tokens at the selected positions) and labels (B, T)
    float 1 = replaced, 0 = original (a sampled token equal to the original is original).
    """
    selected = mlm_labels != IGNORE_INDEX  # (B, T)
    original = torch.where(selected, mlm_labels, input_ids)  # (B, T) the text before masking
    corrupted = input_ids.clone()
    corrupted[selected] = sampled
    return corrupted, (corrupted != original).float()


class ReplacedTokenDetection(nn.Module):
    """A generator and a discriminator trained together; `forward` takes what
    `BertForPreTraining.forward` takes and returns its output type, with the discriminator's
    loss and accuracy in `rtd_loss` / `rtd_correct` / `rtd_count`."""

    def __init__(self, config: BertConfig, generator_size: float = GENERATOR_SIZE,
                 rtd_weight: float = RTD_WEIGHT):
        super().__init__()
        discriminator_config, generator_config = electra_configs(config, generator_size)
        self.config = discriminator_config
        self.rtd_weight = rtd_weight
        self.discriminator = BertForReplacedTokenDetection(discriminator_config)
        self.generator = BertForMaskedLM(generator_config)
        # One embeddings module in both: word, position and segment tables and their LayerNorm.
        self.generator.bert.embeddings = self.discriminator.bert.embeddings

    @property
    def bert(self):
        """The discriminator's encoder: the model a run keeps."""
        return self.discriminator.bert

    def compile_layers(self) -> None:
        self.discriminator.bert.compile_layers()
        self.generator.bert.compile_layers()

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, mlm_labels: torch.Tensor | None = None,
                nsp_labels: torch.Tensor | None = None) -> PreTrainingOutput:
        """input_ids (B, T) masked by the data; mlm_labels (B, T) original ids at the selected
        positions, -100 elsewhere. nsp_labels are ignored (ELECTRA has no sentence objective).
        Sampling draws from torch's default generator, whose state a checkpoint keeps."""
        if mlm_labels is None:
            raise ValueError("replaced-token detection needs mlm_labels (the selected positions)")
        generator = self.generator
        hidden = generator.bert(input_ids, token_type_ids, attention_mask,
                                sparse_word_grad=True).last_hidden_state  # (B, T, Hg)
        logits, mlm_loss, predictions = mlm_logits_and_loss(
            generator.mlm, generator.bert.embeddings.word_embeddings.weight, hidden, mlm_labels)  # (M, V)
        with torch.no_grad():
            sampled = torch.multinomial(F.softmax(logits.float(), dim=-1), 1).squeeze(-1)  # (M,)
        corrupted, labels = replaced_token_labels(input_ids, mlm_labels, sampled)
        scores = self.discriminator.discriminator_predictions(
            self.discriminator.bert(corrupted, token_type_ids, attention_mask).last_hidden_state)  # (B, T)
        real = (torch.ones_like(labels, dtype=torch.bool) if attention_mask is None
                else attention_mask == 1)  # (B, T)
        rtd_loss = F.binary_cross_entropy_with_logits(scores.float()[real], labels[real])
        rtd_correct = ((scores.detach()[real] > 0).float() == labels[real]).sum()
        return PreTrainingOutput(loss=mlm_loss + self.rtd_weight * rtd_loss, mlm_loss=mlm_loss,
                                 nsp_loss=None, mlm_logits=logits, nsp_logits=None,
                                 mlm_predictions=predictions, rtd_loss=rtd_loss,
                                 rtd_correct=rtd_correct, rtd_count=int(real.sum()))

    def save_pretrained(self, out_dir: str | os.PathLike) -> Path:
        """The discriminator at out_dir (ElectraForPreTraining), the generator in out_dir/generator."""
        out = self.discriminator.save_pretrained(out_dir)
        self.generator.save_pretrained(Path(out_dir) / GENERATOR_DIR)
        return out

    def load_directory(self, model_dir: str | os.PathLike) -> None:
        """Weights from a directory `save_pretrained` wrote (a checkpoint being resumed)."""
        model_dir = Path(model_dir)
        load_into(self.discriminator, read_state_dict(model_dir), str(model_dir))
        load_into(self.generator, read_state_dict(model_dir / GENERATOR_DIR), str(model_dir / GENERATOR_DIR))
