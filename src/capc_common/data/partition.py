"""Split a dataset's indices into disjoint shards: one per teacher (DIET-PATE) or per party (CaPC).

Schemes:
    ``hash``: each example goes to the shard named by a keyed hash of its own content (label and image
        bytes), ``SHA-256(seed ‖ label ‖ image) mod shards``. Adding or removing one example changes exactly
        one shard and leaves every other shard untouched, so a guarantee stated for neighbouring datasets
        that differ by *adding or removing* one example holds end to end (one example moves one teacher).
        Shard sizes vary (multinomial) and a shard may be short or even empty — refusing then would make
        whether a party trains at all hinge on one example; its teacher abstains instead
        (:func:`capc_common.learn.short_shards`). Identical examples land in the same shard. The default
        for teachers.
    ``iid``: a seeded permutation cut into shards whose sizes differ by at most one. Adding or removing an
        example re-deals every shard, so with this scheme ε holds for the *replace-one* relation only.
    ``imbalanced``: every shard is class-imbalanced with the given ratio. Shard ``k`` favours class
        ``k mod C`` and its class weights fall geometrically, ``w_{k,c} = ratio^(-((c - k) mod C)/(C - 1))``,
        so its most and least frequent classes differ by ``ratio``; each class's examples are dealt to shards
        in proportion to these weights (largest remainders). The ratio is exact, up to rounding, when classes
        are balanced and ``shards`` is a multiple of ``C``.
    ``dirichlet``: the usual non-iid benchmark split (Hsu et al. 2019): for each class draw shard proportions
        from ``Dirichlet(alpha · 1)``; small ``alpha`` means each shard sees few classes. Draws are repeated
        (seeded) until no shard is empty.

:func:`site_part` splits one dataset between simulated *sites* (parties) the same way, by a second keyed
hash (its own domain, so a site's part and its teachers' shards are independent), and can keep only a fixed
fraction of a part: whether an example is selected depends on that example alone, never on how many others
there are or where it sits in the file, so adding or removing one example changes one site's set by exactly
that example. :func:`site_parts` returns every site's part at once, optionally class-skewed (a fixed
imbalance ratio, or Dirichlet class proportions drawn from the public seed): the hash range is cut at
thresholds that depend on the example's label, so the skew is a public function of ``(label, hash)`` and the
relation is still add/remove.

Every scheme is disjoint and covering (each index in exactly one shard) and a pure function of
``(labels, shards, scheme, seed, parameters)`` (``hash`` also of the images): the randomness is a seeded
``numpy.random.Generator`` or a seeded hash, as shard assignment is public, non-secret randomness.
:data:`NEIGHBOURING` names the neighbouring relation each scheme supports (reports and model cards state it).
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError

__all__ = [
    "HOLDOUT_CEILING",
    "HOLDOUT_FRACTION",
    "HOLDOUT_MINIMUM",
    "NEIGHBOURING",
    "PARTITION_SCHEMES",
    "holdout_fraction",
    "holdout_part",
    "partition",
    "site_part",
    "site_parts",
]

PARTITION_SCHEMES = ("hash", "iid", "imbalanced", "dirichlet")
#: The neighbouring relation under which one example moves one shard, per scheme.
#: ``imbalanced`` and ``dirichlet`` deal each class from one shared random stream, so a replacement that
#: changes a class's size re-deals every later class: they hold only for a same-label replacement.
NEIGHBOURING = {
    "hash": "add/remove one example",
    "iid": "replace one example",
    "imbalanced": "replace one example by one of the same label",
    "dirichlet": "replace one example by one of the same label",
}
_DIRICHLET_TRIES = 1000
#: Domain of the site split's hash key (the teacher shards' key is the bare 8-byte seed).
_SITE_DOMAIN = b"capc-site-part\x00"
#: Domain of a site's holdout hash key (independent of its part and of its teachers' shards).
_HOLDOUT_DOMAIN = b"capc-holdout\x00"
_HASH_RANGE = 1 << 64
#: Third word of the Dirichlet shares' generator seed ``(seed, class, stream)``: its own stream.
_DIRICHLET_STREAM = 0xD1C1


def _apportion(total: int, weights: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """Integer counts summing to ``total`` proportional to ``weights`` (largest-remainder rounding)."""
    exact = total * weights / weights.sum()
    counts = np.floor(exact).astype(np.int64)
    short = total - int(counts.sum())
    if short:
        order = np.argsort(-(exact - counts), kind="stable")
        counts[order[:short]] += 1
    return counts


def _content_hashes(
    images: npt.NDArray[np.generic], labels: npt.NDArray[np.int64], *, key: bytes
) -> list[int]:
    """Each example's ``SHA-256(key ‖ label ‖ image)``, first 8 bytes big-endian: a function of the example
    alone (and the public key)."""
    if images.shape[:1] != labels.shape:
        raise InputError(
            f"hash partition needs one image per label, got {images.shape[0]} images for {len(labels)}"
        )
    if len(labels) and int(labels.min()) < 0:
        raise InputError(f"labels must be class indices >= 0, got {int(labels.min())}")
    rows = np.ascontiguousarray(images).reshape(len(labels), -1)
    return [
        int.from_bytes(hashlib.sha256(key + int(lab).to_bytes(8, "big") + row.tobytes()).digest()[:8], "big")
        for lab, row in zip(labels, rows, strict=True)
    ]


def _hash_shards(
    images: npt.NDArray[np.generic], labels: npt.NDArray[np.int64], *, shards: int, seed: int
) -> list[npt.NDArray[np.int64]]:
    """Shard of each example: ``SHA-256(seed ‖ label ‖ image) mod shards`` (first 8 bytes, big-endian)."""
    hashes = _content_hashes(images, labels, key=int(seed).to_bytes(8, "big", signed=False))
    owner = np.fromiter((h % shards for h in hashes), dtype=np.int64, count=len(labels))
    order = np.argsort(owner, kind="stable")
    return [
        np.asarray(p, dtype=np.int64)
        for p in np.split(order, np.cumsum(np.bincount(owner, minlength=shards))[:-1])
    ]


def site_part(
    images: npt.ArrayLike,
    labels: npt.ArrayLike,
    *,
    part: int,
    parts: int,
    seed: int,
    fraction: float = 1.0,
) -> npt.NDArray[np.int64]:
    """Indices (ascending) of the examples in site ``part`` of ``parts``, keeping about ``fraction`` of them.

    With ``u = SHA-256("capc-site-part\\0" ‖ seed ‖ label ‖ image) / 2^64`` (first 8 bytes) an example is
    selected iff ``part ≤ u · parts < part + fraction``: the parts are disjoint, cover the dataset when
    ``fraction`` is 1, and each example's selection depends on that example only — adding or removing one
    example changes exactly one part by exactly that example, unlike a permutation (which re-deals every
    part) or a cut at a count (which evicts or admits another example). Part sizes vary (binomial).

    Args:
        images: the examples' images ``(N, ...)`` (their bytes are hashed).
        labels: their integer labels ``(N,)``.
        part: which part, in ``[0, parts)``.
        parts: how many sites share the dataset.
        seed: the split's public seed.
        fraction: the share of the part's hash range kept, in ``(0, 1]``.

    Raises:
        InputError: ``part`` outside ``[0, parts)``, ``fraction`` outside ``(0, 1]``, ``seed`` outside
            ``[0, 2^64)``, a negative label, or images and labels of different lengths.
    """
    if not 0 <= part < parts:
        raise InputError(f"site part {part} is outside [0, {parts})")
    if not 0 < fraction <= 1:
        raise InputError(f"fraction must be in (0, 1], got {fraction}")
    key = _site_key(seed)
    y = np.asarray(labels).astype(np.int64)
    if parts == 1 and fraction == 1:
        return np.arange(len(y), dtype=np.int64)
    low = part * _HASH_RANGE
    high = low + int(fraction * _HASH_RANGE)
    hashes = _content_hashes(np.asarray(images), y, key=key)
    return np.asarray([i for i, h in enumerate(hashes) if low <= h * parts < high], dtype=np.int64)


def holdout_part(
    images: npt.ArrayLike, labels: npt.ArrayLike, *, fraction: float, seed: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``(training, holdout)`` indices (ascending) of a site's examples: an example is held out iff
    ``SHA-256("capc-holdout\\0" ‖ seed ‖ label ‖ image) / 2^64 < fraction``.

    The holdout is what a party scores its models on after the federation (:mod:`capc_common.learn.personal`),
    so nothing of the federation may have seen it: the teachers and a release party train on the training
    indices only. Each example's side depends on that example and the public ``fraction`` alone — never on how
    many examples there are — so adding or removing one example changes the training part by at most that
    example, and the federation's neighbouring relation (add/remove one example) is untouched. That is why
    the fraction is a fixed public number of the site file rather than "at least 50 examples": a count-
    dependent fraction would move other examples between the two sides when one is added.

    Raises:
        InputError: ``fraction`` outside ``[0, 1)``, a seed out of range, a negative label, or images and
            labels of different lengths.
    """
    if not 0 <= fraction < 1:
        raise InputError(f"the holdout fraction must be in [0, 1), got {fraction}")
    y = np.asarray(labels).astype(np.int64)
    if fraction == 0:
        return np.arange(len(y), dtype=np.int64), np.zeros(0, dtype=np.int64)
    if not 0 <= seed < 2**64:
        raise InputError(f"the holdout's seed must be in [0, 2^64), got {seed}")
    key = _HOLDOUT_DOMAIN + int(seed).to_bytes(8, "big", signed=False)
    hashes = np.asarray(_content_hashes(np.asarray(images), y, key=key), dtype=np.uint64)
    held = hashes < np.uint64(int(fraction * _HASH_RANGE))
    return np.flatnonzero(~held).astype(np.int64), np.flatnonzero(held).astype(np.int64)


#: A site's holdout: this share of its examples, raised towards :data:`HOLDOUT_MINIMUM` examples for a
#: small site, but never above :data:`HOLDOUT_CEILING` (the rest must still be worth federating).
HOLDOUT_FRACTION = 0.1
HOLDOUT_MINIMUM = 50
HOLDOUT_CEILING = 0.25


def holdout_fraction(planned_examples: int) -> float:
    """The share of its examples a site holds out, from the number it *plans* to have (a public figure: the
    site file's, a layout's nominal size) — never from the data itself, whose exact count would make which
    examples are held out depend on the others (:func:`capc_common.data.holdout_part`).

    10 % by default; enough for about 50 examples at a small site, at most a quarter.
    """
    if planned_examples < 1:
        raise InputError(f"a site plans at least one example, got {planned_examples}")
    return min(HOLDOUT_CEILING, max(HOLDOUT_FRACTION, HOLDOUT_MINIMUM / planned_examples))


def _site_key(seed: int) -> bytes:
    """The site split's hash key: its domain and the 8-byte seed."""
    if not 0 <= seed < 2**64:
        raise InputError(f"the split's seed must be in [0, 2^64), got {seed}")
    return _SITE_DOMAIN + int(seed).to_bytes(8, "big", signed=False)


def site_parts(
    images: npt.ArrayLike,
    labels: npt.ArrayLike,
    *,
    parts: int,
    seed: int,
    imbalance_ratio: float | None = None,
    alpha: float | None = None,
) -> list[npt.NDArray[np.int64]]:
    """Every site's part at once (ascending indices), each example placed by its label and site hash alone.

    With ``h`` the hash of :func:`site_part` and no ``imbalance_ratio``, example ``i`` goes to the part ``k``
    with ``k·2^64 ≤ h·parts < (k+1)·2^64``: part ``k`` is exactly ``site_part(part=k, parts=parts)``. With an
    ``imbalance_ratio`` ``r``, an example of class ``c`` goes to part ``k`` with probability (over the hash)
    proportional to ``r^(−((c − k) mod parts)/(parts − 1))`` — the class's hash range is cut at thresholds
    that depend on ``c`` only — so part ``k`` favours the classes ``c ≡ k (mod parts)`` and, for balanced
    classes and as many parts as classes, its most and least frequent classes differ by ``r`` in expectation
    (the skew of :func:`partition`'s ``imbalanced`` scheme). With ``alpha``, class ``c``'s shares of the
    parts are one draw of ``Dirichlet(alpha · 1)`` from a generator seeded by ``(seed, c)`` — the usual
    non-iid benchmark split (Hsu et al. 2019), with proportions that depend on the public seed and the class
    only, never on the data (unlike :func:`partition`'s ``dirichlet``, which deals each class by count).
    Either way each example's part is a public function of ``(its label, its hash)``: adding or removing one
    example changes exactly one part, by that example (:data:`NEIGHBOURING` ``["hash"]``). Part sizes vary
    (multinomial); a part may be empty.

    Args:
        images: the examples' images ``(N, ...)`` (their bytes are hashed).
        labels: their integer labels ``(N,)``.
        parts: how many sites share the dataset (≥ 1).
        seed: the split's public seed, in ``[0, 2^64)``.
        imbalance_ratio: ``r ≥ 1`` for a class-skewed split; None (or 1) for a uniform one.
        alpha: Dirichlet concentration ``> 0`` for a class-skewed split (0.5: each part sees few classes, and
            part sizes vary too); not with ``imbalance_ratio``.

    Raises:
        InputError: fewer than one part, a ratio below 1 or not finite, an alpha not finite and positive or
            given with a ratio, a seed out of range, a negative label, or images and labels of different
            lengths.
    """
    if parts < 1:
        raise InputError(f"parts must be at least 1, got {parts}")
    if imbalance_ratio is not None and not (math.isfinite(imbalance_ratio) and imbalance_ratio >= 1):
        raise InputError(f"imbalance_ratio must be a finite number >= 1, got {imbalance_ratio}")
    if alpha is not None and not (math.isfinite(alpha) and alpha > 0):
        raise InputError(f"alpha must be a finite number > 0, got {alpha}")
    if alpha is not None and imbalance_ratio is not None:
        raise InputError("give imbalance_ratio or alpha, not both: they are two ways to skew the classes")
    y = np.asarray(labels).astype(np.int64)
    hashes = np.asarray(_content_hashes(np.asarray(images), y, key=_site_key(seed)), dtype=np.uint64)
    owner = np.empty(len(y), dtype=np.int64)
    for cls in np.unique(y):
        members = y == cls
        cuts = _thresholds(int(cls), parts, imbalance_ratio, _class_shares(int(cls), parts, alpha, seed))
        owner[members] = np.searchsorted(cuts, hashes[members], side="right")
    return [np.flatnonzero(owner == k).astype(np.int64) for k in range(parts)]


def _class_shares(cls: int, parts: int, alpha: float | None, seed: int) -> npt.NDArray[np.float64] | None:
    """Class ``cls``'s Dirichlet shares of the parts, drawn from the public ``(seed, cls)``; None without
    ``alpha``. Public, data-independent randomness (the split is public), hence a seeded NumPy generator."""
    if alpha is None:
        return None
    return np.random.default_rng([seed, cls, _DIRICHLET_STREAM]).dirichlet(np.full(parts, float(alpha)))


def _thresholds(
    cls: int, parts: int, ratio: float | None, shares: npt.NDArray[np.float64] | None = None
) -> npt.NDArray[np.uint64]:
    """The ``parts − 1`` cuts of class ``cls``'s hash range: part ``k`` holds ``[cut_{k−1}, cut_k)``; its
    width is ``shares[k]`` of the range when given, else set by the imbalance ``ratio`` (uniform without)."""
    if shares is None and ratio is not None and ratio != 1 and parts > 1:
        rank = (cls - np.arange(parts)) % parts
        shares = float(ratio) ** (-rank / (parts - 1))
    if shares is None:
        # ceil(k · 2^64 / parts): exactly site_part's test k·2^64 ≤ h·parts on integer hashes.
        cuts = [-(-k * _HASH_RANGE // parts) for k in range(1, parts)]
    else:
        edges = np.cumsum(shares / shares.sum())[:-1]
        cuts = [min(int(e * _HASH_RANGE), _HASH_RANGE - 1) for e in edges]
    return np.asarray(cuts, dtype=np.uint64)


def _deal_by_class(
    labels: npt.NDArray[np.int64],
    weights: npt.NDArray[np.float64],
    rng: np.random.Generator,
) -> list[npt.NDArray[np.int64]]:
    """Deal each class's (shuffled) indices to shards with counts proportional to ``weights[:, class]``."""
    shards = weights.shape[0]
    parts: list[list[npt.NDArray[np.int64]]] = [[] for _ in range(shards)]
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        counts = _apportion(len(members), weights[:, cls])
        for k, chunk in enumerate(np.split(members, np.cumsum(counts)[:-1])):
            parts[k].append(chunk)
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]


def partition(
    labels: npt.ArrayLike,
    *,
    shards: int,
    scheme: str = "iid",
    seed: int,
    imbalance_ratio: float | None = None,
    alpha: float | None = None,
    images: npt.ArrayLike | None = None,
) -> list[npt.NDArray[np.int64]]:
    """Split ``range(len(labels))`` into ``shards`` disjoint, covering, sorted index arrays.

    Args:
        labels: 1-D integer class labels (only their values matter).
        shards: number of shards (teachers); at most the number of examples, except for ``hash``.
        scheme: ``hash``, ``iid``, ``imbalanced`` or ``dirichlet`` (see the module docstring).
        seed: seed of the (public) shuffling randomness; the same seed gives the same shards.
        imbalance_ratio: for ``imbalanced``: most/least frequent class size within a shard, ≥ 1.
        alpha: for ``dirichlet``: concentration > 0 (0.1 very skewed, 100 nearly iid).
        images: for ``hash``: the examples' images ``(N, ...)`` (any dtype; their bytes are hashed).

    Returns:
        One int64 index array per shard.

    Raises:
        InputError: bad labels, more shards than examples (but for ``hash``), unknown scheme or a
            missing/invalid parameter.
    """
    y = np.asarray(labels)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise InputError(f"labels must be a 1-D integer array, got dtype {y.dtype} shape {y.shape}")
    if len(y) and y.min() < 0:
        raise InputError(f"labels must be non-negative class indices, found {int(y.min())}")
    y = y.astype(np.int64)
    if shards < 1:
        raise InputError(f"shards must be at least 1, got {shards}")
    if shards > len(y) and scheme != "hash":
        raise InputError(
            f"cannot split {len(y)} examples into {shards} non-empty shards; use at most {len(y)} shards"
        )
    if scheme not in PARTITION_SCHEMES:
        raise InputError(
            f"unknown partition scheme {scheme!r}; expected one of {', '.join(PARTITION_SCHEMES)}"
        )
    if scheme == "hash":
        if imbalance_ratio is not None or alpha is not None:
            raise InputError("scheme 'hash' takes neither imbalance_ratio nor alpha")
        if images is None:
            raise InputError("scheme 'hash' needs the images (each example's shard is a hash of its content)")
        return _hash_shards(np.asarray(images), y, shards=shards, seed=seed)
    rng = np.random.default_rng(seed)
    if scheme == "iid":
        if imbalance_ratio is not None or alpha is not None:
            raise InputError("scheme 'iid' takes neither imbalance_ratio nor alpha")
        return [np.sort(s).astype(np.int64) for s in np.array_split(rng.permutation(len(y)), shards)]
    classes = int(y.max()) + 1
    if scheme == "imbalanced":
        if imbalance_ratio is None or not np.isfinite(imbalance_ratio) or imbalance_ratio < 1:
            raise InputError(
                f"scheme 'imbalanced' needs imbalance_ratio >= 1 (most/least frequent class), got "
                f"{imbalance_ratio}"
            )
        if alpha is not None:
            raise InputError("scheme 'imbalanced' does not take alpha")
        rank = (np.arange(classes)[np.newaxis, :] - np.arange(shards)[:, np.newaxis]) % classes
        weights = float(imbalance_ratio) ** (-rank / max(classes - 1, 1))
        # Normalise per class over shards so a class's examples go where it is favoured.
        weights = weights / weights.sum(axis=0, keepdims=True)
        parts = _deal_by_class(y, weights, rng)
    else:
        if alpha is None or not np.isfinite(alpha) or alpha <= 0:
            raise InputError(f"scheme 'dirichlet' needs alpha > 0, got {alpha}")
        if imbalance_ratio is not None:
            raise InputError("scheme 'dirichlet' does not take imbalance_ratio")
        for _ in range(_DIRICHLET_TRIES):
            weights = rng.dirichlet(np.full(shards, float(alpha)), size=classes).T  # (shards, classes)
            parts = _deal_by_class(y, weights, rng)
            if min(len(p) for p in parts) > 0:
                break
        else:
            raise InputError(
                f"Dirichlet(alpha={alpha}) left a shard empty in {_DIRICHLET_TRIES} draws for {len(y)} "
                f"examples and {shards} shards; use fewer shards or a larger alpha"
            )
    if min(len(p) for p in parts) == 0:
        raise InputError(
            f"scheme {scheme!r} with {shards} shards left a shard empty for {len(y)} examples; "
            "use fewer shards"
        )
    return parts
