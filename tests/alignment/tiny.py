"""Tiny synthetic data, SAE and training settings shared by the alignment training tests."""

DATA = dict(
    n_concepts=8,
    k_active=2,
    dims=[12, 16],
    maps=["linear", "nonlinear"],
    nonlinearity=0.5,
    noise=0.05,
    n_train=65536,
    n_test=1024,
)


SAE = dict(n_latents=16, k=2, aux_k=4, aux_coef=1 / 32, dead_after=2048)


TRAIN = dict(steps=600, batch_size=128, pair_batch_size=64, lr=3e-3, sw_projections=16)


EVALUATION = dict(sw_projections=128, probe_train_fraction=0.5)
