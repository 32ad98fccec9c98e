"""Hand-made pair models and data with known answers, shared by the alignment metric tests."""

from __future__ import annotations

import numpy as np
import torch

from repdiag.alignment.metrics import EvaluationSettings

# evaluate_alignment's keywords at the schema's alignment.evaluation, seed 0
AT_SCHEMA_DEFAULTS = {"settings": EvaluationSettings.from_config({}), "seed": 0}


class KnownModel:
    """A hand-made pair model: codes are the true concepts, decoders the true linear maps."""

    def __init__(self, maps, permutation=None):
        self.maps = [torch.as_tensor(m, dtype=torch.float32) for m in maps]
        self.permutation = permutation

    def encode(self, i, x):
        z = x @ torch.linalg.pinv(self.maps[i]).T
        z = torch.where(z.abs() < 1e-4, 0.0, z)  # float round-off is not an active latent
        if i == 1 and self.permutation is not None:
            z = z[:, self.permutation]
        return z

    def decode(self, j, z):
        if j == 1 and self.permutation is not None:
            return z @ self.maps[j][:, self.permutation].T
        return z @ self.maps[j].T

    def cycle(self, i, j, x):
        return self.decode(i, self.encode(j, self.decode(j, self.encode(i, x))))


def perfect_pair(seed=0, n_specific=0):
    """The true dictionaries as two TopK SAEs (encoder = pinv(W), k = k_active), linear, noiseless."""
    from repdiag.alignment.concepts import SyntheticConcepts, synthetic_pairs
    from repdiag.alignment.methods import PairModel
    from repdiag.alignment.topk import TopKSAE

    space = SyntheticConcepts.from_config(
        dict(
            n_concepts=12,
            k_active=3,
            dims=(64, 80),
            maps=("linear", "linear"),
            nonlinearity=0.0,
            noise=0.0,
            n_train=512,
            n_test=600,
            n_specific=n_specific,
        )
    )
    data = synthetic_pairs(space, paired_fraction=1.0, seed=seed)
    saes = []
    for domain_map in data.truth.maps:
        w = torch.as_tensor(domain_map.dictionary)
        sae = TopKSAE(w.shape[0], w.shape[1], 3, dead_after=4096)
        with torch.no_grad():
            sae.decoder.copy_(w)
            sae.encoder.copy_(torch.linalg.pinv(w))
            sae.b_dec.zero_()
            sae.b_enc.zero_()
        saes.append(sae)
    return PairModel(saes).eval(), data


def synthetic_probe_truth(data, seed=0, shuffle=False):
    """The synthetic concepts as known binary attributes, as the real-embedding path sees them:
    fitted on the training rows (each domain's own concepts), scored on the held-out ones."""
    from repdiag.alignment.real_pairs import probe_truth

    fit_y = [z > 0 for z in data.train_concepts]
    if shuffle:  # rows shuffled: no attribute is carried by its rows' inputs
        fit_y = [np.random.default_rng(0).permutation(y) for y in fit_y]
    names = [f"c{c}" for c in range(data.test_concepts.shape[1])]
    return probe_truth(data.train, fit_y, data.test, data.test_concepts > 0, names, seed=seed)
