"""The learning recipe of secure-aggregation DP-SGD: what the parties compute their gradients over and how the
student steps on the noisy sums.

Measured on Fashion-MNIST's validation split (docs/mechanisms.md, "A learning recipe"), the optimiser and the
features' geometry limited the head far more than the privacy noise did (the old recipe scored 85.6 % with
the noise off, 85.5 % with it on, at ε 3). The recipe, each step charged or free:

1. **A public subspace** (free): each party's L2-normalised features are projected on the top principal
   directions of the backbone's features on synthetic images (:mod:`~capc_common.mechanisms.basis`); fewer
   coordinates, less noise.
2. **Standardised from a DP release** (charged as one round): the first release is the noisy sum of the
   projected features, of their squares and the record count (:meth:`SecureDPSGD.statistics_contribution`:
   the same sensitivity as a gradient round). The student centres every coordinate and scales it by its
   standard deviation (floored at the median variance, so coordinates the noise dominates are not blown
   up), then rescales so a record's features have norm about 1. The map is public (post-processing) and
   travels to the parties with the head.
3. **Adam on the student's side** (post-processing) on ``noisy sum / (q · noisy count)``.

The published head maps back to the L2-normalised features of the backbone (``(classes, dim + 1)``), the one
model form every release mechanism publishes. The same object serves both sides: a party calls
:meth:`DPSGDTrainer.prepare` once and :meth:`DPSGDTrainer.contribute` per round; the student calls
:meth:`~DPSGDTrainer.state` before and :meth:`~DPSGDTrainer.absorb` after each release. The central runner
drives exactly these calls, so a federation with seeded noise publishes its head bit for bit.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError
from capc_common.mechanisms.dpsgd import SecureDPSGD, record_squares
from capc_common.mechanisms.prototypes import normalise

if TYPE_CHECKING:
    from capc_common.privacy import NoiseSource

__all__ = ["DPSGDTrainer", "FeatureMap", "Recipe", "standardiser"]

#: The state's first value: the round to come is the statistics release (0) or a gradient round (1).
_STATISTICS, _GRADIENT = 0.0, 1.0


@dataclass(frozen=True)
class Recipe:
    """How the head is trained (post-processing except ``rounds`` and ``statistics``, which are releases).

    Attributes:
        rounds: gradient rounds (each one release).
        statistics: release the features' noisy sums first and standardise them (one more release).
        optimizer: ``adam`` or ``momentum`` (heavy ball), applied by the student to the noisy mean gradient.
        learning_rate: step size.
        momentum: heavy-ball momentum, or Adam's β1.
        beta2: Adam's β2.
        adam_eps: Adam's ε (next to the noise of a mean gradient coordinate, it keeps noise-only coordinates
            from taking full steps).
        variance_floor: added to each coordinate's variance, as a multiple of the median variance.
        expected_batch: the normaliser of the noisy sum without a statistics release (``q · N``, public).
        step_noise: heavy ball only: the step follows the noise instead of being fixed, so that each
            round's noisy mean gradient, times the step, carries noise of this σ on each weight:
            ``min(learning_rate, step_noise · N / σ)``, ``N`` the released count (or ``expected_batch``),
            ``σ`` the noise on each coordinate of the sum (a release and public parameters:
            post-processing). Why: the best step follows the noise on the mean gradient (``σ / N``):
            Fashion-MNIST's 50,000 records at ε 3 want ``lr · C`` near 30, digits' 1,400 at z 8 near 1
            (docs/mechanisms.md, "A step that follows the noise").
        unit_variance: standardise every coordinate to unit variance, instead of also dividing by the root
            of the expected squared norm (records of norm about 1): with a clip well below the records'
            norm, every per-example gradient is clipped and the step reads as a sum of directions.
    """

    rounds: int
    statistics: bool = True
    optimizer: Literal["adam", "momentum"] = "adam"
    learning_rate: float = 0.3
    momentum: float = 0.9
    beta2: float = 0.999
    adam_eps: float = 1e-4
    variance_floor: float = 1.0
    expected_batch: float | None = None
    step_noise: float | None = None
    unit_variance: bool = False

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise InputError(f"a recipe needs at least one gradient round, got {self.rounds}")
        if not self.statistics and not (self.expected_batch and self.expected_batch > 0):
            raise InputError(
                "without a statistics release the noisy sum is normalised by expected_batch (q · N): set it"
            )
        if self.optimizer not in ("adam", "momentum"):
            raise InputError(f"optimizer must be adam or momentum, got {self.optimizer!r}")
        if self.step_noise is not None and not (self.step_noise > 0 and self.optimizer == "momentum"):
            raise InputError(
                f"step_noise sets a heavy-ball step and must be > 0 (got {self.step_noise!r} with optimizer "
                f"{self.optimizer!r}): use optimizer momentum, or leave step_noise unset"
            )

    @property
    def releases(self) -> int:
        """Releases the recipe makes: the gradient rounds, plus one for the statistics."""
        return self.rounds + int(self.statistics)


@dataclass(frozen=True)
class FeatureMap:
    """Raw per-example features → the head's input: L2-normalise, project, centre, scale.

    Attributes:
        basis: ``(feature_dim, k)`` orthonormal columns, or ``None`` (no projection, ``k = feature_dim``).
        mean: ``(k,)`` subtracted after the projection.
        scale: ``(k,)`` positive divisors.
    """

    basis: npt.NDArray[np.float32] | None
    mean: npt.NDArray[np.float64]
    scale: npt.NDArray[np.float64]

    def project(self, features: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """L2-normalised rows on the basis: each row's norm stays at most 1 (up to rounding; what a record
        adds is clipped by the norm of the very row it is given, so rounding never loosens a clip).

        The product is taken in float32, the basis's own precision, then widened: half the time of a float64
        product (measured on one core, 20,000 records of 3,969 features onto 1,024 directions: 2.0 s
        against 4.2 s) for a difference of a few float32 ulps per coordinate (up to 3e-7 where a coordinate
        is near 1).
        """
        return np.asarray(self.projected(features), dtype=np.float64)

    def projected(
        self, features: npt.ArrayLike, *, consume: bool = False
    ) -> npt.NDArray[np.float64] | npt.NDArray[np.float32]:
        """:meth:`project`'s values in the precision they were computed in: float32 on a basis (half the
        memory of the float64 rows holding the same values), float64 without one.

        ``consume``: the caller hands ``features`` over (a writeable float32 array it no longer reads): on a
        basis they are normalised in place, the same bits, so the raw features are held once at the peak
        rather than twice (a party of 17,941 records of 4,225 features: 289 MB less).
        """
        if self.basis is None:
            return normalise(features)
        x = np.asarray(features)
        writeable = consume and x.dtype == np.float32 and x.flags.writeable and x.flags.c_contiguous
        return normalise(x, dtype=np.float32, out=x if writeable else None) @ self.basis

    def standardise(self, projected: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Centre and scale projected rows."""
        return (projected - self.mean) / self.scale

    def head(self, weights: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """A head over the standardised features as the same function of the L2-normalised raw features.

        ``w·(Pᵀx − m)/s + b = (w/s)Pᵀ·x + (b − (w/s)·m)``.
        """
        w = weights[:, :-1] / self.scale
        bias = weights[:, -1] - w @ self.mean
        raw = w if self.basis is None else w @ self.basis.T.astype(np.float64)
        return np.concatenate([raw, bias[:, None]], axis=1)


def standardiser(
    sums: npt.NDArray[np.float64],
    squares: npt.NDArray[np.float64],
    count: float,
    *,
    floor: float,
    noise: float = 0.0,
    unit_variance: bool = False,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """``(mean, scale)`` from a statistics release (post-processing), robust to its noise.

    ``noise`` is the σ of each released sum (public: the mechanism's), so ``τ = noise / count`` is the noise
    of each mean and second-moment coordinate. The mean is shrunk towards 0 by the positive-part James–Stein
    factor ``1 − k τ² / ‖mean‖²`` (a small federation's noisy mean would shift every record); each variance
    gets ``floor × median variance + 3τ`` added, so coordinates the noise dominates are not blown up. The
    scale also divides by the root of the expected squared norm, so a standardised record has norm about 1
    whatever the dimension (the clip is in those units), unless ``unit_variance``. A count the noise made
    tiny is read as 1.
    """
    n = max(float(count), 1.0)
    tau = noise / n
    mean = sums / n
    energy = float(mean @ mean)
    mean = mean * (max(0.0, 1.0 - mean.size * tau**2 / energy) if energy > 0 else 0.0)
    variance = np.maximum(squares / n - mean**2, 0.0)
    pad = floor * float(np.median(variance)) + 3.0 * tau
    if not pad > 0:
        pad = 1e-12
    sd = np.sqrt(variance + pad)
    if unit_variance:
        return mean, sd
    spread = max(float(np.sqrt(np.sum(variance / (variance + pad)))), 0.3)
    return mean, sd * spread


def _identity(mean: npt.NDArray[np.float64], scale: npt.NDArray[np.float64]) -> bool:
    """Whether the map ``(mean, scale)`` changes nothing (no statistics release)."""
    return not (mean.any() or (scale != 1).any())


def _mapped(
    x: npt.NDArray[np.float64] | npt.NDArray[np.float32],
    mean: npt.NDArray[np.float64],
    scale: npt.NDArray[np.float64],
) -> npt.NDArray[np.float64]:
    """Records centred by ``mean`` and divided by ``scale``, as a new array (``x`` stays as it is).

    A student's map that overflows some records (a scale of 1e-310) must not switch the party from
    contributing to refusing (that switch would depend on the records): such a record becomes the zero
    feature vector instead, inside the same clipped sensitivity.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        out = x - mean
        out /= scale
    overflowed = ~np.isfinite(out).all(axis=1)
    if overflowed.any():
        out[overflowed] = 0.0
    return out


class DPSGDTrainer:
    """Secure-aggregation DP-SGD by the recipe: the parties' contributions and the student's state.

    Args:
        mechanism: the per-release mechanism over the ``k``-dimensional head input.
        recipe: rounds, statistics, optimiser.
        basis: the public basis, or a function computing it on first use (only a party that contributes and
            the student that publishes need it; the guardian never does), or ``None`` for no projection.
    """

    def __init__(
        self,
        mechanism: SecureDPSGD,
        recipe: Recipe,
        *,
        basis: npt.NDArray[np.float32] | Callable[[], npt.NDArray[np.float32]] | None,
    ) -> None:
        self.mechanism = mechanism
        self.recipe = recipe
        self._basis = basis
        k = mechanism.dim
        self.weights = np.zeros((mechanism.classes, k + 1))
        self.mean = np.zeros(k)
        self.scale = np.ones(k)
        self.normaliser = recipe.expected_batch or 1.0
        self.learning_rate = self._learning_rate()
        self.done = 0
        self._m = np.zeros_like(self.weights)
        self._v = np.zeros_like(self.weights)
        #: A party's full batch on the last map it was sent: (its prepared records, the map's bytes, them
        #: mapped). See :meth:`_on_map`.
        self._mapped: tuple[npt.NDArray[Any], bytes, npt.NDArray[np.float64]] | None = None
        #: The last full batch's records and their squared norms. See :meth:`_squares`.
        self._squared: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]] | None = None
        #: The immutable arrays this trainer made and handed out, by id (weakly: gone with the array).
        self._made: weakref.WeakValueDictionary[int, npt.NDArray[np.float64]] = weakref.WeakValueDictionary()

    def _learning_rate(self) -> float:
        """The recipe's step, or with ``step_noise`` the one adding that much noise to each weight."""
        r, m = self.recipe, self.mechanism
        if r.step_noise is None:
            return r.learning_rate
        sigma = m.sigma / m.fixed_point.scale  # each coordinate of the decoded sum
        return min(r.learning_rate, r.step_noise * self.normaliser / sigma)

    @property
    def rounds(self) -> int:
        """Releases in all (what the ledger is charged for)."""
        return self.recipe.releases

    @property
    def basis(self) -> npt.NDArray[np.float32] | None:
        """The public basis (computed on first use when given as a function)."""
        if callable(self._basis):
            self._basis = self._basis()
        if self._basis is not None and self._basis.shape[1] != self.mechanism.dim:
            raise InputError(f"the basis has {self._basis.shape[1]} columns, the head {self.mechanism.dim}")
        return self._basis

    @property
    def projects(self) -> bool:
        """Whether the records are projected on a public basis (computed on first use, or adopted)."""
        return self._basis is not None

    def adopt_basis(self, basis: npt.NDArray[np.float32], *, feature_dim: int) -> None:
        """Use ``basis``, computed elsewhere (a party's featurising process), instead of computing it here:
        checked as a cached basis is (:func:`~capc_common.mechanisms.basis.is_basis`), and against the
        backbone's ``feature_dim`` (its rows) and the head (its columns), so a wrong one is refused here
        rather than failing, or projecting wrongly, at the first release.

        Raises:
            InputError: the trainer projects on no basis, or ``basis`` is not a float32 ``(feature_dim, k)``
                array of orthonormal, finite columns for this head's ``k``.
        """
        from capc_common.mechanisms.basis import is_basis

        if self._basis is None:
            raise InputError("this trainer projects on no public basis")
        expected = (feature_dim, self.mechanism.dim)
        if basis.dtype != np.float32 or basis.shape != expected:
            raise InputError(
                f"the basis handed over is {basis.dtype} of shape {basis.shape}; the backbone's "
                f"{feature_dim} features and the head's {self.mechanism.dim} columns need float32 of shape "
                f"{expected}"
            )
        if not is_basis(basis, self.mechanism.dim):
            raise InputError("the basis handed over does not have orthonormal, finite columns")
        self._basis = basis

    def _map(self, mean: npt.NDArray[np.float64], scale: npt.NDArray[np.float64]) -> FeatureMap:
        return FeatureMap(self.basis, mean, scale)

    # ----------------------------------------------------------------------------------------- party side
    def prepare(
        self, features: npt.ArrayLike, *, consume: bool = False
    ) -> npt.NDArray[np.float64] | npt.NDArray[np.float32]:
        """A party's records on the basis, once (the projection is the costly step; rounds reuse it).
        Immutable: every round reads the same records, and :meth:`_on_map` keys its cache by this object.
        Kept in float32 on a basis (:meth:`FeatureMap.projected`): every use widens them to the float64
        values :meth:`FeatureMap.project` gives, exactly, and a party holds 4 bytes a coordinate, not 8.
        ``consume``: ``features`` are handed over and may be overwritten (:meth:`FeatureMap.projected`)."""
        return self._immutable(self._map(self.mean, self.scale).projected(features, consume=consume))

    def contribute(
        self,
        state: npt.NDArray[np.float64],
        prepared: npt.NDArray[np.float64] | npt.NDArray[np.float32],
        labels: npt.NDArray[np.int64],
        source: NoiseSource,
    ) -> npt.NDArray[np.int64]:
        """A party's contribution to the release ``state`` announces, over its Poisson sample.

        Raises:
            InputError: a state of another length, phase, or a mean or scale that is not finite (or a
                scale not positive): checks of the public state only, never of the records.
        """
        k, m = self.mechanism.dim, self.mechanism
        expected = 1 + 2 * k + self.weights.size
        if state.shape != (expected,):
            raise InputError(f"a {m.name} state has {expected} values, got shape {state.shape}")
        phase, mean, scale = state[0], state[1 : 1 + k], state[1 + k : 1 + 2 * k]
        rows = m.sample(len(labels), source)
        every = len(rows) == len(labels)  # q = 1: every record, used in place (no copy per round)
        x, y = (prepared, labels) if every else (prepared[rows], labels[rows])
        if phase == _STATISTICS:
            return m.statistics_contribution(x)
        if phase != _GRADIENT:
            raise InputError(f"a {m.name} state's phase must be 0 or 1, got {phase!r}")
        if not (np.isfinite(mean).all() and np.isfinite(scale).all() and (scale > 0).all()):
            raise InputError(f"a {m.name} state's mean must be finite and its scale finite and positive")
        mapped: npt.NDArray[np.float64] = x  # type: ignore[assignment]  # float64 unless mapped below
        if not _identity(mean, scale):  # the identity map (no statistics release) copies nothing
            mapped = self._on_map(prepared, mean, scale) if every else _mapped(x, mean, scale)
        elif x.dtype != np.float64:  # float32 records on the basis: widened, exactly, once for the records
            # this trainer prepared (immutable), every round for a caller's own
            own = every and self._made.get(id(prepared)) is prepared
            mapped = self._on_map(prepared, mean, scale) if own else np.asarray(x, dtype=np.float64)
        weights = state[1 + 2 * k :].reshape(self.weights.shape)
        return m.contribution(weights, mapped, y, squares=self._squares(mapped) if every else None)

    def _squares(self, records: npt.NDArray[np.float64]) -> npt.NDArray[np.float64] | None:
        """The full batch's squared norms (and finiteness check), once per batch rather than every round.

        Measured: the check and the norms were two of a round's four passes over 20,000 records of 1,024
        coordinates (115 ms a round against 64 ms). Kept only for the immutable arrays this trainer made
        (:meth:`prepare`'s, :meth:`_on_map`'s: the very objects), keyed by the array held, so the norms a
        record is clipped by are its own; None (computed by the contribution) for any other array, such as a
        copy of them or the caller's own.
        """
        if self._made.get(id(records)) is not records:
            return None
        cached = self._squared
        if cached is None or cached[0] is not records:
            self._squared = None
            self._squared = cached = (records, record_squares(records))
        return cached[1]

    def _immutable(self, records: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """``records`` as an array that nothing can change in place (it reads them through a read-only
        buffer: numpy refuses to write to it or make it writeable again; no copy, so a party's records are
        held once, not twice at their peak), noted as this trainer's own for :meth:`_squares`. The caller
        hands ``records`` over: it keeps no reference of its own."""
        records = np.ascontiguousarray(records)
        view = memoryview(records).toreadonly()  # type: ignore[arg-type]  # numpy arrays export buffers
        frozen = np.frombuffer(view, dtype=records.dtype).reshape(records.shape)
        self._made[id(frozen)] = frozen
        return frozen

    def _on_map(
        self,
        prepared: npt.NDArray[np.float64] | npt.NDArray[np.float32],
        mean: npt.NDArray[np.float64],
        scale: npt.NDArray[np.float64],
    ) -> npt.NDArray[np.float64]:
        """The full batch on the map ``(mean, scale)``, computed once per map and records.

        When a round takes every record (full batch), every gradient round sends the map the statistics
        release set, so mapping the records (a copy and a divide: half a round's work for 20,000 records of
        1,024 coordinates) is paid once instead of every round. The cache is keyed by the records' object
        (held, so its identity cannot be reused; :meth:`prepare` returns it immutable, so it cannot change in
        place) and the map's exact bytes: another map or other records compute it again. It holds one
        party's batch: a trainer shared by several parties (the central runner) maps each call, as before.
        ``contribution`` only reads it.
        """
        key = mean.tobytes() + scale.tobytes()
        cached = self._mapped
        if cached is None or cached[0] is not prepared or cached[1] != key:
            # one mapped batch held at a time (its norms too), also while the next is computed
            self._mapped = self._squared = None
            fresh = (
                np.asarray(prepared, dtype=np.float64)
                if _identity(mean, scale)
                else _mapped(prepared, mean, scale)
            )
            mapped = self._immutable(fresh)  # shared by every round
            self._mapped = cached = (prepared, key, mapped)
        return cached[2]

    # --------------------------------------------------------------------------------------- student side
    def state(self) -> npt.NDArray[np.float64]:
        """What the parties need for the next release: its phase, the feature map's centre and scale, the
        head."""
        phase = _STATISTICS if self.recipe.statistics and self.done == 0 else _GRADIENT
        return np.concatenate([[phase], self.mean, self.scale, self.weights.ravel()])

    def absorb(self, total: npt.NDArray[np.int64]) -> None:
        """Fold one revealed noisy total in: the statistics, or one optimiser step."""
        r, m = self.recipe, self.mechanism
        if r.statistics and self.done == 0:
            sums, squares, count = m.statistics(total)
            self.mean, self.scale = standardiser(
                sums, squares, count, floor=r.variance_floor, noise=m.statistics_sigma,
                unit_variance=r.unit_variance,
            )  # fmt: skip
            # The statistics release is over the same Poisson sample as a round: its count already
            # estimates a round's expected batch q·N.
            self.normaliser = max(count, 1.0)
            self.learning_rate = self._learning_rate()
        else:
            grad = m.gradient(total) / self.normaliser
            step = self.done - int(r.statistics) + 1
            if r.optimizer == "adam":
                self._m = r.momentum * self._m + (1 - r.momentum) * grad
                self._v = r.beta2 * self._v + (1 - r.beta2) * grad * grad
                m_hat = self._m / (1 - r.momentum**step)
                v_hat = self._v / (1 - r.beta2**step)
                self.weights = self.weights - self.learning_rate * m_hat / (np.sqrt(v_hat) + r.adam_eps)
            else:
                self._m = r.momentum * self._m + grad
                self.weights = self.weights - self.learning_rate * self._m
        self.done += 1

    def head(self) -> npt.NDArray[np.float64]:
        """The head so far over the L2-normalised raw features ``(classes, feature_dim + 1)``."""
        return self._map(self.mean, self.scale).head(self.weights)
