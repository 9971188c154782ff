"""Classification heads over frozen features: many independent heads in one parameter stack.

Every DIET-PATE teacher, and the student, is a small head on the shared frozen backbone's features. All of a
party's heads live in one stacked parameter tensor (``(heads, classes, dim)`` for linear heads) so that
answering queries is one matrix product for every head at once (:meth:`HeadEnsemble.predict`). Training
is per head: each head has its own parameters, gradients and optimiser moments and takes the same fixed
number of steps (:mod:`capc_common.learn._optim`), so each head is a function of its own shard only — the
PATE sensitivity argument (one example moves one vote) needs exactly that, and tests pin it bit for bit.

Per-head objective: weighted mean cross-entropy over the head's own examples (optionally label-smoothed)
plus ``l2/2 · ||W||²`` on the weights (biases are not penalised). How a head is fitted is a
:class:`HeadRecipe`.

A head may *abstain* (a teacher whose shard is shorter than one BatchNorm chunk, docs/privacy.md): it is not
fitted and casts the fixed vote :func:`fixed_votes` — one vote per query like any head, so the vote counts
still sum to the number of heads and one example still moves at most one vote.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
import torch

from capc_common.errors import InputError
from capc_common.learn import _optim
from capc_common.threads import threads_limited

__all__ = ["HeadEnsemble", "HeadKind", "HeadRecipe", "fixed_votes", "train_heads"]

HeadKind = Literal["linear", "mlp"]
_FORMAT = "capc-heads-v1"
_FLOAT64_ELEMENTS = 16_000_000


def fixed_votes(head: int, rows: int, *, classes: int) -> npt.NDArray[np.int64]:
    """The vote of an abstaining head on ``rows`` queries: class ``(head + row) mod classes`` for row ``row``.

    It depends on public positions only (never on data), so a head that switches between voting and
    abstaining moves one one-hot vote, as any change of one example does; rotating the class by head and row
    keeps several abstaining heads from piling their votes on one class.
    """
    return (head + np.arange(rows, dtype=np.int64)) % classes


@dataclass(frozen=True)
class HeadEnsemble:
    """``heads`` independent classifiers over ``dim``-dimensional features.

    Attributes:
        kind: ``"linear"`` (``x @ W.T + b``) or ``"mlp"`` (one ReLU hidden layer: the "more than the last
            layer" ablation on a frozen backbone).
        params: named parameter tensors, each with the head index first (float32, CPU).
        classes: number of classes.
        metadata: free-form string metadata stored with the weights (backbone hash, recipe, ...).
        abstaining: heads that were not fitted (no shard of their own) and cast :func:`fixed_votes`.
    """

    kind: HeadKind
    params: dict[str, torch.Tensor]
    classes: int
    metadata: dict[str, str] = field(default_factory=dict)
    abstaining: tuple[int, ...] = ()

    @property
    def heads(self) -> int:
        """Number of heads (teachers)."""
        return int(self.params["w_out"].shape[0])

    @property
    def dim(self) -> int:
        """Feature dimension the heads expect."""
        first = self.params["w_in"] if self.kind == "mlp" else self.params["w_out"]
        return int(first.shape[2])

    def logits(self, features: npt.ArrayLike | torch.Tensor) -> torch.Tensor:
        """Every head's logits on the same features.

        Args:
            features: float array ``(N, dim)``.

        Returns:
            float32 tensor ``(heads, N, classes)``.

        Raises:
            InputError: if the feature dimension does not match the heads.
        """
        x = _as_features(features, dim=self.dim)
        with torch.no_grad():
            return _shared_forward(self.kind, self.params, x)

    def predict(self, features: npt.ArrayLike | torch.Tensor, *, chunk: int = 4096) -> npt.NDArray[np.int64]:
        """Every head's predicted label on the same features (ties → lowest class index).

        Args:
            features: float array ``(N, dim)``.
            chunk: rows per forward pass, to bound memory with many heads.

        Returns:
            ``int64`` array ``(heads, N)``: row ``t`` holds head ``t``'s labels (:func:`fixed_votes` for an
            abstaining head).
        """
        x = _as_features(features, dim=self.dim)
        out = np.empty((self.heads, x.shape[0]), dtype=np.int64)
        for start in range(0, x.shape[0], chunk):
            out[:, start : start + chunk] = self.logits(x[start : start + chunk]).argmax(dim=2).numpy()
        for t in self.abstaining:
            out[t] = fixed_votes(t, x.shape[0], classes=self.classes)
        return out

    def predict_own(
        self, features: npt.ArrayLike | torch.Tensor, owners: npt.ArrayLike
    ) -> npt.NDArray[np.int64]:
        """Each row's label from its own head only (head ``owners[r]`` on row ``r``; ties → lowest class):
        a party's training accuracy at ``1/heads`` of the cost of :meth:`predict` on every row.

        Args:
            features: float array ``(N, dim)``.
            owners: ``(N,)`` head of each row.

        Returns:
            ``int64`` array ``(N,)``.
        """
        x = _as_features(features, dim=self.dim)
        owner = np.asarray(owners, dtype=np.int64)
        out = np.empty(len(owner), dtype=np.int64)
        for head in np.unique(owner):
            rows = np.flatnonzero(owner == head)
            params = {k: v[head : head + 1] for k, v in self.params.items()}
            with torch.no_grad():
                out[rows] = _shared_forward(self.kind, params, x[rows])[0].argmax(dim=1).numpy()
        return out

    def select(self, index: int) -> HeadEnsemble:
        """One head as a single-head ensemble (e.g. to serve or evaluate it alone)."""
        if not 0 <= index < self.heads:
            raise InputError(f"head index {index} out of range [0, {self.heads})")
        params = {k: v[index : index + 1].clone() for k, v in self.params.items()}
        abstaining = (0,) if index in self.abstaining else ()
        return HeadEnsemble(self.kind, params, self.classes, dict(self.metadata), abstaining)

    def save(self, path: str | Path) -> None:
        """Write the heads to a safetensors file (atomically: a temporary file, then a rename)."""
        from safetensors.torch import save_file

        target = Path(path)
        meta = {
            "format": _FORMAT,
            "kind": self.kind,
            "classes": str(self.classes),
            "user": json.dumps(self.metadata, sort_keys=True),
            "abstaining": json.dumps(list(self.abstaining)),
        }
        tmp = target.with_name(target.name + ".tmp")
        save_file({k: v.contiguous() for k, v in self.params.items()}, str(tmp), metadata=meta)
        tmp.replace(target)

    @classmethod
    def load(cls, path: str | Path) -> HeadEnsemble:
        """Read heads written by :meth:`save`.

        Raises:
            InputError: if the file is missing or is not a heads file.
        """
        source = Path(path)
        if not source.is_file():
            raise InputError(f"heads file {source} does not exist; train heads first and save them there")
        meta, params = read_safetensors(source)
        if meta.get("format") != _FORMAT or meta.get("kind") not in ("linear", "mlp"):
            raise InputError(f"{source} is not a capc heads file (format {meta.get('format')!r})")
        kind: HeadKind = "mlp" if meta["kind"] == "mlp" else "linear"
        abstaining = tuple(int(t) for t in json.loads(meta.get("abstaining", "[]")))
        return cls(kind, params, int(meta["classes"]), json.loads(meta.get("user", "{}")), abstaining)


def read_safetensors(source: Path) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """A safetensors file's metadata and tensors, any reading failure as one clear :class:`InputError`
    (a truncated or foreign file must not surface as a library traceback).

    Raises:
        InputError: the file cannot be read as safetensors.
    """
    from safetensors import safe_open

    try:
        with safe_open(str(source), framework="pt") as handle:
            meta = handle.metadata() or {}
            tensors = {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118
    except Exception as exc:
        raise InputError(f"{source} is not a readable safetensors file: {exc}") from exc
    return dict(meta), tensors


def _as_features(features: npt.ArrayLike | torch.Tensor, *, dim: int) -> torch.Tensor:
    if isinstance(features, torch.Tensor):
        x = features
    else:
        array = np.asarray(features)
        # torch.from_numpy refuses (warns on) read-only views such as memory-mapped caches: copy those.
        x = torch.from_numpy(array if array.flags.writeable else array.copy())
    if x.ndim != 2 or x.shape[1] != dim:
        raise InputError(
            f"features must have shape (N, {dim}) to match the heads, got {tuple(x.shape)}; "
            "extract them with the same backbone the heads were trained on"
        )
    return x.to(torch.float32)


def _shared_forward(kind: HeadKind, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Logits ``(heads, N, classes)`` of every head on the *same* inputs ``x`` ``(N, dim)``.

    The first layer of all heads is one GEMM against the stacked weights, rather than a batched product on
    ``heads`` copies of ``x`` (which would materialise ``heads × N × dim`` floats).
    """
    first = params["w_in"] if kind == "mlp" else params["w_out"]
    first_bias = params["b_in"] if kind == "mlp" else params["b_out"]
    heads, width, dim = first.shape
    h = torch.addmm(first_bias.reshape(-1), x, first.reshape(heads * width, dim).T)
    h = h.reshape(x.shape[0], heads, width).transpose(0, 1)
    if kind == "linear":
        return h
    return torch.baddbmm(params["b_out"].unsqueeze(1), torch.relu(h), params["w_out"].transpose(1, 2))


@dataclass(frozen=True)
class HeadRecipe:
    """How a head is fitted: its shape, its objective and its optimiser.

    The default is the paper's recipe for DIET-PATE teachers — the last layer trained by full-batch Adam
    for a *fixed* number of steps from zero. What matters for PATE is how a head votes on synthetic
    queries, off the real data, and a head trained to convergence votes worse there (measured: −23 points
    for a student on the noiseless votes, docs/dietpate.md); a fixed step count also keeps every head a
    function of its own shard only (no joint stopping rule).

    Attributes:
        kind: ``"linear"`` (``x @ W.T + b``) or ``"mlp"`` (one ReLU hidden layer).
        hidden: hidden width of MLP heads.
        optimizer: ``"adam"`` (fixed ``steps``) or ``"lbfgs"`` (to convergence, at most ``steps``
            iterations, one head at a time; for convex probes such as the linear probe).
        steps: Adam steps, or the L-BFGS iteration cap.
        lr: Adam's learning rate.
        l2: coefficient of ``l2/2 · ||W||²`` (weights only); L-BFGS needs it > 0 (a unique optimum).
        label_smoothing: weight of the uniform distribution mixed into the one-hot targets.
        tolerance: L-BFGS stops when the gradient's largest entry falls below this.
    """

    kind: HeadKind = "linear"
    hidden: int = 256
    optimizer: Literal["adam", "lbfgs"] = "adam"
    steps: int = 50
    lr: float = 1e-3
    l2: float = 0.0
    label_smoothing: float = 0.0
    tolerance: float = 1e-6

    def __post_init__(self) -> None:
        if self.kind not in ("linear", "mlp"):
            raise InputError(f"unknown head kind {self.kind!r}; choose 'linear' or 'mlp'")
        if self.optimizer not in ("adam", "lbfgs"):
            raise InputError(f"unknown optimizer {self.optimizer!r}; choose 'adam' or 'lbfgs'")
        if self.steps < 1 or self.hidden < 1:
            raise InputError(f"steps and hidden must be >= 1, got steps={self.steps}, hidden={self.hidden}")
        if not (self.lr > 0 and self.l2 >= 0 and 0 <= self.label_smoothing < 1):
            raise InputError(
                f"need lr > 0, l2 >= 0 and 0 <= label_smoothing < 1, got lr={self.lr}, l2={self.l2}, "
                f"label_smoothing={self.label_smoothing}"
            )
        if self.optimizer == "lbfgs" and not self.l2 > 0:
            raise InputError(f"the lbfgs optimizer needs l2 > 0 (it makes the optimum unique), got {self.l2}")

    def describe(self) -> dict[str, str | int | float]:
        """The recipe as plain values (for metadata, cache keys and reports)."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _init_params(
    kind: HeadKind, *, heads: int, dim: int, classes: int, hidden: int, seed: int
) -> dict[str, torch.Tensor]:
    if kind == "linear":
        # Zero is the paper's start and needs no randomness; it keeps the convex problem's path canonical.
        return {"w_out": torch.zeros(heads, classes, dim), "b_out": torch.zeros(heads, classes)}
    gen = torch.Generator().manual_seed(seed)
    # One draw shaped (1, ...) shared by all heads: "same initialisation" for every teacher, as in the paper.
    w_in = torch.randn(1, hidden, dim, generator=gen) * math.sqrt(2.0 / dim)
    w_out = torch.randn(1, classes, hidden, generator=gen) * math.sqrt(1.0 / hidden)
    return {
        "w_in": w_in.expand(heads, -1, -1).clone(),
        "b_in": torch.zeros(heads, hidden),
        "w_out": w_out.expand(heads, -1, -1).clone(),
        "b_out": torch.zeros(heads, classes),
    }


def _check(
    features: npt.ArrayLike,
    labels: npt.ArrayLike,
    owners: npt.ArrayLike,
    weights: npt.ArrayLike | None,
    *,
    heads: int,
    classes: int,
    abstain: frozenset[int],
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    x = np.asarray(features, dtype=np.float32)
    y = np.asarray(labels)
    own = np.asarray(owners)
    if x.ndim != 2 or y.shape != (x.shape[0],) or own.shape != (x.shape[0],):
        raise InputError(
            f"features must be (M, dim) with labels and owners (M,), got {x.shape}, {y.shape}, {own.shape}"
        )
    if not (np.issubdtype(y.dtype, np.integer) and np.issubdtype(own.dtype, np.integer)):
        raise InputError(f"labels and owners must be integers, got {y.dtype} and {own.dtype}")
    if heads < 1 or classes < 2:
        raise InputError(f"need heads >= 1 and classes >= 2, got heads={heads}, classes={classes}")
    if y.size and (y.min() < 0 or y.max() >= classes):
        raise InputError(f"labels must lie in [0, {classes}), got [{y.min()}, {y.max()}]")
    if own.size and (own.min() < 0 or own.max() >= heads):
        raise InputError(f"owners must lie in [0, {heads}), got [{own.min()}, {own.max()}]")
    if any(not 0 <= t < heads for t in abstain):
        raise InputError(f"abstaining heads {sorted(abstain)} must lie in [0, {heads})")
    counts = np.bincount(own.astype(np.int64), minlength=heads)
    empty = sorted(set(np.flatnonzero(counts == 0).tolist()) - abstain)
    if empty:
        raise InputError(
            f"{len(empty)} head(s) have no training rows and do not abstain (first: {empty[:5]}); "
            "use fewer teachers than samples or check the partition"
        )
    fed = sorted(t for t in abstain if counts[t])
    if fed:
        raise InputError(
            f"abstaining head(s) {fed[:5]} own training rows; an abstaining head is fitted on nothing"
        )
    if not np.all(np.isfinite(x)):
        raise InputError("features contain NaN or infinity; check the backbone's output")
    w = np.ones(x.shape[0], np.float32) if weights is None else np.asarray(weights, dtype=np.float32)
    if w.shape != (x.shape[0],) or np.any(w < 0) or not np.all(np.isfinite(w)):
        raise InputError(f"weights must be finite and non-negative with shape ({x.shape[0]},), got {w.shape}")
    totals = np.bincount(own.astype(np.int64), weights=w, minlength=heads)
    if any(totals[t] <= 0 for t in range(heads) if t not in abstain):
        raise InputError("every head needs a positive total example weight")
    return x, y.astype(np.int64), own.astype(np.int64), w


def train_heads(
    features: npt.ArrayLike,
    labels: npt.ArrayLike,
    *,
    owners: npt.ArrayLike,
    heads: int,
    classes: int,
    recipe: HeadRecipe | None = None,
    weights: npt.ArrayLike | None = None,
    seed: int = 0,
    abstain: Sequence[int] = (),
) -> HeadEnsemble:
    """Train ``heads`` heads, head ``t`` on the rows whose owner is ``t`` and on nothing else.

    Each head is fitted on its own: its own tensors, parameters, gradients and Adam moments, the same fixed
    number of steps for every head. So a head's result depends on its own rows only — tests add, remove or
    replace one example of one shard and check that every other head is bit-identical. (Stacking
    equally-sized heads into one batched product was tried and rejected: BLAS picks kernels by batch
    shape, so a head's last bits moved when another shard's size changed.) Rows keep their order.

    Args:
        features: float array ``(M, dim)``: all heads' training features, concatenated.
        labels: ``(M,)`` class labels in ``[0, classes)``.
        owners: ``(M,)`` head index of each row (the teacher whose shard it belongs to).
        heads: number of heads; every head must own at least one row.
        classes: number of classes.
        recipe: how to fit each head (default: :class:`HeadRecipe`'s, the paper's teacher recipe).
        weights: optional non-negative per-row weights (e.g. to down-weight pseudo-labels); each head's loss
            is the weighted *mean* over its rows.
        seed: seeds the MLP initialisation (shared by all heads; linear heads start at zero).
        abstain: heads that own no rows: they keep their initial parameters and vote :func:`fixed_votes`.

    Returns:
        The trained :class:`HeadEnsemble` (its metadata records the recipe).

    Raises:
        InputError: on inconsistent shapes, labels out of range, or a head with no data that does not
            abstain (or an abstaining head with data).
    """
    recipe = recipe or HeadRecipe()
    idle = frozenset(int(t) for t in abstain)
    x, y, own, w = _check(features, labels, owners, weights, heads=heads, classes=classes, abstain=idle)
    params = _init_params(
        recipe.kind, heads=heads, dim=x.shape[1], classes=classes, hidden=recipe.hidden, seed=seed
    )
    order = np.argsort(own, kind="stable")
    counts = np.bincount(own, minlength=heads)
    starts = np.concatenate([[0], np.cumsum(counts)])
    # Every head is fitted on one thread: a fixed order of arithmetic. Threaded BLAS may split its reductions
    # differently by thread count and when the machine is busy (seen here: an MLP head's last bits moved
    # under load), and then a head's bits would depend on more than its own rows — a party's single head on
    # its threads would differ from the central run's (measured with OpenBLAS: a 15,800-row head on two
    # threads differed in 23,952 of its 42,250 weights from the same head on one; MKL likewise). One thread
    # is also faster for the many small products of teachers and L-BFGS.
    with threads_limited(1):
        for t in sorted(set(range(heads)) - idle):
            rows = order[starts[t] : starts[t + 1]]
            # torch's own (64-byte aligned) buffer: a BLAS may pick kernels by alignment, and a numpy copy's
            # alignment depends on earlier allocations, i.e. on the other shards. The rows are gathered
            # straight into it (one copy, not a numpy copy and its clone: a hospital's 20,000 × 4,225 rows
            # are 338 MB each); "clip" because numpy's default mode gathers into a temporary first, and
            # ``rows`` (from the argsort) are all in range.
            xs = torch.empty((len(rows), x.shape[1]), dtype=torch.float32)
            np.take(x, rows, axis=0, out=xs.numpy(), mode="clip")
            xs = xs.unsqueeze(0)
            ys = torch.from_numpy(y[rows]).unsqueeze(0)
            ws = torch.from_numpy(w[rows] / w[rows].sum()).unsqueeze(0)
            head = {k: v[t : t + 1].clone() for k, v in params.items()}
            _fit_head(recipe, head, xs, ys, ws, classes=classes)
            for k, v in head.items():
                params[k][t] = v[0].float()
    return HeadEnsemble(
        recipe.kind,
        params,
        classes,
        {"recipe": json.dumps(recipe.describe(), sort_keys=True)},
        tuple(sorted(idle)),
    )


def _fit_head(
    recipe: HeadRecipe,
    params: dict[str, torch.Tensor],
    xs: torch.Tensor,
    ys: torch.Tensor,
    ws: torch.Tensor,
    *,
    classes: int,
) -> None:
    """Fit one head in place (its tensors carry a leading head axis of length 1)."""
    if recipe.optimizer == "adam":
        target = _optim.targets(ys, classes, smoothing=recipe.label_smoothing, dtype=xs.dtype)
        _optim.adam(recipe.kind, params, xs, target, ws, l2=recipe.l2, steps=recipe.steps, lr=recipe.lr)
        return
    first = "w_in" if recipe.kind == "mlp" else "w_out"
    basis = _row_space(xs) if xs.shape[1] < xs.shape[2] else None
    rows = xs
    if basis is not None:
        # Train in coordinates of the head's own row space: same optimum, far smaller problem.
        xs = basis[0]
        params[first] = torch.bmm(torch.bmm(params[first], rows.transpose(1, 2)), basis[1])
    # Small (e.g. compressed) problems are solved in float64 so the optimum is reached to many digits; large
    # ones (a probe on many rows) are memory-bound, and float32 halves the traffic.
    dtype = torch.float64 if xs.numel() <= _FLOAT64_ELEMENTS else torch.float32
    for k in params:
        params[k] = params[k].to(dtype)
    target = _optim.targets(ys, classes, smoothing=recipe.label_smoothing, dtype=dtype)
    _optim.lbfgs(
        recipe.kind,
        params,
        xs.to(dtype),
        target,
        ws.to(dtype),
        l2=recipe.l2,
        max_iter=recipe.steps,
        tolerance=recipe.tolerance,
    )
    if basis is not None:
        params[first] = torch.bmm(torch.bmm(params[first].float(), basis[1].transpose(1, 2)), rows)


def _row_space(xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Orthonormal coordinates of each head's rows: ``X_t = Z_t Q_tᵀ`` with ``Q_t = X_tᵀ P_t``.

    With ``m`` rows in ``dim > m`` dimensions, an L2-penalised head's optimal first-layer weights lie in the
    row space of its data (the part orthogonal to it only adds penalty), so the problem can be solved on the
    ``m``-dimensional coordinates ``Z_t`` and mapped back exactly. From the Gram matrix
    ``X_t X_tᵀ = U S Uᵀ``: ``Z_t = U S^½`` and ``P_t = U S^-½`` (directions with negligible eigenvalues
    are dropped).

    Returns:
        ``(Z, P)``, both ``(heads, m, m)``: ``Z`` in float64 (it is trained on), ``P`` in float32.
    """
    gram = torch.bmm(xs, xs.transpose(1, 2)).double()
    evals, evecs = torch.linalg.eigh(gram)
    keep = evals > evals[:, -1:].clamp_min(1e-30) * 1e-7
    root = torch.where(keep, evals.clamp_min(1e-300).sqrt(), torch.zeros_like(evals))
    inv_root = torch.where(keep, 1.0 / root.clamp_min(1e-300), torch.zeros_like(evals))
    return evecs * root.unsqueeze(1), (evecs * inv_root.unsqueeze(1)).float()
