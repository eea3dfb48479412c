"""MaxSim: the segment-reduced batch equals the plain definition, one document at a time."""

import pytest
import torch

from bertkit.inference.multivector import maxsim, maxsim_scores


def _reference(query: torch.Tensor, document: torch.Tensor) -> float:
    return sum(max(float(q @ d) for d in document) for q in query)


def test_maxsim_equals_its_definition_and_the_batch_equals_one_at_a_time() -> None:
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(5, 7, generator=generator)
    documents = [torch.randn(n, 7, generator=generator) for n in (3, 1, 11, 4)]
    singles = [maxsim(query, document) for document in documents]
    assert singles == pytest.approx([_reference(query, d) for d in documents], abs=1e-5)
    assert maxsim_scores(query, documents).tolist() == pytest.approx(singles, abs=1e-5)
    normalized = maxsim_scores(query, documents, normalize=True).tolist()
    assert normalized == pytest.approx([s / 5 for s in singles], abs=1e-6)
    assert maxsim(query, documents[0], normalize=True) == pytest.approx(singles[0] / 5, abs=1e-6)


def test_maxsim_names_the_shapes_it_refuses() -> None:
    with pytest.raises(ValueError, match=r"\(3, 7\) and \(2, 6\)"):
        maxsim(torch.zeros(3, 7), torch.zeros(2, 6))
    with pytest.raises(ValueError, match="every document"):
        maxsim_scores(torch.zeros(3, 7), [torch.zeros(0, 7)])
    assert maxsim_scores(torch.zeros(3, 7), []).shape == (0,)
