"""``capc teacher train``: a teacher party trains its own heads on its own data.

The party's examples (its ``data:`` section: a named dataset, or its own ``npz:``/``folder:``/``idx:``
files, optionally one hash-selected part of a shared dataset when several sites are simulated), less its
holdout (``holdout.fraction``, kept out for ``capc teacher personalise``), are split
into as many disjoint shards as the party has teacher heads in federation.yaml, each example by a keyed
hash of its own content (so adding or removing one example changes one shard). Then the federation's
mechanism trains one teacher per shard on that shard alone
(:meth:`~capc_common.mechanisms.SelectionMechanism.train_teachers`): PATE heads by the library's one
training path (the central pipeline's), Prom-PATE's prompted teachers by
:func:`~capc_common.learn.prompts.train_prompted_teachers` — so one example can move one vote only. A head
whose shard is shorter than one BatchNorm chunk abstains (a fixed, data-independent vote) instead of the
party refusing to train: whether a party takes part must not hinge on one example (docs/privacy.md).
Nothing leaves the site.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from capc_common.data import holdout_part, load_dataset, partition, site_part
from capc_common.data.checksum import dataset_file, verify_file
from capc_common.errors import InputError
from capc_common.federation import load_shared_backbone, mechanism_of
from capc_common.federation.site_data import class_name_problem, dataset_findings, label_problem, refuse
from capc_common.threads import threads_limited
from capc_services.teacher.settings import TeacherSettings

if TYPE_CHECKING:
    from capc_common.models import Backbone, FixedFront


def _mount_hint(dataset: str) -> str:
    """Why a site's data may be missing in a container: ``docker run -v`` mounts a missing host directory
    as an empty one, so the file's directory exists but holds nothing."""
    kind, sep, location = dataset.partition(":")
    path = Path(location if sep and kind in ("npz", "folder", "idx") else dataset)
    if path.exists() or not path.is_absolute():
        return ""
    directory = path.parent
    if directory.is_dir() and any(directory.iterdir()):
        return ""
    state = "is empty" if directory.is_dir() else "does not exist"
    return (
        f". The directory {directory} {state}: in a container, mount the host directory holding the data "
        f"there with --mount type=bind,src=HOST_DIR,dst={directory},readonly (which refuses a missing "
        "HOST_DIR, where -v silently mounts an empty directory)"
    )


@dataclass(frozen=True)
class SiteExamples:
    """A site's labelled examples, divided into the training part the federation sees and the holdout it
    never sees (:func:`site_examples`).

    Attributes:
        images / labels: the training part.
        holdout_images / holdout_labels: the holdout.
        name: a description (dataset, part, fraction, the share held out).
    """

    images: np.ndarray
    labels: np.ndarray
    holdout_images: np.ndarray
    holdout_labels: np.ndarray
    name: str


def site_examples(settings: TeacherSettings) -> SiteExamples:
    """The site's examples (its part and fraction applied), divided into training part and holdout.

    The part, the fraction and the holdout select each example by keyed hashes of its own content
    (:func:`~capc_common.data.site_part`, :func:`~capc_common.data.holdout_part` with ``data.seed`` and the
    site file's ``holdout.fraction``), so adding or removing one example of the file changes this site's
    training part or its holdout by that example alone, and no other site's.

    Raises:
        InputError: no ``data:`` section, a shard outside ``[0, shards)``, or class names other than the
            federation's (:func:`~capc_common.federation.site_data.class_name_problem`).
        IntegrityError: the dataset's file is not the one ``data.sha256`` pins.
    """
    data = settings.data
    if data is None:
        raise InputError(
            f"site file of {settings.party} has no `data:` section; add e.g. "
            "`data: {dataset: npz:/data/site.npz}` pointing at the site's own labelled images"
        )
    if not 0 <= data.shard < data.shards:
        raise InputError(f"data.shard {data.shard} is outside [0, {data.shards})")
    try:
        file = dataset_file(data.dataset)
        if data.sha256 is not None and file is not None:  # DataSettings pins a checksum to one file only
            verify_file(file, data.sha256)
        dataset = load_dataset(data.dataset, split="train")
    except InputError as exc:
        raise InputError(f"{exc}{_mount_hint(data.dataset)}") from None
    problem = class_name_problem(dataset.class_names, config=settings.federation_config, name=dataset.name)
    if problem:
        raise InputError(problem)
    index = site_part(
        dataset.images,
        dataset.labels,
        part=data.shard,
        parts=data.shards,
        seed=data.seed,
        fraction=data.fraction,
    )
    images, labels = dataset.images[index], dataset.labels[index]
    fraction = settings.holdout.fraction
    train, held = holdout_part(images, labels, fraction=fraction, seed=data.seed)
    name = f"{dataset.name} shard {data.shard}/{data.shards}"
    if data.fraction < 1:
        name += f" (fraction {data.fraction:g})"
    if fraction > 0:
        name += f", {100 * fraction:g} % held out"
    return SiteExamples(images[train], labels[train], images[held], labels[held], name)


def party_examples(settings: TeacherSettings) -> tuple[np.ndarray, np.ndarray, str]:
    """The site's training images and labels — its examples less its holdout — and a description: what
    every path into the federation reads (heads, a release party's records and contributions, a kNN voter's
    records, the records cache, preflight's data checks), so a held-out example never reaches it.

    Raises:
        InputError: as :func:`site_examples`.
    """
    found = site_examples(settings)
    return found.images, found.labels, found.name


def record_features(
    settings: TeacherSettings, backbone: Backbone, images: np.ndarray, *, front: FixedFront | None = None
) -> np.ndarray:
    """Per-example features of the site's records ``images`` (:func:`party_examples`), read back from its
    own records cache (``records_cache:`` in its site file) when it featurised the same records before;
    ``front``: their fixed front end, computed before."""
    from capc_common.dietpate.cache import FeatureCache
    from capc_common.learn import BackboneFeaturizer
    from capc_common.mechanisms.central import extract_per_example

    cache = None if settings.records_cache is None else FeatureCache(settings.records_cache)
    return extract_per_example(BackboneFeaturizer(backbone, front=front), images, cache=cache)


def check_labels(labels: np.ndarray, *, classes: int, name: str) -> None:
    """Refuse labels the federation has no class for (the kNN voter checks the records it votes with).

    Raises:
        InputError: a label ``≥ classes``.
    """
    problem = label_problem(labels, classes=classes, name=name)
    if problem:
        raise InputError(problem)


def train_party_heads(settings: TeacherSettings) -> dict[str, Any]:
    """Train and save the party's heads (atomically, to ``settings.heads``); returns a summary.

    On ``settings.torch_threads`` threads for this call only: the caller's thread limits are restored after.

    Raises:
        InputError: bad data section, or data that does not fit the federation (its image size, its
            classes: the checks preflight runs). A shard too short for a head is no error: that head abstains.
    """
    with threads_limited(settings.torch_threads):
        return _train_party_heads(settings)


def _train_party_heads(settings: TeacherSettings) -> dict[str, Any]:
    """:func:`train_party_heads` within its thread limits."""
    config = settings.federation_config
    heads = config.teacher(settings.party).heads
    start = time.perf_counter()
    examples = site_examples(settings)  # the training part; the holdout stays out of everything below
    images, labels, name = examples.images, examples.labels, examples.name
    # preflight's checks first: data of another size is converted (the backbone is pinned), not trained on.
    # No refusal on the count per head: a short shard's head abstains (its fixed vote), so whether the party
    # trains never depends on one example.
    refuse(dataset_findings(images, labels, config=config, name=name))
    shards = partition(labels, shards=heads, scheme="hash", seed=config.queries.seed, images=images)
    mechanism, backbone = mechanism_of(config), load_shared_backbone(config)
    # A site with a records cache also keeps its records' per-example features (what a release mechanism,
    # Private-kNN or the site alone needs: the same hospital in another federation on this machine reads them
    # back). Both featurisations share the scattering, most of their cost: it is computed once.
    front = None
    if settings.records_cache is not None and mechanism.shares_fixed_front:
        from capc_common.models import FixedFront

        front = FixedFront.of(backbone, images)
    trained = mechanism.train_teachers(
        backbone,
        images,
        np.asarray(labels, dtype=np.int64),
        shards,
        bn_batch=config.queries.bn_batch,
        front=front,
    )
    settings.heads.parent.mkdir(parents=True, exist_ok=True)
    trained.save(settings.heads)
    if front is not None:
        record_features(settings, backbone, images, front=front)
    train_accuracy = trained.train_accuracy
    seconds = time.perf_counter() - start
    accuracy = "no head votes" if train_accuracy is None else f"train accuracy {train_accuracy:.3f}"
    abstain = ""
    if trained.abstaining:
        abstain = (
            f"; {len(trained.abstaining)} head(s) abstain (shard under one BatchNorm chunk of "
            f"{config.queries.bn_batch}: a fixed vote; `capc federation plan` proposes a head count)"
        )
    return {
        "party": settings.party,
        "heads": heads,
        "examples": len(labels),
        "held_out": len(examples.holdout_labels),
        "data": name,
        "train_accuracy": train_accuracy,
        "abstaining": len(trained.abstaining),
        "seconds": round(seconds, 2),
        "path": str(settings.heads),
        "summary": f"{heads} heads on {len(labels)} examples of {name}, {accuracy}, {seconds:.1f} s{abstain}",
    }
