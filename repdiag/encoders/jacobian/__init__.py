"""Jacobian spectra of an encoder's taps: the engine, JER, the restartable chunk cache, the
spectra store and the cost planner (``repdiag plan``).

Modules: :mod:`.engine` (per-layer singular values of J(x), exact or randomized), :mod:`.rewrites`
(ops run in forms ``torch.func`` handles), :mod:`.jer` (effective-rank formulas), :mod:`.cache`
(the restartable chunked driver), :mod:`.store` (``results/jacobians/<model>.zarr``: contract,
writer, reader), :mod:`.options` (the ``jacobians`` config: engine settings and cross-key
checks), :mod:`.pass_size` (the GPU job's products per pass), :mod:`.plan_count`,
:mod:`.plan_costs`, :mod:`.plan_project` and :mod:`.plan_print` (the planner: counting on the
meta device, one model's work and memory, which the pass sizing reads too, the projection of a
config's cost, which builds its encoders, and its printout).

Kept free of imports: :mod:`.options` is read on every parse of the workflow.
"""
