"""The intervention terms of a zoo run (``zoo.objectives.<run>.jer_regulariser``) and what they
did to the weights.

A regularised step adds a push ``d_t`` to the objective's gradient on the backbone's weights,
``g_t = grad L_objective + d_t``, before clipping and AdamW. The ``term`` names the push:

- ``jer``: ``d_t = -w * grad PR2_hat`` (the final tap's estimated Jacobian participation ratio,
  :func:`jer_penalty`): w > 0 raises the Jacobian effective rank, w < 0 lowers it;
- ``global_pr``: ``d_t = -w * grad G.PR`` of the batch's pooled final-tap features
  (:func:`global_pr`, the workflow's G.PR made differentiable): moves global geometry instead;
- ``direction_sham``: per backbone tensor, a fixed seeded random direction ``r``, made
  orthogonal to that tensor's ``grad PR2_hat`` and ``grad L_objective`` (Gram-Schmidt) and scaled
  to ``|w| * ||grad PR2_hat||`` of the tensor: the size the ``jer`` term at weight w would have,
  along a direction that stays (nearly) the same step after step, so it accumulates in AdamW's
  first moment as a constant push does, without aiming at JER or at the objective.

A push of constant sign reaches AdamW's first moment at full size, a random-sign one at about
sqrt((1 - b1) / (1 + b1)) of it (0.23 at b1 = 0.9), so the sham of the earlier design (the
``jer`` term with a random sign each step) moved the weights far less than the raise arm did.
Strength is therefore stated on the optimizer's update: :func:`preconditioned` gives the push's
part of the AdamW step, ``lr_t * c_t * d_t / (sqrt(v_hat_t) + eps)`` (``c_t`` the clip
coefficient, ``v_hat_t`` the bias-corrected second moment after the step: a push held constant
reaches the first moment at its full size, so this is its steady-state share), and the run
accumulates it over the steps into ``P``, the arm's own cumulative push, saved beside the weights
(``push.safetensors``). ``<theta_arm - theta_plain, P> / ||P||`` is how far the arm actually
moved along its push (:func:`repdiag.binding.causal.analysis.displacement`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from repdiag.core.settings import FromConfig
from repdiag.encoders.jer_estimator import estimate_pr2
from repdiag.encoders.zoo.spec import DEFAULT_TERM, REGULARISER_TERMS

PROBE_SEED_OFFSET = 7919  # the probes' own stream: the augmentations stay as without them
DIRECTION_SEED_OFFSET = 104_729  # the sham's direction: a stream apart from probes and ``gen``


@dataclass(frozen=True)
class RegulariserSettings(FromConfig):
    """One run's ``jer_regulariser`` (schema zoo.schema.yaml): ``weight``, ``images`` and
    ``probes`` from the run's section or the schema's defaults. ``term`` and ``start_fraction``
    have no schema default on purpose (a plain run's resolved spec, its jobs' params, stays as it
    was before they existed): the term's is :data:`~repdiag.encoders.zoo.spec.DEFAULT_TERM`, 0
    the start's (every step)."""

    SECTION: ClassVar[str] = "zoo.objectives.*.jer_regulariser"
    weight: float
    images: int
    probes: int
    term: str = DEFAULT_TERM
    start_fraction: float = 0.0

    def __post_init__(self) -> None:
        if self.term not in REGULARISER_TERMS:
            known = ", ".join(REGULARISER_TERMS)
            raise ValueError(f"jer_regulariser.term {self.term!r} is not one of {known}")

    @classmethod
    def of(cls, spec: Mapping[str, Any]) -> RegulariserSettings:
        """The settings of run ``spec`` (an empty or missing section: off)."""
        try:
            return cls.from_config(spec.get("jer_regulariser") or {})
        except ValueError as err:
            run = spec.get("run")
            message = str(err).replace("zoo.objectives.*.", f"zoo.objectives.{run}.")
            raise ValueError(f"zoo run {run!r}: {message}") from None

    def acts(self, step: int, steps: int) -> bool:
        """Whether the term acts at ``step`` of a ``steps``-step schedule."""
        return self.weight != 0.0 and step >= int(self.start_fraction * steps)


def probe_generator(seed: int, step: int) -> torch.Generator:
    """The JER probes of step ``step``: a pure function of (seed, step), apart from ``gen``."""
    return torch.Generator().manual_seed(seed * 1_000_003 + PROBE_SEED_OFFSET + step)


def _eval_pass(objective: Any, batch: Any, n_images: int | None, fn: Any) -> torch.Tensor:
    """``fn(backbone, x)`` on the first ``n_images`` normalised scenes (all: None) with the
    backbone in eval mode, so each image's features are its own (BatchNorm in train mode mixes
    the batch) and the running statistics are left alone."""
    backbone = objective.backbone
    images = batch.images if n_images is None else batch.images[:n_images]
    x = objective.normalize(images)
    training = backbone.training
    backbone.eval()
    try:
        return fn(backbone, x)
    finally:
        backbone.train(training)


def jer_penalty(
    objective: Any, batch: Any, settings: RegulariserSettings, generator: torch.Generator
) -> torch.Tensor:
    """Mean estimated PR_2 = ||J||_F^4 / ||J^T J||_F^2 of the backbone's final tap (pooled
    features) over the first ``settings.images`` scenes of the batch, differentiable in the
    weights (repdiag.encoders.jer_estimator)."""
    return _eval_pass(
        objective,
        batch,
        settings.images,
        lambda backbone, x: estimate_pr2(
            backbone, x, settings.probes, generator, create_graph=True
        ).mean(),
    )


def global_pr(features: torch.Tensor) -> torch.Tensor:
    """G.PR = (sum l)^2 / (D sum l^2) of the covariance eigenvalues l of ``features`` (n, D),
    as repdiag.binding.metrics.geometry.global_participation_ratio, differentiable:
    (tr C)^2 / (D tr C^2) with C = Xc^T Xc / (n - 1), computed as ||Xc||_F^4 / (D ||Xc Xc^T||_F^2)
    (the (n - 1) cancels; the Gram matrix is n x n). 0 for a collapsed set."""
    x = features.flatten(1).double()
    centred = x - x.mean(0, keepdim=True)
    gram = centred @ centred.T
    numerator = gram.diagonal().sum() ** 2
    denominator = x.shape[1] * gram.square().sum()
    return torch.where(denominator > 0, numerator / denominator.clamp_min(1e-300), 0.0)


def global_pr_penalty(objective: Any, batch: Any) -> torch.Tensor:
    """G.PR of the whole batch's pooled final-tap features (eval-mode backbone, unaugmented
    scenes), differentiable in the weights."""
    return _eval_pass(objective, batch, None, lambda backbone, x: global_pr(backbone(x)))


def term_value(
    objective: Any, batch: Any, settings: RegulariserSettings, generator: torch.Generator
) -> torch.Tensor:
    """The scalar whose gradient the push is built from: PR2_hat for ``jer`` and the sham (whose
    push is sized by and orthogonal to it), G.PR for ``global_pr``."""
    if settings.term == "global_pr":
        return global_pr_penalty(objective, batch)
    return jer_penalty(objective, batch, settings, generator)


def sham_direction(params: Sequence[torch.Tensor], seed: int) -> list[torch.Tensor]:
    """One standard-normal tensor per parameter, from the run's own seeded stream (a pure
    function of the seed and the parameters' shapes), on each parameter's device."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + DIRECTION_SEED_OFFSET)
    return [
        torch.randn(p.shape, generator=generator, dtype=torch.float32).to(p.device) for p in params
    ]


def orthogonal_push(
    direction: torch.Tensor, term_grad: torch.Tensor, objective_grad: torch.Tensor, size: float
) -> torch.Tensor:
    """``direction`` with its components along ``term_grad`` and ``objective_grad`` removed
    (Gram-Schmidt in float64), scaled to norm ``size``; zero where nothing is left."""
    r = direction.double().flatten()
    basis: list[torch.Tensor] = []
    for g in (term_grad, objective_grad):
        v = g.double().flatten().clone()
        for b in basis:
            v -= (v @ b) * b
        norm = v.norm()
        if norm > 1e-12 * max(1.0, float(g.double().norm())):
            basis.append(v / norm)
    for b in basis:
        r = r - (r @ b) * b
    norm = r.norm()
    if norm == 0 or size == 0:
        return torch.zeros_like(direction)
    return (r * (size / norm)).view(direction.shape).to(direction.dtype)


def adam_denominator(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> torch.Tensor:
    """sqrt(v_hat) + eps of ``param`` after the optimizer's last step: its second moment
    ``exp_avg_sq`` bias-corrected by 1 - b2^t (torch.optim.AdamW's denominator)."""
    group = next(g for g in optimizer.param_groups if any(p is param for p in g["params"]))
    state = optimizer.state[param]
    _, beta2 = group["betas"]
    step = float(state["step"])
    return (state["exp_avg_sq"] / (1 - beta2**step)).sqrt() + group["eps"]


def adam_update(
    optimizer: torch.optim.Optimizer, param: torch.Tensor, grad: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(u, denominator) of the AdamW step that ``grad`` would cause from the optimizer's current
    state, without taking it: m' = b1 m + (1 - b1) g, v' = b2 v + (1 - b2) g^2, t' = t + 1,
    u = lr * (m' / (1 - b1^t')) / (sqrt(v' / (1 - b2^t')) + eps), so that the step is
    theta <- theta (1 - lr * weight_decay) - u (Loshchilov and Hutter 2019). A parameter without
    state yet starts from m = v = 0, t = 0."""
    group = next(g for g in optimizer.param_groups if any(p is param for p in g["params"]))
    beta1, beta2 = group["betas"]
    state = optimizer.state.get(param) or {}
    g = grad.detach().double()
    m = state["exp_avg"].double() if "exp_avg" in state else torch.zeros_like(g)
    v = state["exp_avg_sq"].double() if "exp_avg_sq" in state else torch.zeros_like(g)
    t = float(state["step"]) + 1 if "step" in state else 1.0
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g.square()
    denominator = (v / (1 - beta2**t)).sqrt() + group["eps"]
    return group["lr"] * (m / (1 - beta1**t)) / denominator, denominator


def clip_coefficient(grads: Sequence[torch.Tensor | None], max_norm: float) -> float:
    """The factor torch.nn.utils.clip_grad_norm_ multiplies every gradient by:
    min(1, max_norm / (||g|| + 1e-6)); 1 when clipping is off (max_norm <= 0)."""
    if max_norm <= 0:
        return 1.0
    squares = [g.detach().double().square().sum() for g in grads if g is not None]
    total = float(torch.stack(squares).sum().sqrt()) if squares else 0.0
    return min(1.0, max_norm / (total + 1e-6))


def update_share(
    optimizer: torch.optim.Optimizer,
    params: Sequence[torch.Tensor],
    objective_grads: Sequence[torch.Tensor | None],
    push: Sequence[torch.Tensor | None],
    coefficient: float = 1.0,
) -> float:
    """||q|| / ||u|| over ``params``: the push's part of the AdamW step, q = lr * c * d /
    (sqrt(v_hat) + eps), against the step u that the objective gradient alone, clipped by the
    same coefficient c (:func:`clip_coefficient`), would take from the optimizer's current state
    (:func:`adam_update`, whose v_hat is also q's). The pilot's measure of a push's strength
    (repdiag.encoders.zoo.calibrate)."""
    q2 = u2 = 0.0
    for param, g, d in zip(params, objective_grads, push, strict=True):
        g = torch.zeros_like(param) if g is None else g
        u, denominator = adam_update(optimizer, param, coefficient * g)
        u2 += float(u.square().sum())
        if d is not None:
            q = _lr_of(optimizer, param) * coefficient * d.double() / denominator
            q2 += float(q.square().sum())
    return math.sqrt(q2) / math.sqrt(u2) if u2 > 0 else math.nan


def _lr_of(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> float:
    return next(g["lr"] for g in optimizer.param_groups if any(p is param for p in g["params"]))


class Regulariser:
    """The term of one run while it trains: builds each step's push (:func:`push`) and
    accumulates its preconditioned part of the AdamW step (:meth:`accumulate`) into the
    cumulative push ``P`` (``cumulative``, per backbone parameter name), with the realised share
    of the push in the step's size per step (``shares``)."""

    def __init__(self, spec: Mapping[str, Any], backbone: nn.Module) -> None:
        self.settings = RegulariserSettings.of(spec)
        self.seed = int(spec["seed"])
        self.steps = int(spec["steps"])
        named = [(n, p) for n, p in backbone.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.direction = (
            sham_direction(self.params, self.seed)
            if self.settings.term == "direction_sham"
            else None
        )
        self.cumulative = [torch.zeros_like(p, dtype=torch.float64) for p in self.params]
        self.shares: list[float] = []
        self.steps_acted = 0

    def acts(self, step: int) -> bool:
        return self.settings.acts(step, self.steps)

    def push(
        self,
        term_grads: Sequence[torch.Tensor | None],
        objective_grads: Sequence[torch.Tensor | None],
    ) -> list[torch.Tensor]:
        """Per backbone parameter, d_t (module docstring) from the term's and the objective's
        gradients on it (None: no path, a zero gradient)."""
        weight = self.settings.weight
        out = []
        for k, param in enumerate(self.params):
            term = term_grads[k] if term_grads[k] is not None else torch.zeros_like(param)
            if self.direction is None:
                out.append(-weight * term)
                continue
            objective = objective_grads[k]
            objective = torch.zeros_like(param) if objective is None else objective
            size = abs(weight) * float(term.double().norm())
            out.append(orthogonal_push(self.direction[k], term, objective, size))
        return out

    def accumulate(
        self,
        optimizer: torch.optim.Optimizer,
        push: Sequence[torch.Tensor],
        coefficient: float,
        before: Sequence[torch.Tensor],
    ) -> None:
        """After the step: P -= lr * c * d / (sqrt(v_hat) + eps) (the displacement the push
        causes at steady state, so it points where the push moved the weights), and the share
        ||that|| / ||theta_after - theta_before|| of the step actually taken (weight decay
        included in the step)."""
        q2 = step2 = 0.0
        for k, param in enumerate(self.params):
            q = (
                _lr_of(optimizer, param)
                * coefficient
                * push[k].double()
                / adam_denominator(optimizer, param).double()
            )
            self.cumulative[k] -= q
            q2 += float(q.square().sum())
            step2 += float((param.detach().double() - before[k].double()).square().sum())
        self.shares.append(math.sqrt(q2 / step2) if step2 > 0 else math.nan)
        self.steps_acted += 1

    def cumulative_push(self) -> dict[str, torch.Tensor]:
        """P per backbone parameter name (float32 CPU copies, as saved)."""
        return {
            name: value.float().cpu().contiguous()
            for name, value in zip(self.names, self.cumulative, strict=True)
        }

    def record(self) -> dict[str, Any]:
        """meta.json's summary of what the term did: steps acted, ||P||, and the realised share
        of the push in the step (median, 10th and 90th percentiles over the steps)."""
        norm = math.sqrt(sum(float(c.square().sum()) for c in self.cumulative))
        shares = torch.tensor([s for s in self.shares if math.isfinite(s)], dtype=torch.float64)
        quantile = (
            (lambda q: float(torch.quantile(shares, q))) if len(shares) else (lambda q: math.nan)
        )
        return {
            "steps_acted": self.steps_acted,
            "push_norm": norm,
            "update_share_median": quantile(0.5),
            "update_share_p10": quantile(0.1),
            "update_share_p90": quantile(0.9),
        }
