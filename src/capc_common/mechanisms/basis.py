"""A public subspace of the backbone's features: the top principal directions of its features on synthetic
images.

Secure-aggregation DP-SGD adds noise to every coordinate of the head's gradient, so a head over fewer,
better-chosen coordinates loses less to the noise. Which coordinates must not depend on the private data
(else choosing them would be a release), and with no public data the one free source is the synthetic images
every party can generate: the principal directions of the backbone's per-example features on them. Measured
on Fashion-MNIST (docs/mechanisms.md, "A learning recipe"): the top 1,024 of 4,225 directions of 10,000 dead
leaves and shaders images hold 97 % of the private features' energy, and DP-SGD over them is 0.5–1 point
better at ε 3 than over all 4,225 coordinates.

The basis is a deterministic function of public inputs (backbone, generators, seeds, counts), so every party
computes the same one; :func:`basis_digest` fingerprints it, so a party on a machine whose floating point
differs can tell (docs/federation.md). Eigenvectors are defined up to sign: each column's largest-magnitude
entry is made positive.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError

__all__ = ["BASIS_VERSION", "BasisSpec", "basis_digest", "is_basis", "public_basis"]

#: Bumped whenever :func:`public_basis` computes a different basis from the same spec: it is part of the
#: cache key, so a machine never reads an older version's basis from its feature cache, and the error for a
#: pinned digest names it. 3 (2026-12-03): the backbone's order-0 scattering coefficients in float64, which
#: moves features, hence the basis, in their last bits.
BASIS_VERSION = 3


@dataclass(frozen=True)
class BasisSpec:
    """Which synthetic images define the subspace, and its dimension.

    Attributes:
        dim: directions kept (at most the feature dimension; fewer if the backbone has fewer features).
        generators: synthetic generators, ``images`` each.
        images: images per generator.
        seed: the generators' seed (public).
    """

    dim: int = 1024
    generators: tuple[str, ...] = ("dead_leaves", "shaders")
    images: int = 5000
    seed: int = 7

    def __post_init__(self) -> None:
        if self.dim < 1 or self.images < 2 or not self.generators:
            raise InputError(
                f"a public basis needs dim ≥ 1, images ≥ 2 and a generator; got dim {self.dim}, images "
                f"{self.images}, generators {list(self.generators)}"
            )

    def describe(self) -> dict[str, object]:
        """The spec as JSON-able fields (a cache key, a config entry)."""
        return {**asdict(self), "generators": list(self.generators)}


def public_basis(
    spec: BasisSpec,
    *,
    featurize: Callable[[npt.NDArray[np.uint8]], npt.NDArray[np.floating]],
    shape: tuple[int, int, int],
) -> npt.NDArray[np.float32]:
    """The top ``spec.dim`` principal directions of the L2-normalised features of the spec's synthetic images.

    Args:
        spec: generators, counts, seed, dimension.
        featurize: per-example features of uint8 images (the shared backbone, running statistics).
        shape: ``(height, width, channels)`` of the federation's images.

    Returns:
        ``(feature_dim, k)`` float32 with orthonormal columns (``k = min(dim, feature_dim)``), largest
        variance first, each column's largest-magnitude entry positive.
    """
    x = _centred_rows(spec, featurize=featurize, shape=shape)
    k = min(spec.dim, x.shape[1])
    top = _top_directions([x], k)
    signs = np.sign(top[np.abs(top).argmax(axis=0), np.arange(k)])
    return np.ascontiguousarray(top * np.where(signs == 0, 1.0, signs), dtype=np.float32)


def _centred_rows(
    spec: BasisSpec,
    *,
    featurize: Callable[[npt.NDArray[np.uint8]], npt.NDArray[np.floating]],
    shape: tuple[int, int, int],
) -> npt.NDArray[np.float64]:
    """The spec's images' features as float64 rows, each L2-normalised (a zero row stays zero), centred.

    Built in one array, in place: each generator's features are written into their rows, then divided by
    their norms (a block of rows at a time) and centred there: the same operations on the same values as on
    copies, the same bits. The whole float64 matrix of 10,000 images of a 4,225-wide backbone is 338 MB; its
    copies (the normalised rows, their squares for the norms) made the student's peak.
    """
    from capc_common.synth import generate

    height, width, channels = shape
    x: npt.NDArray[np.float64] | None = None
    for i, name in enumerate(spec.generators):
        images = generate(
            name, seed=spec.seed, start=0, count=spec.images, height=height, width=width, channels=channels
        )
        for start, stop in _blocks(spec.images):
            block = featurize(images[start:stop])
            if x is None:
                x = np.empty((spec.images * len(spec.generators), block.shape[1]), dtype=np.float64)
            x[i * spec.images + start : i * spec.images + stop] = block
    assert x is not None  # a spec has at least one generator
    for start in range(0, len(x), _ROWS_AT_ONCE):  # a row's norm is its own: the same bits a block at a time
        rows = x[start : start + _ROWS_AT_ONCE]
        norms = np.linalg.norm(rows, axis=1, keepdims=True)  # (its squares: a copy of the rows it is given)
        np.divide(rows, norms, out=rows, where=norms > 0)
        rows[~(norms[:, 0] > 0)] = 0.0
    x -= x.mean(axis=0)
    return x


def _top_directions(held: list[npt.NDArray[np.float64]], k: int) -> npt.NDArray[np.float64]:
    """The ``k`` leading right singular vectors of the centred ``x`` ``(n, d)``, largest first, as columns;
    ``held`` is ``[x]``, emptied once ``x`` is no longer needed (its 338 MB are freed before the
    decomposition, which then works on the scatter matrix in place).

    Only the top ``k`` of the ``d × d`` scatter matrix's eigenpairs are computed (LAPACK's ``syevr``): the
    full decomposition of a 4,225-wide backbone's scatter took 7.1 s on one core, the top 1,024 5.3 s. With
    fewer images than features the ``n × n`` Gram matrix has the same non-zero spectrum and is decomposed
    instead (``v = xᵀu/√λ``): 0.8 s instead of 5.8 s for 2,000 images, as long as every kept direction has a
    clearly non-zero eigenvalue (else the scatter matrix's null space fills the rest, as before).
    """
    from scipy.linalg import eigh

    x = held[0]
    n, d = x.shape
    if k < n < d:
        gram = x @ x.T
        values, vectors = eigh(gram, subset_by_index=[n - k, n - 1], driver="evr")
        values, vectors = values[::-1], vectors[:, ::-1]
        if values[-1] > _RELATIVE_FLOOR * values[0] > 0:
            top = x.T @ (vectors / np.sqrt(values))
            q, r = np.linalg.qr(top)  # the columns are orthonormal up to rounding amplified by √(λ₁/λₖ)
            return q * np.sign(np.diag(r))
        del gram, values, vectors
    scatter = x.T @ x  # symmetric, both triangles (numpy computes xᵀx as such)
    del x
    held.clear()
    # Its transpose is the same matrix in Fortran order: LAPACK works on it in place instead of on a copy.
    _, vectors = eigh(scatter.T, subset_by_index=[d - k, d - 1], driver="evr", overwrite_a=True)
    return vectors[:, ::-1]


#: Rows normalised together: 34 MB of float64 squares for a 4,225-wide backbone, not a copy of all of them.
_ROWS_AT_ONCE = 1024
#: Images featurised together: a multiple of the per-example pass (64), so the featuriser's passes are the
#: ones it makes over all of a generator's images (the last one too: a short tail joins the block before).
_IMAGES_AT_ONCE = 1024


def _blocks(count: int) -> list[tuple[int, int]]:
    """``[start, stop)`` blocks of ``_IMAGES_AT_ONCE`` images covering ``count``; a last block shorter than
    one per-example pass (64) is merged into the one before."""
    starts = list(range(0, count, _IMAGES_AT_ONCE))
    if len(starts) > 1 and count - starts[-1] < 64:
        starts.pop()
    return [(a, b) for a, b in zip(starts, [*starts[1:], count], strict=True)]


#: Smallest eigenvalue kept on the Gram route, relative to the largest: below it a direction is rounding.
_RELATIVE_FLOOR = 1e-9


def is_basis(array: npt.NDArray[np.generic], dim: int) -> bool:
    """Whether ``array`` can be a public basis of at most ``dim`` directions: float32, finite, orthonormal
    columns (a cheap check of a cached file; the digest pinned in federation.yaml is the exact one)."""
    if array.dtype != np.float32 or array.ndim != 2 or not 0 < array.shape[1] <= min(dim, array.shape[0]):
        return False
    a = array.astype(np.float64)
    if not np.isfinite(a).all():
        return False
    return bool(np.abs(a.T @ a - np.eye(a.shape[1])).max() < 1e-3)


def basis_digest(basis: npt.NDArray[np.float32]) -> str:
    """SHA-256 of the basis (shape and float32 bytes): equal on every party that computed the same one."""
    b = np.ascontiguousarray(basis, dtype=np.float32)
    return hashlib.sha256(repr(b.shape).encode() + b.tobytes()).hexdigest()
