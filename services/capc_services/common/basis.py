"""The federation's public basis as the file a party's feature cache reads: what a coordinator ships.

Secure-aggregation DP-SGD projects every party's features on a public basis computed from synthetic images.
Computing it is the largest thing a party does: torch and the backbone, 10,000 synthetic images' features in
float64 and their 4,225² scatter matrix, about 1,000 MB at once, where the rest of a teacher's work peaks near
540 MB. The basis is public and ``federation.yaml`` pins its SHA-256 (``mechanism.projection.sha256``), so the
coordinator computes it once (:func:`basis_file`) and each hospital and the student put the file in the
directory their site file's ``feature_cache:`` names: a party reads it there by its name instead of computing
it, and checks it against the pin exactly as one it computed (a file of other values is refused).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError, IntegrityError
from capc_common.models.cache import FeatureCache  # torch: only where a basis is computed or read
from capc_common.models.features import extract_features

if TYPE_CHECKING:
    from capc_common.federation import FederationConfig
    from capc_common.models.backbone import Backbone


@dataclass(frozen=True)
class BasisFile:
    """A federation's public basis stored as a party's feature cache reads it.

    Attributes:
        path: the file (``array-….npy`` in the directory given).
        pin: the basis's digest, what ``mechanism.projection.sha256`` pins (or should pin).
        file_sha256: the file's own SHA-256 (``sha256sum``), to check a copy of it.
        computed: computed here (False: it was in the directory already).
        pinned: whether ``federation.yaml`` pins the basis (False: nothing checks a party's copy).
    """

    path: Path
    pin: str
    file_sha256: str
    computed: bool
    pinned: bool


class _BasisOnly(FeatureCache):
    """A feature cache that stores named arrays (the basis) but not the features of the images they are made
    from: the directory a coordinator ships from gets the 16 MB basis, not 170 MB of synthetic images'
    features no party reads. (A chunk's features are the same bits computed alone or through a cache.)"""

    def extract(
        self, backbone: Backbone, images: npt.NDArray[np.uint8], *, bn_batch: int, mode: str = "current"
    ) -> npt.NDArray[np.float32]:
        return extract_features(backbone, images, bn_batch=bn_batch, mode=mode)


def basis_file(config: FederationConfig, directory: Path) -> BasisFile:
    """The federation's public basis in ``directory``: read if it is there, else computed into it (the only
    file written there besides a lock file), checked against ``federation.yaml``'s pin either way.

    Raises:
        InputError: the mechanism is not secure-aggregation DP-SGD or projects on no basis.
        IntegrityError: the basis is not the one ``federation.yaml`` pins (computed here: another machine
            type or software version than the one that pinned it; read: a file of other values).
    """
    from capc_common.federation import SecAggDPSGDMechanism, load_shared_backbone
    from capc_common.federation.releases import Featuriser, federation_basis
    from capc_common.mechanisms.basis import basis_digest

    mechanism = config.mechanism
    if not isinstance(mechanism, SecAggDPSGDMechanism):
        raise InputError(
            f"federation {config.name!r} runs {mechanism.name!r}: only secagg-dpsgd projects its parties' "
            "features on a public basis; there is no basis to ship"
        )
    if mechanism.projection is None:
        raise InputError(
            f"federation {config.name!r} sets no mechanism.projection: its parties train on the backbone's "
            "own features; there is no basis to ship"
        )
    if mechanism.projection.sha256 is None and any(directory.glob("array-*.npy")):
        raise InputError(
            f"federation.yaml pins no basis, and {directory} already holds array files: the pin to add must "
            "come from a basis computed here, not from a file found there; give an empty --out directory"
        )
    cache = _BasisOnly(directory)
    q = config.queries
    featuriser = Featuriser(load_shared_backbone(config), (q.height, q.width, q.channels), cache)
    before = set(directory.glob("array-*.npy"))
    try:
        basis = federation_basis(mechanism.projection, featuriser=featuriser)
    except IntegrityError as exc:
        if cache.computed:  # not the pinned basis: leave no file a party could be sent
            for path in set(directory.glob("array-*.npy")) - before:
                path.unlink()
            raise
        raise IntegrityError(
            f"the public basis stored in {directory} is not the one federation.yaml pins "
            f"(mechanism.projection.sha256 {mechanism.projection.sha256}): if its array-*.npy file was "
            "altered, remove it and run again to compute the basis; if the pin is in doubt, an empty --out "
            "directory computes the basis and shows whether this machine agrees with it"
        ) from exc
    pin = basis_digest(basis)
    path = _holding(directory, pin)
    return BasisFile(
        path=path,
        pin=pin,
        file_sha256=_file_sha256(path),
        computed=bool(cache.computed),
        pinned=mechanism.projection.sha256 is not None,
    )


def _holding(directory: Path, pin: str) -> Path:
    """The one array file in ``directory`` that holds the basis of digest ``pin`` (its name is the one a
    party's cache looks the basis up by: the cache named it)."""
    from capc_common.mechanisms.basis import basis_digest

    found = []
    for path in sorted(directory.glob("array-*.npy")):
        try:
            stored = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError, EOFError):  # another array, truncated: not the basis
            continue
        if basis_digest(stored) == pin:
            found.append(path)
    if len(found) != 1:
        raise InputError(
            f"{directory} holds {len(found)} files of the basis {pin[:16]}… "
            f"({', '.join(p.name for p in found)}); give an empty --out directory"
        )
    return found[0]


def _file_sha256(path: Path) -> str:
    """``sha256sum`` of a file."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
