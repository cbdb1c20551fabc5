"""The translator's choice of beam candidates (fairseq_memattn.deploy.best_first) against a full
stable sort, on scores with ties and -inf, as BeamSearch sees them."""

import numpy as np
import pytest

from fairseq_memattn.deploy import best_first


@pytest.mark.parametrize("seed", range(5))
def test_best_first_equals_a_full_sort(seed):
    rng = np.random.default_rng(seed)
    for _ in range(50):
        rows, columns = rng.integers(1, 8), rng.integers(2, 60)
        scores = rng.integers(-4, 4, size=(rows, columns)).astype(np.float32)  # many ties
        scores[rng.random(scores.shape) < 0.3] = -np.inf
        k = int(rng.integers(1, columns))
        chosen = best_first(scores, k)
        full = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        np.testing.assert_array_equal(np.take_along_axis(scores, chosen, axis=1),
                                      np.take_along_axis(scores, full, axis=1))
        finite = np.isfinite(np.take_along_axis(scores, full, axis=1))
        np.testing.assert_array_equal(chosen[finite], full[finite])  # ties among finite scores: lower index first
