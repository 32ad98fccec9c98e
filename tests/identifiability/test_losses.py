"""InfoNCE and support-corrected InfoNCE against hand computations and cross-entropy."""

from __future__ import annotations

import math

import pytest
import torch

from repdiag.core.errors import ConfigError
from repdiag.identifiability.losses import (
    info_nce,
    info_nce_broadcast,
    similarity,
    split_negatives,
    support_corrected_info_nce,
)


def test_hand_computed_info_nce() -> None:
    """One anchor (1, 0), positive (0.6, 0.8), negatives (0, 1) and (-1, 0), tau = 0.5:
    logits 1.2, 0, -2 -> loss = -1.2 + log(e^1.2 + 1 + e^-2)."""
    anchor = torch.tensor([[1.0, 0.0]])
    positive = torch.tensor([[0.6, 0.8]])
    negatives = torch.tensor([[0.0, 1.0], [-1.0, 0.0]])
    expected = -1.2 + math.log(math.exp(1.2) + 1.0 + math.exp(-2.0))
    assert info_nce(anchor, positive, negatives, 0.5).item() == pytest.approx(expected, rel=1e-6)


def test_info_nce_equals_cross_entropy_with_the_positive_as_class_zero() -> None:
    gen = torch.Generator().manual_seed(0)
    a, p, n = (torch.randn(*shape, generator=gen) for shape in [(8, 3), (8, 3), (5, 3)])
    tau = 0.3
    norm = torch.nn.functional.normalize
    logits = (
        torch.cat(
            [
                (norm(a, dim=1) * norm(p, dim=1)).sum(1, keepdim=True),
                norm(a, dim=1) @ norm(n, dim=1).T,
            ],
            1,
        )
        / tau
    )
    expected = torch.nn.functional.cross_entropy(logits, torch.zeros(8, dtype=torch.long))
    torch.testing.assert_close(info_nce(a, p, n, tau, "cosine"), expected)
    dot_logits = torch.cat([(a * p).sum(1, keepdim=True), a @ n.T], 1) / tau
    expected_dot = torch.nn.functional.cross_entropy(dot_logits, torch.zeros(8, dtype=torch.long))
    torch.testing.assert_close(info_nce(a, p, n, tau, "dot"), expected_dot)


def test_cosine_and_dot_agree_on_unit_vectors_only() -> None:
    a = torch.tensor([[3.0, 4.0]])
    b = torch.tensor([[4.0, 3.0]])
    assert similarity(a, b, "cosine").item() == pytest.approx(24 / 25)
    assert similarity(a, b, "dot").item() == pytest.approx(24.0)
    assert similarity(a / 5, b / 5, "dot").item() == pytest.approx(24 / 25)
    with pytest.raises(ConfigError, match="similarity"):
        similarity(a, b, "euclid")


def test_shared_and_per_anchor_negatives_agree() -> None:
    gen = torch.Generator().manual_seed(1)
    a, p, n = (
        torch.randn(4, 3, generator=gen),
        torch.randn(4, 3, generator=gen),
        torch.randn(6, 3, generator=gen),
    )
    torch.testing.assert_close(info_nce(a, p, n, 0.2), info_nce(a, p, n.expand(4, 6, 3), 0.2))


def test_equal_logits_give_log_of_the_candidate_count() -> None:
    """All similarities zero: loss = log(1 + M)."""
    anchor = torch.tensor([[1.0, 0.0, 0.0]])
    others = torch.tensor([[0.0, 1.0, 0.0]])
    negatives = torch.tensor([[0.0, 0.0, 1.0]] * 7)
    assert info_nce(anchor, others, negatives, 0.1).item() == pytest.approx(math.log(8))


def test_support_corrected_reduces_to_info_nce_at_both_ends() -> None:
    gen = torch.Generator().manual_seed(2)
    a, p = torch.randn(5, 3, generator=gen), torch.randn(5, 3, generator=gen)
    constrained, uniform = torch.randn(5, 4, 3, generator=gen), torch.randn(4, 3, generator=gen)
    no_constrained = support_corrected_info_nce(a, p, constrained[:, :0], uniform, 0.5)
    torch.testing.assert_close(no_constrained, info_nce(a, p, uniform, 0.5))
    only_constrained = support_corrected_info_nce(a, p, constrained, uniform[:0], 0.5)
    torch.testing.assert_close(only_constrained, info_nce(a, p, constrained, 0.5))


def test_support_corrected_hand_case() -> None:
    """Anchor e1, positive e1: logits 2 (positive), constrained e2 -> 0, uniform -e1 -> -2 (tau 0.5)."""
    e1, e2 = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])
    loss = support_corrected_info_nce(e1, e1, e2[:, None, :], -e1, 0.5)
    assert loss.item() == pytest.approx(-2 + math.log(math.exp(2) + 1 + math.exp(-2)), rel=1e-6)


@pytest.mark.parametrize(
    ("ratio", "expected"), [(0.0, (0, 8)), (0.25, (2, 6)), (0.5, (4, 4)), (1.0, (8, 0))]
)
def test_split_negatives(ratio: float, expected: tuple[int, int]) -> None:
    assert split_negatives(8, ratio) == expected


def test_invalid_ratio_and_temperature_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"\[0, 1\]"):
        split_negatives(8, 1.5)
    x = torch.ones(1, 2)
    with pytest.raises(ConfigError, match="temperature"):
        info_nce(x, x, x, 0.0)


def _random(seed: int, *shapes: tuple[int, ...]) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=gen, dtype=torch.float64) for shape in shapes]


@pytest.mark.parametrize("kind", ["cosine", "dot"])
def test_matmul_info_nce_equals_the_broadcast_form(kind: str) -> None:
    a, p, shared, per_anchor = _random(3, (64, 3), (64, 3), (50, 3), (64, 7, 3))
    for negatives in (shared, per_anchor):
        a_, p_ = a.clone().requires_grad_(), p.clone().requires_grad_()
        matmul = info_nce(a_, p_, negatives, 0.3, kind)
        matmul.backward()
        a_ref, p_ref = a.clone().requires_grad_(), p.clone().requires_grad_()
        broadcast = info_nce_broadcast(a_ref, p_ref, negatives, 0.3, kind)
        broadcast.backward()
        assert abs(matmul.item() - broadcast.item()) < 1e-6
        torch.testing.assert_close(a_.grad, a_ref.grad, atol=1e-6, rtol=0)
        torch.testing.assert_close(p_.grad, p_ref.grad, atol=1e-6, rtol=0)
    # float32, as in training: still within 1e-6 of the broadcast form at n = M = 512
    a32, p32, n32 = (t.float() for t in _random(4, (512, 3), (512, 3), (512, 3)))
    assert (
        abs(info_nce(a32, p32, n32, 0.3).item() - info_nce_broadcast(a32, p32, n32, 0.3).item())
        < 1e-6
    )


def test_support_corrected_per_group_equals_the_broadcast_form() -> None:
    """Per-group constrained negatives (G, Mc, d) equal per-anchor ones repeated over the group,
    and the loss equals the broadcast InfoNCE over [constrained, uniform] per anchor."""
    groups, size = 4, 8
    a, p, con, uni = _random(5, (groups * size, 3), (groups * size, 3), (groups, 5, 3), (6, 3))
    per_anchor = con.repeat_interleave(size, dim=0)
    grouped = support_corrected_info_nce(a, p, con, uni, 0.3)
    repeated = support_corrected_info_nce(a, p, per_anchor, uni, 0.3)
    everything = torch.cat([per_anchor, uni.expand(groups * size, 6, 3)], dim=1)
    reference = info_nce_broadcast(a, p, everything, 0.3)
    assert abs(grouped.item() - reference.item()) < 1e-6
    assert abs(repeated.item() - reference.item()) < 1e-6
    only_constrained = support_corrected_info_nce(a, p, con, uni[:0], 0.3)
    assert abs(only_constrained.item() - info_nce_broadcast(a, p, per_anchor, 0.3).item()) < 1e-6


def test_per_group_negatives_must_divide_the_anchors() -> None:
    a, p, con = _random(6, (6, 3), (6, 3), (4, 2, 3))
    with pytest.raises(ValueError, match="groups"):
        info_nce(a, p, con, 0.5)
