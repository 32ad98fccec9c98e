"""Model families every layer names: the controls and the families whose training manipulated
what the binding study measures. The zoo (``repdiag.encoders.zoo.spec``) assigns them and the
binding study reads them, so they live below both."""

CONTROL_FAMILY = "control"
"""Family of the controls (``repdiag.binding.controls`` and zoo runs of 0 steps)."""
BINDING_SUPERVISED_FAMILY = "binding_supervised"
"""Family of zoo runs whose training signal states the benchmark's answer (per-slot shape labels,
captions with positions): upper bounds, not members of an objective family."""
BINDING_DOSE_FAMILY = "binding_dose"
"""Family of the binding dose series' runs with lambda > 0: presence-supervised runs told the
slot labels at weight lambda (``zoo.hparams.supervised.slot_weight``). Their binding varies for a
named reason, so they are analysed as a series of their own (repdiag.binding.dose)."""
JER_INTERVENTION_FAMILY = "jer_intervention"
"""Family of zoo runs trained with a regulariser on their Jacobian effective rank
(``zoo.objectives.<run>.jer_regulariser``): the JER was manipulated, so they are compared with
their unregularised runs (repdiag.binding.causal), not pooled with the families."""
APART_FAMILIES = (
    CONTROL_FAMILY,
    BINDING_SUPERVISED_FAMILY,
    BINDING_DOSE_FAMILY,
    JER_INTERVENTION_FAMILY,
)
"""Shown apart from the objective families in tables and figures and kept out of every
correlation and fit across models."""
