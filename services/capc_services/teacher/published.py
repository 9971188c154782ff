"""The federation's published student as a hospital reads it, and the features it reads images by.

Every mechanism's student is a linear head over the shared backbone's features, in one of two spaces that the
mechanism's family decides (so a site knows the space before the student is published):

* a **selection** mechanism's student (``student.safetensors``: a one-head
  :class:`~capc_common.learn.heads.HeadEnsemble` with its model card embedded) reads features computed with
  BatchNorm *current* statistics over chunks of the federation's ``bn_batch`` images, as the student was
  trained (:mod:`capc_services.student.publish`);
* a **release** mechanism's student (``head.npy`` beside its ``model_card.json``) reads L2-normalised
  per-example features (BatchNorm running statistics), as its parties contributed
  (:func:`capc_services.student.releases.publish_release`).

A student is checked against the site's own ``federation.yaml`` before anything is computed with it: its
card's config hash and backbone must be the federation's, so a student of another federation (or one
published before a membership change) is refused, never silently compared.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError
from capc_common.federation import FederationConfig, ReleaseMember

if TYPE_CHECKING:
    from capc_common.models import Backbone

#: What a student's output directory holds: a selection mechanism's student, or a release mechanism's head.
SELECTION_FILE, RELEASE_FILE, CARD_FILE = "student.safetensors", "head.npy", "model_card.json"
#: The smallest batch the selection student's card lets users query it with (current statistics).
MIN_BATCH = 16


@dataclass(frozen=True)
class PublishedStudent:
    """A published student, checked against the site's federation.

    Attributes:
        head: the linear head ``(classes, dim + 1)``, bias last, over the student's own features.
        card: its model card.
        path: the file it was read from.
        release: a release mechanism's student (per-example features) rather than a selection one's.
        mechanism: the mechanism that published it (federation.yaml's ``mechanism.name``).
    """

    head: npt.NDArray[np.float64]
    card: dict[str, Any]
    path: Path
    release: bool
    mechanism: str

    def describe(self) -> dict[str, Any]:
        """What a personal model's card says of the student it was compared with."""
        privacy = self.card.get("privacy", {})
        return {
            "path": str(self.path),
            "kind": "release" if self.release else "selection",
            "mechanism": self.mechanism,
            "config_hash": self.card.get("config_hash"),
            "epsilon": privacy.get("epsilon"),
            "delta": privacy.get("delta"),
        }


def default_student(site: Path, config: FederationConfig) -> Path:
    """Where the federation's student publishes when its site file lies beside this one (a ``capc local``
    federation, one operator): its ``output_dir``.

    Raises:
        InputError: no student site file beside ``site`` (a hospital of a real federation names the student
            it received with ``--student``).
    """
    from capc_services.student.settings import StudentSettings

    student_site = site.resolve().parent / f"{config.student}.yaml"
    if not student_site.is_file():
        raise InputError(
            f"no --student given, and no student site file {student_site} beside this site's: name the "
            f"published student with --student PATH ({SELECTION_FILE}, or {RELEASE_FILE} with its "
            f"{CARD_FILE}, or the directory the student published them in)"
        )
    return StudentSettings.load(student_site).output_dir


def load_published(path: Path, config: FederationConfig) -> PublishedStudent:
    """Read the student at ``path`` (a file, or the directory it was published in) and check that it belongs
    to ``config``'s federation.

    Raises:
        InputError: nothing published there yet, a file that is no student, a student of another
            federation (config hash) or backbone, or of another number of classes.
    """
    release = isinstance(config.mechanism, ReleaseMember)
    if path.is_dir():
        path = path / (RELEASE_FILE if release else SELECTION_FILE)
    if not path.is_file():
        raise InputError(
            f"no published student at {path}: the federation's student publishes it once its "
            f"{'releases are' if release else 'labelling is'} done (its progress says `published`); "
            "personalise after that"
        )
    if path.suffix == ".safetensors":
        head, card = _selection_student(path)
        kind = False
    elif path.suffix == ".npy":
        head, card = _release_student(path)
        kind = True
    else:
        raise InputError(f"{path} is not a published student ({SELECTION_FILE} or {RELEASE_FILE})")
    _check(card, config, path)
    if kind != release:
        raise InputError(
            f"{path} is a {'release' if kind else 'selection'} mechanism's student, but federation.yaml runs "
            f"{config.mechanism.name!r}"
        )
    if head.ndim != 2 or head.shape[0] != config.classes:
        raise InputError(
            f"{path} holds a head of shape {head.shape}; the federation has {config.classes} classes"
        )
    return PublishedStudent(head, card, path, release, config.mechanism.name)


def _selection_student(path: Path) -> tuple[npt.NDArray[np.float64], dict[str, Any]]:
    """A selection mechanism's student as a ``(classes, dim + 1)`` head and its embedded card."""
    from capc_common.learn.student import load_student

    ensemble, card = load_student(path)
    if ensemble.kind != "linear":
        raise InputError(f"{path} is a {ensemble.kind} student; only a linear head can be fine-tuned here")
    weights = ensemble.params["w_out"][0].double().numpy()
    bias = ensemble.params["b_out"][0].double().numpy()
    return np.concatenate([weights, bias[:, None]], axis=1), card


def _release_student(path: Path) -> tuple[npt.NDArray[np.float64], dict[str, Any]]:
    """A release mechanism's head and the model card published beside it."""
    card_path = path.with_name(CARD_FILE)
    try:
        head = np.load(path, allow_pickle=False)
        card = json.loads(card_path.read_text())
    except FileNotFoundError:
        raise InputError(
            f"{path} has no {CARD_FILE} beside it: copy the student's card with its head"
        ) from None
    except (OSError, ValueError) as exc:  # a truncated head, a card that is no JSON
        raise InputError(f"{path} or its {CARD_FILE} cannot be read ({exc}); copy them again") from None
    if not isinstance(card, dict) or not isinstance(head, np.ndarray) or head.dtype.kind != "f":
        raise InputError(f"{path} with its {CARD_FILE} is not a published release student")
    return np.asarray(head, dtype=np.float64), card


def _check(card: dict[str, Any], config: FederationConfig, path: Path) -> None:
    """Refuse a student of another backbone or federation (the backbone first: the plainer reason)."""
    named = card.get("backbone")
    backbone = named.get("sha256") if isinstance(named, dict) else None
    if backbone != config.backbone.sha256:
        raise InputError(
            f"{path} was trained on features of backbone {str(backbone)[:16]}…, but federation.yaml pins "
            f"{config.backbone.name} {config.backbone.sha256[:16]}…: it is another federation's student"
        )
    found, expected = card.get("config_hash"), config.config_hash()
    if found != expected:
        raise InputError(
            f"{path} was published by a federation of config hash {str(found)[:16]}…, but this site's "
            f"federation.yaml hashes to {expected[:16]}…: use the student of this federation (or the "
            "federation.yaml it was published under)"
        )


@dataclass(frozen=True)
class StudentSpace:
    """How the site turns images into the inputs the candidates read
    (:func:`capc_common.learn.personal.predict`): ``per-example`` (L2-normalised per-example features: the
    party's own heads), ``student`` (the student's own features) and, for the CNN from scratch, ``images``.

    A selection student's features have norms of about 50 (current statistics, not normalised), while the
    personal recipe's steps were tuned on features of norm 1: fine-tuned on them as they are, the head moved
    erratically (measured on 900 Fashion-MNIST images: holdout 0.90, 0.73, 0.71 for the three pull strengths
    and 80.1 % on the test set against the shared head's 82.8 %; scaled, 0.85, 0.82, 0.84 and 85.8 %). So
    they are divided by one number, :attr:`scale` (:meth:`fitted`), and the head multiplied by it: the same
    predictions, the recipe's geometry. The kept model is saved back in the student's unscaled space
    (:meth:`unscaled`).

    Attributes:
        backbone: the shared backbone.
        release: the student is a release mechanism's (its space is ``per-example``'s).
        bn_batch: the federation's BatchNorm chunk (a selection student's current statistics).
        scale: what the ``student`` features are divided by (1 for a release student).
    """

    backbone: Backbone
    release: bool
    bn_batch: int
    scale: float = 1.0

    @classmethod
    def of(cls, config: FederationConfig, backbone: Backbone) -> StudentSpace:
        """The space of ``config``'s student (its mechanism's family decides it)."""
        return cls(backbone, isinstance(config.mechanism, ReleaseMember), config.queries.bn_batch)

    def fitted(self, student: npt.NDArray[np.float32]) -> StudentSpace:
        """This space scaled by the mean L2 norm of the site's training part's ``student`` features (as
        :meth:`inputs` gave them), so that they have norm about 1; a release student's are normalised
        already."""
        norm = float(np.linalg.norm(student, axis=1).mean()) * self.scale if len(student) else 0.0
        return self if self.release or not norm > 0 else replace(self, scale=norm)

    def shared_head(self, student: PublishedStudent) -> npt.NDArray[np.float64]:
        """The student's head over the scaled features (its weights times :attr:`scale`).

        Raises:
            InputError: a head over features of another width than the backbone's.
        """
        head, dim = student.head, self.backbone.feature_dim
        if head.shape[1] != dim + 1:
            raise InputError(
                f"{student.path} holds a head over {head.shape[1] - 1}-d features, but the backbone gives "
                f"{dim}-d features: it is no student of this backbone"
            )
        return np.concatenate([head[:, :-1] * self.scale, head[:, -1:]], axis=1)

    def unscaled(self, model: Any) -> Any:
        """``model`` as it reads the student's own, unscaled features (a linear head of the ``student``
        space divided back; any other model as it is)."""
        from capc_common.learn.personal import LinearModel

        if not isinstance(model, LinearModel) or model.space != "student" or self.scale == 1.0:
            return model
        w = model.weights
        return LinearModel(np.concatenate([w[:, :-1] / self.scale, w[:, -1:]], axis=1), model.space)

    def inputs(
        self,
        images: npt.NDArray[np.uint8],
        *,
        name: str,
        with_images: bool,
        per_example: npt.NDArray[np.float32] | None = None,
    ) -> dict[str, npt.NDArray[Any]]:
        """The inputs of ``images``.

        Args:
            images: uint8 ``(N, H, W, C)``.
            name: how messages name them.
            with_images: keep the images (the CNN reads them).
            per_example: their per-example features, computed before (raw, not normalised).

        Raises:
            InputError: fewer images than a selection student may be queried with.
        """
        from capc_common.mechanisms import normalise
        from capc_common.mechanisms import per_example as per_example_of

        if per_example is None:
            per_example = per_example_of(self.backbone, images)
        normalised = normalise(per_example, dtype=np.float32)
        out: dict[str, npt.NDArray[Any]] = {"per-example": normalised}
        if self.release:
            out["student"] = normalised
        else:
            out["student"] = (self._current(images, name=name) / np.float32(self.scale)).astype(np.float32)
        if with_images:
            out["images"] = images
        return out

    def _current(self, images: npt.NDArray[np.uint8], *, name: str) -> npt.NDArray[np.float32]:
        """A selection student's features: current statistics over chunks of ``bn_batch`` images (fewer, but
        at least :data:`MIN_BATCH`, when there are fewer)."""
        from capc_common.models import extract_features

        if len(images) < MIN_BATCH:
            raise InputError(
                f"{name} holds {len(images)} images; the student reads images with current BatchNorm "
                f"statistics in batches of at least {MIN_BATCH} (its card's bn.min_batch): supply at least "
                f"{MIN_BATCH}"
            )
        chunk = min(self.bn_batch, len(images))
        return extract_features(self.backbone, images, bn_batch=chunk, mode="current")
