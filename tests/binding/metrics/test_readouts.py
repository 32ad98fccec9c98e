"""Readouts and binding accuracy: loop re-implementations, tie credit, interval, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binomtest

from repdiag.binding.metrics import readouts as ro
from repdiag.common.intervals import wilson_interval
from repdiag.core.errors import RegistryError

# kNN's settings, passed whole: the readouts take no default of their own (the schema holds them)
KNN5 = {"k": 5, "weights": "similarity"}
KNN10 = {"k": 10, "weights": "similarity"}


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _loop_knn_score(q, c, ref, k, weights):
    def smoothed(x):
        x = x / np.linalg.norm(x)
        sims = [_cos(x, r) for r in ref]
        nbrs = sorted(range(len(ref)), key=lambda j: -sims[j])[:k]
        out = x.copy()
        for j in nbrs:
            weight = 1.0 if weights == "binary" else (1 + sims[j]) / 2
            out += weight * ref[j] / np.linalg.norm(ref[j])
        return out

    return _cos(smoothed(q), smoothed(c))


def _latent_classes(seed: int, noise: float, n_q: int = 400, n_c: int = 8, d: int = 32):
    """Each item is its class centre (its 'arrangement', 24 classes) plus Gaussian noise.

    The correct candidate shares the query's class, the distractors have other classes, and the
    reference set is drawn from the same classes: a layout-like encoder that does bind.
    """
    rng = np.random.default_rng(seed)
    n_classes = 24
    centres = rng.normal(size=(n_classes, d))
    query_class = rng.integers(0, n_classes, n_q)
    others = [np.delete(np.arange(n_classes), c) for c in query_class]
    candidate_class = np.stack([rng.choice(o, n_c, replace=False) for o in others])
    correct = rng.integers(0, n_c, n_q)
    candidate_class[np.arange(n_q), correct] = query_class
    reference_class = rng.integers(0, n_classes, 512)

    def draw(classes):
        return centres[classes] + noise * rng.normal(size=(*classes.shape, d))

    return draw(query_class), draw(candidate_class), draw(reference_class), correct


def _loop_local_pca_score(q, c, ref, k, dim):
    """Minus the squared Mahalanobis distance of c - q under the neighbourhood's PPCA covariance,
    built from eigh of the covariance matrix (independent of the SVD in the readout)."""
    unit = lambda v: v / np.linalg.norm(v)  # noqa: E731
    q, c = unit(q), unit(c)
    ref = np.array([unit(r) for r in ref])
    nbrs = sorted(range(len(ref)), key=lambda j: -float(q @ ref[j]))[:k]
    hood = ref[nbrs]
    cov = np.cov(hood.T)  # (d, d), ddof = 1
    values, vectors = np.linalg.eigh(cov)
    values, vectors = values[::-1], vectors[:, ::-1]
    noise = max(values[dim:].sum() / (len(q) - dim), ro.VARIANCE_FLOOR)
    model = vectors[:, :dim] @ np.diag(np.maximum(values[:dim], ro.VARIANCE_FLOOR) - noise)
    covariance = model @ vectors[:, :dim].T + noise * np.eye(len(q))
    r = c - q
    return -float(r @ np.linalg.solve(covariance, r))


@pytest.fixture
def task() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "query": rng.normal(size=(6, 5)),
        "candidates": rng.normal(size=(6, 4, 5)),
        "reference": rng.normal(size=(30, 5)),
    }


def test_registry_names_the_three_readouts() -> None:
    assert ro.READOUTS.names() == ["cosine", "knn", "local_pca"]
    with pytest.raises(RegistryError, match="cosine, knn, local_pca"):
        ro.READOUTS.get("euclid")


def test_cosine_matches_loop(task) -> None:
    scores = ro.readout_scores(task["query"], task["candidates"], "cosine")
    for i in range(6):
        for j in range(4):
            assert scores[i, j] == pytest.approx(_cos(task["query"][i], task["candidates"][i, j]))


@pytest.mark.parametrize("weights", ["binary", "similarity"])
def test_knn_matches_loop(task, weights: str) -> None:
    scores = ro.readout_scores(
        task["query"], task["candidates"], "knn", task["reference"], k=7, weights=weights
    )
    for i in range(6):
        for j in range(4):
            expected = _loop_knn_score(
                task["query"][i], task["candidates"][i, j], task["reference"], 7, weights
            )
            assert scores[i, j] == pytest.approx(expected, abs=1e-12)


def test_knn_scores_are_scale_free_cosines(task) -> None:
    scores = ro.readout_scores(task["query"], task["candidates"], "knn", task["reference"], **KNN5)
    scaled = ro.readout_scores(
        3 * task["query"], 0.5 * task["candidates"], "knn", 7 * task["reference"], **KNN5
    )
    np.testing.assert_allclose(scaled, scores, atol=1e-12)
    assert np.all(np.abs(scores) <= 1 + 1e-12)


@pytest.mark.parametrize(("seed", "noise"), [(0, 1.0), (1, 1.5), (2, 2.0)])
def test_knn_keeps_up_with_cosine_on_a_binding_encoder(seed: int, noise: float) -> None:
    """Latent-class embeddings bind under cosine; kNN must not lose more than 0.05 of it."""
    query, candidates, reference, correct = _latent_classes(seed, noise)
    cosine = ro.binding_accuracy(query, candidates, correct, "cosine")
    knn = ro.binding_accuracy(query, candidates, correct, "knn", reference, **KNN10)
    assert cosine["ci_low"] > 2 * cosine["chance"]  # clearly above chance
    assert knn["accuracy"] >= cosine["accuracy"] - 0.05


@pytest.mark.parametrize(
    ("readout", "options"),
    [
        ("cosine", {}),
        ("knn", KNN10),
        ("knn", {"k": 10, "weights": "binary"}),
        ("local_pca", {"k": 20, "dim": 5}),
    ],
)
def test_random_features_score_chance_within_the_interval(readout: str, options: dict) -> None:
    rng = np.random.default_rng(5)
    query, candidates = rng.normal(size=(400, 64)), rng.normal(size=(400, 8, 64))
    reference, correct = rng.normal(size=(512, 64)), rng.integers(0, 8, 400)
    result = ro.binding_accuracy(query, candidates, correct, readout, reference, **options)
    assert result["ci_low"] <= result["chance"] <= result["ci_high"]
    assert result["win_rate_ci_low"] <= 0.5 <= result["win_rate_ci_high"]


def test_local_pca_matches_loop(task) -> None:
    scores = ro.readout_scores(
        task["query"], task["candidates"], "local_pca", task["reference"], k=8, dim=3
    )
    for i in range(6):
        for j in range(4):
            expected = _loop_local_pca_score(
                task["query"][i], task["candidates"][i, j], task["reference"], 8, 3
            )
            assert scores[i, j] == pytest.approx(expected, abs=1e-9)


def test_local_pca_discounts_the_directions_in_which_the_neighbourhood_varies() -> None:
    """The correct candidate differs from the query a lot along the local nuisance direction, a
    distractor a little across it: cosine picks the distractor, local PCA the correct one."""
    rng = np.random.default_rng(1)
    d = 10
    base = np.eye(d)[0]
    reference = base + rng.normal(size=(40, 2)) @ np.eye(d)[1:3] * 0.2  # varies along e1, e2
    reference += 0.002 * rng.normal(size=(40, d))
    query = base.copy()
    correct = base + 0.3 * np.eye(d)[1]  # far, but along the local variation
    distractor = base + 0.1 * np.eye(d)[5]  # near, but across it
    candidates = np.stack([distractor, correct])[None]
    cos = ro.binding_accuracy(query[None], candidates, np.array([1]), "cosine")
    pca = ro.binding_accuracy(
        query[None], candidates, np.array([1]), "local_pca", reference, k=10, dim=2
    )
    assert (cos["accuracy"], pca["accuracy"]) == (0.0, 1.0)


def test_exact_copies_are_found_by_every_readout(task) -> None:
    rng = np.random.default_rng(2)
    correct = rng.integers(0, 4, size=6)
    candidates = task["candidates"].copy()
    candidates[np.arange(6), correct] = task["query"]
    options = {
        "cosine": {},
        "knn": {"k": 6, "weights": "similarity"},
        "local_pca": {"k": 8, "dim": 4},
    }
    for name, opts in options.items():
        result = ro.binding_accuracy(
            task["query"], candidates, correct, name, task["reference"], **opts
        )
        assert result["accuracy"] == 1.0, name


def test_tie_credit_is_one_over_the_number_of_top_scores() -> None:
    scores = np.array(
        [
            [0.9, 0.1, 0.2, 0.0],  # sole top: 1
            [0.5, 0.5, 0.1, 0.0],  # 2-way tie at the top: 1/2
            [0.7, 0.7, 0.7, 0.1],  # 3-way tie at the top: 1/3
            [0.7, 0.7, 0.7, 0.1],  # tie among the others, correct (index 3) below: 0
            [0.1, 0.3, 0.2, 0.0],  # below: 0
            [np.nan, 0.0, 0.0, -1],  # NaN is never top: 0
            [0.4, np.nan, 0.4, 0.1],  # NaN other: a 2-way tie, 1/2
            [np.nan] * 4,  # nothing is top: 0
            [1.0, 1.0 - 1e-13, 1.0 + 1e-13, 0.0],  # within the tolerance: a 3-way tie
            [1.0, 1.0 - 1e-6, 0.0, 0.0],  # beyond it: a sole top
            [2e12, 2e12 + 1.0, 0.0, 0.0],  # the tolerance is relative for large scores
        ]
    )
    credit = ro.hit_credit(scores, np.array([0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0]))
    assert credit.dtype == np.float64
    expected = [1, 1 / 2, 1 / 3, 0, 0, 0, 1 / 2, 0, 1 / 3, 1, 1 / 2]
    np.testing.assert_allclose(credit, expected, rtol=0, atol=1e-15)


def test_hand_made_three_way_tie_scores_one_third() -> None:
    query = np.array([[1.0, 0.0, 0.0]])
    # Three candidates at the same angle to the query, one far away; the correct one is tied.
    candidates = np.array([[[1.0, 1.0, 0.0], [1.0, 0.0, 1.0], [1.0, -1.0, 0.0], [-1.0, 0, 0]]])
    result = ro.binding_accuracy(query, candidates, np.array([1]), "cosine")
    assert result["accuracy"] == pytest.approx(1 / 3) and result["hits"] == pytest.approx(1 / 3)
    low, high = wilson_interval(1 / 3, 1)
    assert (result["ci_low"], result["ci_high"]) == (low, high)


@pytest.mark.parametrize("n_candidates", [8, 3])
def test_constant_encoder_scores_exactly_chance_under_every_readout(n_candidates: int) -> None:
    """Every embedding identical: all candidates tie, each query earns 1/n_candidates."""
    rng = np.random.default_rng(3)
    vector = rng.normal(size=6)
    query = np.tile(vector, (40, 1))
    candidates = np.tile(vector, (40, n_candidates, 1))
    reference = np.tile(vector, (30, 1))
    correct = rng.integers(0, n_candidates, size=40)
    options = {"cosine": {}, "knn": KNN10, "local_pca": {"k": 20, "dim": 5}}
    for name, opts in options.items():
        result = ro.binding_accuracy(query, candidates, correct, name, reference, **opts)
        assert result["accuracy"] == pytest.approx(1 / n_candidates, rel=1e-12), name
        assert result["accuracy"] == pytest.approx(result["chance"], rel=1e-12), name
        assert result["hits"] == pytest.approx(40 / n_candidates, rel=1e-12), name
        assert result["win_rate"] == 0.5 == result["win_rate_chance"], name
        assert result["win_rate_ci_low"] == result["win_rate_ci_high"] == 0.5, name


def test_result_fields_and_interval_match_scipy() -> None:
    rng = np.random.default_rng(4)
    query = rng.normal(size=(40, 3))
    candidates = rng.normal(size=(40, 5, 3))
    correct = rng.integers(0, 5, size=40)
    candidates[np.arange(25), correct[:25]] = query[:25]  # 25 sure hits, the rest random
    result = ro.binding_accuracy(query, candidates, correct, "cosine")
    hits = float(ro.hit_credit(ro.readout_scores(query, candidates, "cosine"), correct).sum())
    assert hits == int(hits)  # continuous random scores: no ties, whole hits
    hits = int(hits)
    assert result["hits"] == hits >= 25
    assert result["n"] == 40
    assert result["accuracy"] == hits / 40
    assert result["chance"] == 0.2
    assert result["ci_method"] == "wilson"
    ci = binomtest(hits, 40).proportion_ci(confidence_level=0.95, method="wilson")
    assert result["ci_low"] == pytest.approx(ci.low, abs=1e-12)
    assert result["ci_high"] == pytest.approx(ci.high, abs=1e-12)
    assert result["ci_low"] <= result["accuracy"] <= result["ci_high"]


def test_candidate_order_does_not_matter(task) -> None:
    correct = np.array([0, 1, 2, 3, 0, 1])
    base = ro.readout_scores(task["query"], task["candidates"], "knn", task["reference"], **KNN5)
    perm = np.array([2, 0, 3, 1])
    shuffled = ro.readout_scores(
        task["query"], task["candidates"][:, perm], "knn", task["reference"], **KNN5
    )
    np.testing.assert_allclose(shuffled, base[:, perm])
    inverse = np.argsort(perm)
    np.testing.assert_array_equal(
        ro.hit_credit(base, correct), ro.hit_credit(shuffled, inverse[correct])
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"readout": "knn", **KNN5}, "needs a reference"),
        ({"readout": "knn", "reference": np.ones((3, 5)), **KNN5, "k": 4}, "k=4"),
        ({"readout": "knn", "reference": np.ones((9, 4)), **KNN5}, r"\(n, 5\) like the queries"),
        (
            {"readout": "local_pca", "reference": np.full((9, 5), np.inf), "k": 4, "dim": 2},
            "holds NaN",
        ),
        ({"readout": "knn", "reference": np.ones((9, 5)), "k": 5, "weights": "rank"}, "weights"),
        ({"readout": "local_pca", "reference": np.ones((9, 5)), "k": 4, "dim": 4}, "dim=4"),
        ({"correct_index": np.array([0, 0, 9])}, r"\[0, 2\)"),
        ({"correct_index": np.array([0.0, 0, 1])}, "integers"),
        ({"query_features": np.ones((3, 4))}, "n_queries"),
        ({"query_features": np.full((3, 5), np.nan)}, "query_features holds NaN"),
    ],
)
def test_bad_input_is_rejected(kwargs, message: str) -> None:
    args = {
        "query_features": np.ones((3, 5)),
        "candidate_features": np.arange(30.0).reshape(3, 2, 5),
        "correct_index": np.array([0, 1, 0]),
        "readout": "cosine",
        **kwargs,
    }
    with pytest.raises(ValueError, match=message):
        ro.binding_accuracy(**args)


def test_win_rate_is_the_per_query_auc_sklearn_computes() -> None:
    """An independent computation: with the correct candidate the one positive, the win rate
    of a query is the ROC AUC of its scores (ties count one half in both)."""
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(11)
    scores = rng.integers(0, 4, size=(60, 6)).astype(float)  # many ties
    correct = rng.integers(0, 6, size=60)
    expected = [
        roc_auc_score(np.arange(6) == c, row) for row, c in zip(scores, correct, strict=True)
    ]
    np.testing.assert_allclose(ro.win_rate(scores, correct), expected, rtol=0, atol=1e-12)


def test_win_rate_closed_forms() -> None:
    """All tied: 1/2; the correct candidate alone at the top: 1; alone at the bottom: 0; second
    of four: 2/3; a NaN loses to every number."""
    correct = np.array([0, 0, 0, 1, 2])
    scores = np.array(
        [
            [1.0, 1.0, 1.0, 1.0],
            [2.0, 1.0, 0.0, -1.0],
            [-3.0, 1.0, 0.0, -1.0],
            [2.0, 1.0, 0.0, -1.0],
            [np.nan, 1.0, 0.5, np.nan],
        ]
    )
    np.testing.assert_array_equal(ro.win_rate(scores, correct), [0.5, 1.0, 0.0, 2 / 3, 2 / 3])
    assert ro.win_rate(np.ones((3, 1)), np.zeros(3, int)).tolist() == [0.5] * 3
    inf = np.array([[np.inf, 1.0, np.inf]])
    assert ro.win_rate(inf, np.array([0]))[0] == 0.75  # beats 1.0, ties inf


def test_the_win_rate_separates_encoders_that_tie_in_accuracy() -> None:
    """The constructed case: two encoders, each with the correct candidate alone at the top in
    one query of eight (accuracy 1/8, chance). One puts it last in the other seven queries, the
    other second: accuracy cannot tell them apart, the win rate does (1/8 against 7/8)."""
    n_q, n_c = 64, 8
    correct = np.zeros(n_q, int)
    base = np.tile(np.arange(n_c, 0, -1, dtype=float), (n_q, 1))  # candidate 0 highest
    last, second = base.copy(), base.copy()
    last[n_q // 8 :, 0] = 0.0  # below every wrong candidate
    second[n_q // 8 :, 0] = 6.5  # below candidate 1 only
    for scores, win in ((last, 1 / 8), (second, 1 / 8 + 7 / 8 * 6 / 7)):
        assert ro.hit_credit(scores, correct).mean() == 1 / 8
        assert ro.win_rate(scores, correct).mean() == pytest.approx(win, abs=1e-12)


def test_each_readouts_settings_are_its_schema_section_with_no_default_of_its_own() -> None:
    """One home for every value (issue 61): a readout's keyword settings are exactly the keys of
    ``metrics.readouts.<name>`` in schemas/metrics.schema.yaml, whose defaults are the only ones
    (filled into the config once, by repdiag.core.config.fill_defaults): a signature default
    would be a second home that could drift from the schema's."""
    import inspect

    from repdiag.core.config import schema_defaults

    sections = schema_defaults("metrics")["readouts"]
    for name in ro.READOUTS.names():
        keyword = {
            key: parameter.default
            for key, parameter in inspect.signature(ro.READOUTS.get(name)).parameters.items()
            if parameter.kind is inspect.Parameter.KEYWORD_ONLY
        }
        assert sorted(keyword) == sorted(sections.get(name, {})), name
        assert all(default is inspect.Parameter.empty for default in keyword.values()), name
