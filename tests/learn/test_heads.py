"""Batched heads: one joint problem must give every head what it would get alone."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from capc_common.errors import InputError
from capc_common.learn.heads import HeadEnsemble, train_heads


def _blobs(rng: np.random.Generator, n: int, dim: int, classes: int) -> tuple[np.ndarray, np.ndarray]:
    centres = rng.standard_normal((classes, dim)).astype(np.float32) * 1.5
    y = rng.integers(0, classes, n)
    return (centres[y] + rng.standard_normal((n, dim)).astype(np.float32)), y


@pytest.mark.parametrize("dim", [12, 80])  # dim > rows per head exercises the row-space solver
def test_batched_heads_match_one_by_one_and_sklearn(dim):
    rng = np.random.default_rng(1)
    sizes = [30, 45, 60]  # unequal shards: padding must not leak into any head
    x, y = _blobs(rng, sum(sizes), dim, 4)
    owners = np.repeat(np.arange(3), sizes)
    l2 = 0.05
    batched = train_heads(x, y, owners=owners, heads=3, classes=4, l2=l2, max_iter=500, tolerance=1e-9)
    start = 0
    for t, m in enumerate(sizes):
        xs, ys = x[start : start + m], y[start : start + m]
        start += m
        alone = train_heads(
            xs, ys, owners=np.zeros(m, int), heads=1, classes=4, l2=l2, max_iter=500, tolerance=1e-9
        )
        np.testing.assert_allclose(batched.params["w_out"][t], alone.params["w_out"][0], atol=2e-4)
        # Independent reference: sklearn minimises C·ΣCE + ½||W||², i.e. l2 = 1/(C·m) for our mean CE.
        ref = LogisticRegression(C=1.0 / (l2 * m), tol=1e-10, max_iter=5000).fit(xs.astype(np.float64), ys)
        ours_logits = batched.select(t).logits(xs)[0].numpy()
        ref_logits = ref.decision_function(xs)
        centre = lambda a: a - a.mean(axis=1, keepdims=True)  # noqa: E731 (softmax is shift-invariant)
        np.testing.assert_allclose(centre(ours_logits), centre(ref_logits), atol=2e-3)
    preds = batched.predict(x)
    assert preds.shape == (3, x.shape[0]) and preds.dtype == np.int64


def test_mlp_heads_train_and_roundtrip(tmp_path):
    rng = np.random.default_rng(2)
    x, y = _blobs(rng, 200, 30, 3)
    owners = np.repeat([0, 1], 100)
    heads = train_heads(x, y, owners=owners, heads=2, classes=3, kind="mlp", hidden=16, max_iter=100)
    assert (heads.predict(x)[owners, np.arange(200)] == y).mean() > 0.9
    heads = HeadEnsemble(heads.kind, heads.params, heads.classes, {"backbone": "abc"})
    heads.save(tmp_path / "h.safetensors")
    back = HeadEnsemble.load(tmp_path / "h.safetensors")
    assert back.kind == "mlp" and back.metadata == {"backbone": "abc"} and back.heads == 2
    np.testing.assert_array_equal(back.predict(x), heads.predict(x))


def test_bad_inputs_are_refused(tmp_path):
    x = np.zeros((10, 4), np.float32)
    y = np.zeros(10, int)
    with pytest.raises(InputError, match="no training rows"):
        train_heads(x, y, owners=np.zeros(10, int), heads=2, classes=2)
    with pytest.raises(InputError, match=r"labels must lie in \[0, 2\)"):
        train_heads(x, y + 5, owners=np.zeros(10, int), heads=1, classes=2)
    heads = train_heads(x, y, owners=np.zeros(10, int), heads=1, classes=2)
    with pytest.raises(InputError, match=r"shape \(N, 4\)"):
        heads.predict(np.zeros((3, 5), np.float32))
    with pytest.raises(InputError, match="does not exist"):
        HeadEnsemble.load(tmp_path / "missing.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a tensor file")
    with pytest.raises(InputError, match="not a readable"):
        HeadEnsemble.load(tmp_path / "junk.safetensors")
