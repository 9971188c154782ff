"""Batched heads: each head is a function of its own rows only, bit for bit; recipes; persistence."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression

from capc_common.errors import InputError
from capc_common.learn.heads import HeadEnsemble, HeadRecipe, fixed_votes, train_heads


def _blobs(rng: np.random.Generator, n: int, dim: int, classes: int) -> tuple[np.ndarray, np.ndarray]:
    centres = rng.standard_normal((classes, dim)).astype(np.float32) * 1.5
    y = rng.integers(0, classes, n)
    return (centres[y] + rng.standard_normal((n, dim)).astype(np.float32)), y


def _changed_heads(a: HeadEnsemble, b: HeadEnsemble) -> list[int]:
    """Heads whose parameters differ in any bit."""
    same = [all(torch.equal(a.params[k][t], b.params[k][t]) for k in a.params) for t in range(a.heads)]
    return [t for t, s in enumerate(same) if not s]


@pytest.mark.parametrize(
    "recipe",
    [
        HeadRecipe(),
        HeadRecipe(kind="mlp", hidden=16, steps=30, lr=1e-2, l2=1e-3, label_smoothing=0.1),
        HeadRecipe(optimizer="lbfgs", l2=1e-2, steps=50),
        HeadRecipe(kind="mlp", hidden=16, optimizer="lbfgs", l2=1e-2, steps=30),
    ],
    ids=["linear-adam", "mlp-adam", "linear-lbfgs", "mlp-lbfgs"],
)
def test_editing_one_shard_leaves_every_other_head_bit_identical(recipe):
    """Issue 10.2: no shared optimiser state, line search or stopping rule between heads."""
    rng = np.random.default_rng(3)
    sizes = [40, 40, 41, 40, 39, 40]  # equal and unequal shards
    x, y = _blobs(rng, sum(sizes), 24, 5)
    owners = np.repeat(np.arange(len(sizes)), sizes)
    base = train_heads(x, y, owners=owners, heads=len(sizes), classes=5, recipe=recipe)

    # Replace one example of head 1 (features and label).
    x2, y2 = x.copy(), y.copy()
    row = int(np.flatnonzero(owners == 1)[7])
    x2[row] = rng.standard_normal(24).astype(np.float32) * 3
    y2[row] = (y2[row] + 1) % 5
    replaced = train_heads(x2, y2, owners=owners, heads=len(sizes), classes=5, recipe=recipe)
    assert _changed_heads(base, replaced) == [1]

    # Remove one example of head 0: its size changes; nobody else's bits do.
    keep = np.ones(len(y), bool)
    keep[int(np.flatnonzero(owners == 0)[3])] = False
    removed = train_heads(x[keep], y[keep], owners=owners[keep], heads=len(sizes), classes=5, recipe=recipe)
    assert _changed_heads(base, removed) == [0]

    # Add one example to head 3 (40 → 41 rows: now the size of head 2).
    at = int(np.flatnonzero(owners == 3)[-1]) + 1
    x3 = np.insert(x, at, rng.standard_normal(24).astype(np.float32), axis=0)
    added = train_heads(
        x3, np.insert(y, at, 2), owners=np.insert(owners, at, 3), heads=len(sizes), classes=5, recipe=recipe
    )
    assert _changed_heads(base, added) == [3]


def test_a_head_of_an_ensemble_equals_the_same_head_trained_alone():
    rng = np.random.default_rng(1)
    x, y = _blobs(rng, 90, 16, 4)
    owners = np.repeat(np.arange(3), 30)
    recipe = HeadRecipe(steps=40, lr=5e-3, l2=1e-3)
    together = train_heads(x, y, owners=owners, heads=3, classes=4, recipe=recipe)
    for t in range(3):
        rows = owners == t
        alone = train_heads(x[rows], y[rows], owners=np.zeros(30, int), heads=1, classes=4, recipe=recipe)
        for k in together.params:  # both on one thread (a small head): the same bits
            assert torch.equal(together.params[k][t], alone.params[k][0]), (t, k)


def test_adam_matches_torch_adam_with_coupled_weight_decay():
    """The hand-written batched Adam is torch's Adam (weight_decay = L2 added to the gradient)."""
    rng = np.random.default_rng(4)
    x, y = _blobs(rng, 64, 10, 3)
    recipe = HeadRecipe(steps=25, lr=0.02, l2=0.01)
    ours = train_heads(x, y, owners=np.zeros(64, int), heads=1, classes=3, recipe=recipe)
    w = torch.zeros(3, 10, dtype=torch.float32, requires_grad=True)
    b = torch.zeros(3, requires_grad=True)
    opt = torch.optim.Adam([w, b], lr=0.02)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    for _ in range(25):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(xt @ w.T + b, yt) + 0.005 * (w * w).sum()
        loss.backward()
        opt.step()
    torch.testing.assert_close(ours.params["w_out"][0], w.detach(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ours.params["b_out"][0], b.detach(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dim", [12, 80])  # dim > rows exercises the row-space solver
def test_lbfgs_reaches_the_convex_optimum_like_sklearn(dim):
    rng = np.random.default_rng(1)
    sizes = [30, 45, 60]
    x, y = _blobs(rng, sum(sizes), dim, 4)
    owners = np.repeat(np.arange(3), sizes)
    l2 = 0.05
    recipe = HeadRecipe(optimizer="lbfgs", steps=500, l2=l2, tolerance=1e-9)
    heads = train_heads(x, y, owners=owners, heads=3, classes=4, recipe=recipe)
    start = 0
    for t, m in enumerate(sizes):
        xs, ys = x[start : start + m], y[start : start + m]
        start += m
        # Independent reference: sklearn minimises C·ΣCE + ½||W||², i.e. l2 = 1/(C·m) for our mean CE.
        ref = LogisticRegression(C=1.0 / (l2 * m), tol=1e-10, max_iter=5000).fit(xs.astype(np.float64), ys)
        ours_logits = heads.select(t).logits(xs)[0].numpy()
        centre = lambda a: a - a.mean(axis=1, keepdims=True)  # noqa: E731 (softmax is shift-invariant)
        np.testing.assert_allclose(centre(ours_logits), centre(ref.decision_function(xs)), atol=2e-3)
    assert heads.predict(x).shape == (3, x.shape[0])


def test_weights_and_label_smoothing_change_the_fit_as_documented():
    rng = np.random.default_rng(5)
    x, y = _blobs(rng, 60, 8, 3)
    one = np.zeros(60, int)
    plain = train_heads(x, y, owners=one, heads=1, classes=3)
    # Weight 2 on every row is the same weighted *mean*: bit-identical up to float rounding.
    doubled = train_heads(x, y, owners=one, heads=1, classes=3, weights=np.full(60, 2.0))
    torch.testing.assert_close(plain.params["w_out"], doubled.params["w_out"])
    # Zero weight on a row removes it.
    w = np.ones(60)
    w[:10] = 0
    dropped = train_heads(x, y, owners=one, heads=1, classes=3, weights=w)
    alone = train_heads(x[10:], y[10:], owners=one[10:], heads=1, classes=3)
    torch.testing.assert_close(dropped.params["w_out"], alone.params["w_out"])
    smoothed = train_heads(x, y, owners=one, heads=1, classes=3, recipe=HeadRecipe(label_smoothing=0.3))
    assert not torch.equal(smoothed.params["w_out"], plain.params["w_out"])
    assert '"label_smoothing": 0.3' in smoothed.metadata["recipe"]


def test_mlp_heads_train_and_roundtrip(tmp_path):
    rng = np.random.default_rng(2)
    x, y = _blobs(rng, 200, 30, 3)
    owners = np.repeat([0, 1], 100)
    recipe = HeadRecipe(kind="mlp", hidden=16, steps=100, lr=1e-2)
    heads = train_heads(x, y, owners=owners, heads=2, classes=3, recipe=recipe)
    assert (heads.predict(x)[owners, np.arange(200)] == y).mean() > 0.9
    heads = HeadEnsemble(heads.kind, heads.params, heads.classes, {"backbone": "abc"})
    heads.save(tmp_path / "h.safetensors")
    back = HeadEnsemble.load(tmp_path / "h.safetensors")
    assert back.kind == "mlp" and back.metadata == {"backbone": "abc"} and back.heads == 2
    np.testing.assert_array_equal(back.predict(x), heads.predict(x))


def test_an_abstaining_head_is_not_fitted_and_casts_the_fixed_vote(tmp_path):
    """Issue 25.2: a head listed in ``abstain`` owns no rows, keeps its start and votes
    :func:`fixed_votes`; dropping one head's rows and making it abstain changes that head alone."""
    rng = np.random.default_rng(5)
    sizes = [30, 30, 30]
    x, y = _blobs(rng, sum(sizes), 12, 4)
    owners = np.repeat(np.arange(3), sizes)
    base = train_heads(x, y, owners=owners, heads=3, classes=4)
    keep = owners != 1
    idle = train_heads(x[keep], y[keep], owners=owners[keep], heads=3, classes=4, abstain=[1])
    assert idle.abstaining == (1,) and _changed_heads(base, idle) == [1]
    assert not idle.params["w_out"][1].any() and not idle.params["b_out"][1].any()
    np.testing.assert_array_equal(idle.predict(x)[1], fixed_votes(1, len(x), classes=4))
    np.testing.assert_array_equal(idle.predict(x)[[0, 2]], base.predict(x)[[0, 2]])
    np.testing.assert_array_equal(idle.predict(x, chunk=7), idle.predict(x))  # rows count across chunks
    idle.save(tmp_path / "h.safetensors")
    assert HeadEnsemble.load(tmp_path / "h.safetensors").abstaining == (1,)
    with pytest.raises(InputError, match="own training rows"):
        train_heads(x, y, owners=owners, heads=3, classes=4, abstain=[1])
    with pytest.raises(InputError, match=r"must lie in \[0, 3\)"):
        train_heads(x[keep], y[keep], owners=owners[keep], heads=3, classes=4, abstain=[1, 3])


def test_bad_inputs_are_refused(tmp_path):
    x = np.zeros((10, 4), np.float32)
    y = np.zeros(10, int)
    with pytest.raises(InputError, match="no training rows"):
        train_heads(x, y, owners=np.zeros(10, int), heads=2, classes=2)
    with pytest.raises(InputError, match=r"labels must lie in \[0, 2\)"):
        train_heads(x, y + 5, owners=np.zeros(10, int), heads=1, classes=2)
    with pytest.raises(InputError, match="positive total example weight"):
        train_heads(x, y, owners=np.zeros(10, int), heads=1, classes=2, weights=np.zeros(10))
    for bad in ({"lr": 0}, {"steps": 0}, {"label_smoothing": 1.0}, {"optimizer": "lbfgs", "l2": 0.0}):
        with pytest.raises(InputError):
            HeadRecipe(**bad)  # type: ignore[arg-type]
    heads = train_heads(x, y, owners=np.zeros(10, int), heads=1, classes=2)
    with pytest.raises(InputError, match=r"shape \(N, 4\)"):
        heads.predict(np.zeros((3, 5), np.float32))
    with pytest.raises(InputError, match="does not exist"):
        HeadEnsemble.load(tmp_path / "missing.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a tensor file")
    with pytest.raises(InputError, match="not a readable"):
        HeadEnsemble.load(tmp_path / "junk.safetensors")


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_predict_own_is_each_rows_own_head_of_predict(kind):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(90, 12)).astype(np.float32)
    owners = np.repeat(np.arange(3), 30)
    heads = train_heads(
        x, rng.integers(0, 4, 90), owners=owners, heads=3, classes=4, recipe=HeadRecipe(kind=kind, steps=5)
    )
    shuffled = rng.permutation(90)  # any order of rows, not only grouped by head
    expected = heads.predict(x[shuffled])[owners[shuffled], np.arange(90)]
    np.testing.assert_array_equal(heads.predict_own(x[shuffled], owners[shuffled]), expected)


def test_a_head_is_the_same_on_any_number_of_the_processs_threads() -> None:
    """A hospital with a single large head trains it on its party's threads, the central run with its other
    heads on one: the head must be the same bits. Large enough that the products split between threads (a
    16,800 × 3,969 head: about 4 GFLOP per step, where the thread limit used to be lifted)."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(7)
    n, dim = 16_800, 3_969
    x = rng.standard_normal((n + 64, dim), dtype=np.float32)
    y = rng.integers(0, 10, n + 64)
    recipe = HeadRecipe(optimizer="adam", steps=2, lr=0.1)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with threadpool_limits(limits=2, user_api="blas"):
            alone = train_heads(
                x[:n], y[:n], owners=np.zeros(n, np.int64), heads=1, classes=10, recipe=recipe
            )
            threads_after = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    owners = np.r_[np.zeros(n, np.int64), np.ones(64, np.int64)]
    together = train_heads(x, y, owners=owners, heads=2, classes=10, recipe=recipe)
    assert threads_after == 2  # the caller's thread count comes back
    for name, value in alone.params.items():
        assert torch.equal(value[0], together.params[name][0]), name
