"""Alignment methods on the TopK SAE core, one registry entry each.

Every method yields a :class:`PairModel`: an encoder ``E_i`` and a decoder ``D_i`` per domain
sharing one latent index space, so that translation ``D_j(E_i(x_i))`` and code agreement
``E_i(x_i) ~ E_j(x_j)`` are defined for all of them. Notation: ``x_i`` a batch of domain ``i``
(unpaired rows, drawn from all training rows), ``(x_a^p, x_b^p)`` a batch of anchor pairs,
``||.||^2`` the squared norm summed over features and averaged over rows; inputs have unit mean
squared norm, so every term is on the same scale.

- ``independent``: one SAE per domain, ``L = sum_i ||x_i - D_i E_i x_i||^2`` (no alignment).
- ``sae_a`` (SAE-A): independent SAEs, then latents of domain b are permuted onto those of domain
  a by the Hungarian assignment maximising the summed Pearson correlation of activations over
  the paired training rows.
- ``crosscoder`` (Lindsey et al. 2024): one code from the summed encoders,
  ``z = TopK(sum_i W_enc,i (x_i^p - b_dec,i) + b_enc)``, a decoder per domain,
  ``L = sum_i ||x_i^p - D_i z||^2``; it needs pairs. Standalone codes use one encoder alone.
- ``usae`` (Universal SAE, Thasarathan et al. 2025): each step a random source domain ``i``;
  ``z = E_i(x_i^p)`` must reconstruct every domain, ``L = sum_j ||x_j^p - D_j z||^2``; needs pairs.
  As in the published update (their Fig. 3, ``Optimizers[i].step()``) only model ``i``'s
  parameters (encoder and decoder of domain ``i``) are stepped, each model with its own Adam
  state (``per_model_update``).
- ``cosae`` (the CoSAE paper): per-domain SAEs trained jointly on
  ``w_rec L_rec + w_tr L_tr + w_cont L_cont + w_dtr L_tr^dist + w_dcont L_cont^dist`` with
  ``L_rec = sum_i ||x_i - D_i E_i x_i||^2`` (all rows), ``L_tr = sum_{i != j} ||x_j^p - D_j E_i x_i^p||^2``
  and ``L_cont = ||E_a x_a^p - E_b x_b^p||^2`` (anchor pairs; compared on the union of the two
  supports before the TopK cut, see :func:`support_consistency`), ``L_tr^dist = sum_{i != j}
  SW(D_j E_i x_i, x_j)`` and ``L_cont^dist = SW(E_a x_a, E_b x_b)`` (sliced Wasserstein between
  unpaired batches). The ablation picks the terms: ``translation`` (rec + tr), ``consistency``
  (rec + cont), ``distributional`` (rec + both dist terms, no pairs at all) or ``all``.

All methods add AuxK (``aux_coef`` times the normalised dead-latent residual loss) per SAE.

Data and sample budget (:class:`repdiag.alignment.train.BatchSampler`): every method sees
``batch_size + pair_batch_size`` rows per domain per step and the same number of steps.
CoSAE with a pair term splits them into ``batch_size`` unpaired rows and ``pair_batch_size``
anchor pairs; methods whose training reads no pairs (independent, SAE-A, CoSAE-distributional)
get all of them as unpaired rows; Crosscoder and USAE get all of them as anchor pairs (all the
pairs there are, when fewer). Crosscoder and USAE cannot use unpaired rows: the crosscoder's
code is a function of both domains' inputs of one instance, and every USAE loss term decodes one
instance's code into every domain; so at small paired fractions they see fewer distinct rows,
which is the comparison the paper makes (a few anchors plus unpaired data, against methods that
need pairs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor, nn

from repdiag.alignment.distances import sliced_wasserstein
from repdiag.alignment.grid import ABLATIONS, PAIR_TERMS
from repdiag.alignment.metrics import correlation_matrix
from repdiag.alignment.topk import TopKSAE, topk_relu
from repdiag.core.errors import ConfigError
from repdiag.core.registry import Registry
from repdiag.core.settings import FromConfig

METHODS: Registry[type[Method]] = Registry("alignment method")


@dataclass
class Batch:
    """One training step's data: an unpaired batch per domain, and anchor pairs (or None)."""

    x: tuple[Tensor, Tensor]
    pairs: tuple[Tensor, Tensor] | None = None


@dataclass(frozen=True)
class SAESettings(FromConfig):
    """``alignment.sae`` (the preset applied): each domain's TopK SAE."""

    SECTION = "alignment.sae"

    n_latents: int
    k: int
    aux_k: int
    aux_coef: float
    dead_after: int


def squared_error(prediction: Tensor, target: Tensor) -> Tensor:
    """``mean_n ||prediction_n - target_n||^2``."""
    return (prediction - target).pow(2).sum(-1).mean()


class PairModel(nn.Module):
    """Two domains' SAEs in one latent index space: ``encode(i, x)``, ``decode(j, z)``."""

    def __init__(self, saes: Sequence[TopKSAE]) -> None:
        super().__init__()
        self.saes = nn.ModuleList(saes)

    @property
    def n_latents(self) -> int:
        return self.saes[0].n_latents

    def encode(self, domain: int, x: Tensor) -> Tensor:
        return self.saes[domain].encode(x)

    def decode(self, domain: int, z: Tensor) -> Tensor:
        return self.saes[domain].decode(z)

    def translate(self, source: int, target: int, x: Tensor) -> Tensor:
        """``D_target(E_source(x))``."""
        return self.decode(target, self.encode(source, x))

    def cycle(self, source: int, target: int, x: Tensor) -> Tensor:
        """``x -> target -> source``: ``D_s E_t D_t E_s x``."""
        return self.translate(target, source, self.translate(source, target, x))


class CrosscoderModel(PairModel):
    """Crosscoder: per-domain encoders summed into one code with a shared encoder bias."""

    def __init__(self, saes: Sequence[TopKSAE]) -> None:
        super().__init__(saes)
        self.b_enc = nn.Parameter(torch.zeros(saes[0].n_latents))
        for sae in self.saes:
            sae.b_enc.requires_grad_(False)

    def encode(self, domain: int, x: Tensor) -> Tensor:
        """Standalone code: one domain's encoder, the other domain's input absent (zero)."""
        sae = self.saes[domain]
        return topk_relu(sae.project(x) + self.b_enc, sae.k)

    def joint_pre_activation(self, xs: Sequence[Tensor]) -> Tensor:
        return sum(sae.project(x) for sae, x in zip(self.saes, xs, strict=True)) + self.b_enc

    def encode_joint(self, xs: Sequence[Tensor]) -> Tensor:
        return topk_relu(self.joint_pre_activation(xs), self.saes[0].k)


@dataclass
class Method:
    """Base class: a model builder, the loss terms of one step, and a post-training step."""

    sae: SAESettings
    weights: Mapping[str, float] = field(default_factory=dict)
    sw_projections: int = 64
    name = "method"
    needs_pairs = False  # cannot train at all without pairs
    uses_pairs = False  # reads the anchor pairs (training or post-hoc)
    per_model_update = False  # step only the parameters of ``active_model`` (USAE)
    trains_on_pairs = False  # its loss reads anchor pairs (SAE-A only uses them after training)
    active_model: int | None = None

    def build(self, dims: Sequence[int], generator: torch.Generator) -> PairModel:
        return PairModel([self._sae(d, generator) for d in dims])

    def _sae(self, d_in: int, generator: torch.Generator) -> TopKSAE:
        return TopKSAE(
            d_in,
            self.sae.n_latents,
            self.sae.k,
            dead_after=self.sae.dead_after,
            generator=generator,
        )

    def loss_terms(
        self, model: PairModel, batch: Batch, generator: torch.Generator
    ) -> dict[str, Tensor]:
        raise NotImplementedError

    def weight(self, term: str) -> float:
        return self.sae.aux_coef if term == "auxk" else float(self.weights.get(term, 1.0))

    def finalise(self, model: PairModel, pairs: tuple[Tensor, Tensor] | None) -> dict:
        """Post-training step (SAE-A matching); returns information for the report."""
        return {}

    # shared pieces ----------------------------------------------------------------------------
    def self_reconstruction(
        self, model: PairModel, xs: Sequence[Tensor]
    ) -> tuple[Tensor, Tensor, list[Tensor]]:
        """``sum_i ||x_i - D_i E_i x_i||^2``, the AuxK sum, and the codes (dead tracking updated)."""
        rec, aux, codes = xs[0].new_zeros(()), xs[0].new_zeros(()), []
        for sae, x in zip(model.saes, xs, strict=True):
            pre = sae.pre_activation(x)
            z = topk_relu(pre, sae.k)
            x_hat = sae.decode(z)
            sae.track(z)
            rec = rec + squared_error(x_hat, x)
            aux = aux + sae.auxk_loss(pre, x - x_hat, self.sae.aux_k)
            codes.append(z)
        return rec, aux, codes


@METHODS.register("independent")
@dataclass
class Independent(Method):
    name = "independent"

    def loss_terms(
        self, model: PairModel, batch: Batch, generator: torch.Generator
    ) -> dict[str, Tensor]:
        rec, aux, _ = self.self_reconstruction(model, batch.x)
        return {"reconstruction": rec, "auxk": aux}


def hungarian_match(codes_a: np.ndarray, codes_b: np.ndarray) -> tuple[np.ndarray, float]:
    """Order of b's latents maximising ``sum_l corr(a_l, b_order[l])``, and the mean matched corr."""
    corr = correlation_matrix(codes_a, codes_b)
    rows, cols = linear_sum_assignment(corr, maximize=True)
    order = np.empty(corr.shape[0], dtype=np.int64)
    order[rows] = cols
    return order, float(corr[rows, cols].mean())


@METHODS.register("sae_a")
@dataclass
class SAEAligned(Independent):
    name = "sae_a"
    uses_pairs = True

    @torch.no_grad()
    def finalise(self, model: PairModel, pairs: tuple[Tensor, Tensor] | None) -> dict:
        if pairs is None or len(pairs[0]) == 0:
            return {"matched_correlation": None}
        codes = [model.encode(i, x).cpu().numpy() for i, x in enumerate(pairs)]
        order, matched = hungarian_match(codes[0], codes[1])
        model.saes[1].permute_latents(order)
        return {"matched_correlation": matched, "n_match_pairs": len(pairs[0])}


@METHODS.register("crosscoder")
@dataclass
class Crosscoder(Method):
    name = "crosscoder"
    needs_pairs = True
    uses_pairs = True
    trains_on_pairs = True

    def build(self, dims: Sequence[int], generator: torch.Generator) -> PairModel:
        return CrosscoderModel([self._sae(d, generator) for d in dims])

    def loss_terms(
        self, model: PairModel, batch: Batch, generator: torch.Generator
    ) -> dict[str, Tensor]:
        assert isinstance(model, CrosscoderModel) and batch.pairs is not None
        pre = model.joint_pre_activation(batch.pairs)
        z = topk_relu(pre, self.sae.k)
        rec, aux = pre.new_zeros(()), pre.new_zeros(())
        for sae, x in zip(model.saes, batch.pairs, strict=True):
            sae.track(z)
            x_hat = sae.decode(z)
            rec = rec + squared_error(x_hat, x)
            aux = aux + sae.auxk_loss(pre, x - x_hat, self.sae.aux_k)
        return {"reconstruction": rec, "auxk": aux}


@METHODS.register("usae")
@dataclass
class UniversalSAE(Method):
    name = "usae"
    needs_pairs = True
    uses_pairs = True
    trains_on_pairs = True
    per_model_update = True

    def loss_terms(
        self, model: PairModel, batch: Batch, generator: torch.Generator
    ) -> dict[str, Tensor]:
        assert batch.pairs is not None
        source = int(torch.randint(len(model.saes), (1,), generator=generator))
        self.active_model = source
        sae = model.saes[source]
        pre = sae.pre_activation(batch.pairs[source])
        z = topk_relu(pre, sae.k)
        sae.track(z)
        rec = sum(squared_error(model.decode(j, z), x) for j, x in enumerate(batch.pairs))
        residual = batch.pairs[source] - sae.decode(z)
        return {"reconstruction": rec, "auxk": sae.auxk_loss(pre, residual, self.sae.aux_k)}


def support_consistency(
    model: PairModel, pairs: Sequence[Tensor], codes: Sequence[Tensor]
) -> Tensor:
    """``mean_n ||(ReLU(pre_a) - ReLU(pre_b)) * 1[S_a ∪ S_b]||^2``: code disagreement of a pair.

    On the union of the two supports the codes are compared before the TopK cut, so that a
    latent active in one domain only also receives a gradient in the other (after the cut its
    code is 0 there and the gradient would vanish); on the intersection this is exactly
    ``||c_a - c_b||^2``.
    """
    support = ((codes[0] > 0) | (codes[1] > 0)).to(codes[0].dtype)
    dense = [
        sae.pre_activation(x).relu() * support for sae, x in zip(model.saes, pairs, strict=True)
    ]
    return squared_error(dense[0], dense[1])


@METHODS.register("cosae")
@dataclass
class CoSAE(Method):
    name = "cosae"
    ablation: str = "all"

    def __post_init__(self) -> None:
        if self.ablation not in ABLATIONS:
            raise ConfigError(
                f"unknown CoSAE ablation {self.ablation!r}; choose one of {', '.join(ABLATIONS)}"
            )
        self.terms = ABLATIONS[self.ablation]
        self.uses_pairs = any(term in PAIR_TERMS for term in self.terms)
        self.trains_on_pairs = self.uses_pairs
        self.needs_pairs = self.uses_pairs and "reconstruction" not in self.terms

    def weight(self, term: str) -> float:
        if term != "auxk" and term not in self.terms:
            return 0.0
        return super().weight(term)

    def loss_terms(
        self, model: PairModel, batch: Batch, generator: torch.Generator
    ) -> dict[str, Tensor]:
        rec, aux, codes = self.self_reconstruction(model, batch.x)
        terms = {"reconstruction": rec, "auxk": aux}
        if batch.pairs is not None and self.uses_pairs:
            pair_codes = [model.encode(i, x) for i, x in enumerate(batch.pairs)]
            if "translation" in self.terms:
                terms["translation"] = sum(
                    squared_error(model.decode(j, pair_codes[i]), batch.pairs[j])
                    for i in range(2)
                    for j in range(2)
                    if i != j
                )
            if "consistency" in self.terms:
                terms["consistency"] = support_consistency(model, batch.pairs, pair_codes)
        if "dist_translation" in self.terms:
            terms["dist_translation"] = sum(
                sliced_wasserstein(
                    model.decode(j, codes[i]), batch.x[j], self.sw_projections, generator
                )
                for i in range(2)
                for j in range(2)
                if i != j
            )
        if "dist_consistency" in self.terms:
            terms["dist_consistency"] = sliced_wasserstein(
                codes[0], codes[1], self.sw_projections, generator
            )
        return terms


def make_method(
    name: str,
    sae: SAESettings,
    *,
    ablation: str | None = None,
    weights: Mapping[str, float] | None = None,
    sw_projections: int = 64,
) -> Method:
    """Instantiate a registered method; ``ablation`` only applies to CoSAE."""
    cls = METHODS.get(name)
    kwargs = {"sae": sae, "weights": dict(weights or {}), "sw_projections": sw_projections}
    if cls is CoSAE:
        return CoSAE(**kwargs, ablation=ablation or "all")
    if ablation not in (None, "none"):
        raise ConfigError(
            f"method {name!r} has no loss ablations (got {ablation!r}); only cosae does"
        )
    return cls(**kwargs)
