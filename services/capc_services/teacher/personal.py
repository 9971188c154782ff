"""``capc teacher personalise``: no hospital ends worse off (DESIGN §8).

After the federation has published, the site compares, on its holdout — the examples it kept out of
everything the federation saw (``holdout.fraction`` in its site file) — its best model **alone**, the
**shared** student and the student **personalised** (fine-tuned on the site's training part), and keeps the
best (:func:`capc_common.learn.personal.personalise`; the rule leans to alone). It writes the kept model and a
card saying what was compared: sizes, scores, the keep test, the recipe, the student.

Nothing of this leaves the site: no party is dialled, and the scores are written only beside the site's other
private files. They must stay there. A holdout accuracy is a function of the site's private examples with no
noise added; publishing it — or which model the site kept, or the scores of several sites side by side —
would tell others how the site's data relates to the shared model, outside any privacy guarantee
(docs/privacy.md, "The holdout and the personal model").
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from capc_common.errors import InputError
from capc_common.federation import FederationConfig, ReleaseMember
from capc_common.federation.site_data import dataset_findings, refuse
from capc_common.mechanisms.central import PER_EXAMPLE_PASS
from capc_services.teacher.published import (
    MIN_BATCH,
    StudentSpace,
    default_student,
    load_published,
)
from capc_services.teacher.settings import TeacherSettings
from capc_services.teacher.train import SiteExamples, record_features, site_examples

if TYPE_CHECKING:
    from capc_common.learn.personal import Personalised, PersonalRecipe, Split

#: What the site's operator is told, and what every personal model's card says.
STAYS_HERE = (
    "nothing of this left the site: the scores are noiseless functions of the site's private examples "
    "(publishing them, or which model was kept, would leak how its data relates to the shared model); keep "
    "them with the site's other private files"
)
MODEL_FILE, CARD_FILE = "model.npz", "model_card.json"


def personal_recipe(*, cnn: bool) -> PersonalRecipe:
    """The library's recipe, with or without the CNN from scratch among the alone candidates (without: the
    linear heads only, minutes faster on a large site)."""
    from capc_common.learn.personal import PersonalRecipe

    return PersonalRecipe() if cnn else PersonalRecipe(cnn=None)


def checked_examples(settings: TeacherSettings) -> SiteExamples:
    """The site's training part and holdout, refused unless both hold examples that fit the federation.

    Raises:
        InputError: an empty holdout or training part, or data of another image shape or classes.
    """
    examples = site_examples(settings)
    if not len(examples.holdout_labels):
        raise InputError(
            f"{settings.party}'s holdout is empty ({examples.name}; holdout.fraction "
            f"{settings.holdout.fraction:g} in its site file): there is nothing to compare the models on. "
            "A holdout must be kept out before the federation trains on the site's data — set "
            "holdout.fraction (e.g. 0.1) for the site's next federation"
        )
    if not len(examples.labels):
        raise InputError(f"{settings.party}'s training part is empty ({examples.name}): nothing to fit")
    config = settings.federation_config
    for images, labels, part in (
        (examples.images, examples.labels, "training part"),
        (examples.holdout_images, examples.holdout_labels, "holdout"),
    ):
        refuse(dataset_findings(images, labels, config=config, name=f"{examples.name} ({part})"))
    return examples


def site_split(
    settings: TeacherSettings, examples: SiteExamples, space: StudentSpace, *, cnn: bool
) -> tuple[Split, StudentSpace]:
    """The site's :class:`~capc_common.learn.personal.Split` in the candidates' inputs, and the student's
    space fitted to its training part (:meth:`StudentSpace.fitted`): the training part's per-example
    features from the site's records cache (what its federation party computed, if it kept them), the
    holdout's computed here and kept nowhere."""
    from capc_common.learn.personal import Split

    if not space.release and len(examples.holdout_labels) < MIN_BATCH:
        raise InputError(
            f"{settings.party}'s holdout holds {len(examples.holdout_labels)} images, but the student reads "
            f"images with current BatchNorm statistics in batches of at least {MIN_BATCH}: raise "
            f"holdout.fraction in the site file (now {settings.holdout.fraction:g}) for its next federation"
        )
    train = space.inputs(
        examples.images,
        name=f"{settings.party}'s training part",
        with_images=cnn,
        # the site's records cache, as its party featurised them (that pass needs a chunk of images)
        per_example=record_features(settings, space.backbone, examples.images)
        if len(examples.labels) >= PER_EXAMPLE_PASS
        else None,
    )
    fitted = space.fitted(train["student"])
    if fitted.scale != space.scale:
        train["student"] = (train["student"] * np.float32(space.scale / fitted.scale)).astype(np.float32)
    held = fitted.inputs(examples.holdout_images, name=f"{settings.party}'s holdout", with_images=cnn)
    split = Split(
        train,
        np.asarray(examples.labels, dtype=np.int64),
        held,
        np.asarray(examples.holdout_labels, dtype=np.int64),
    )
    return split, fitted


def load_evaluation(
    path: Path, config: FederationConfig
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """The labelled images of ``--evaluate FILE.npz`` (keys ``test_images``/``test_labels``, else
    ``images``/``labels``), refused unless they fit the federation — before anything is computed, not after
    the candidates were trained.

    Raises:
        InputError: an unreadable file, missing keys, another image shape, labels beyond the classes, or
            fewer images than a selection student reads at once.
    """
    from capc_common.data import load_npz

    dataset = load_npz(path, split="test" if "test_images.npy" in _members(path) else "train")
    if not len(dataset.labels):
        raise InputError(f"--evaluate {path} holds no images")
    if not isinstance(config.mechanism, ReleaseMember) and len(dataset.labels) < MIN_BATCH:
        raise InputError(
            f"--evaluate {path} holds {len(dataset.labels)} images; a selection mechanism's student reads "
            f"images with current statistics in batches of at least {MIN_BATCH}: supply at least {MIN_BATCH}"
        )
    refuse(dataset_findings(dataset.images, dataset.labels, config=config, name=f"--evaluate {path}"))
    return dataset.images, np.asarray(dataset.labels, dtype=np.int64)


def _members(path: Path) -> set[str]:
    """The arrays an ``.npz`` holds (empty for a file that is none: :func:`load_npz` says what is wrong)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return set(archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return set()


def scores(found: Personalised, inputs: dict[str, Any], labels: npt.NDArray[np.int64]) -> dict[str, float]:
    """Each candidate's accuracy on labelled inputs (the models as kept: the linear ones refitted on the
    whole site)."""
    from capc_common.learn.personal import CANDIDATES, predict

    return {name: float((predict(found.model(name), inputs) == labels).mean()) for name in CANDIDATES}


def _reads(found: Personalised, space: StudentSpace) -> str:
    """What the kept model reads, in words a user of the model needs."""
    from capc_common.learn.personal import LinearModel

    model = found.model("kept")
    if not isinstance(model, LinearModel):
        return "uint8 images (N, H, W, C), scaled by the pixel mean and std stored with the weights"
    if model.space == "per-example" or space.release:
        return (
            "L2-normalised per-example features of the shared backbone (BatchNorm running statistics), "
            "bias last"
        )
    return (
        f"features of the shared backbone with BatchNorm current statistics over chunks of {space.bn_batch} "
        f"images (at least {MIN_BATCH}), as the student reads them; bias last"
    )


def _model_arrays(found: Personalised, space: StudentSpace) -> tuple[str, dict[str, Any]]:
    """The kept model's kind and arrays (a linear head's weights over the features as :func:`_reads` names
    them, or the CNN's parameters and pixel scaling)."""
    from capc_common.learn.personal import LinearModel

    model = space.unscaled(found.model("kept"))
    if isinstance(model, LinearModel):
        return "linear", {"weights": model.weights}
    state = model.state()
    arrays = {f"cnn.{name}": value for name, value in state["weights"].items()}
    return "cnn", {**arrays, "mean": np.float64(state["mean"]), "std": np.float64(state["std"])}


def _write(path: Path, data: bytes) -> None:
    """``data`` to ``path`` whole or not at all (a temporary file, then a rename)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def save_personal(
    out: Path, found: Personalised, space: StudentSpace, card: dict[str, Any]
) -> tuple[Path, Path]:
    """Write the kept model (``model.npz``) and then its card (``model_card.json``, naming the model's
    SHA-256), each whole or not at all."""
    kind, arrays = _model_arrays(found, space)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    data = buffer.getvalue()
    card = {**card, "format": kind, "model_sha256": hashlib.sha256(data).hexdigest()}
    out.mkdir(parents=True, exist_ok=True)
    model_path, card_path = out / MODEL_FILE, out / CARD_FILE
    _write(model_path, data)
    _write(card_path, (json.dumps(card, indent=2) + "\n").encode())
    return model_path, card_path


def personalise_site(
    site: Path,
    *,
    student: Path | None = None,
    evaluate: Path | None = None,
    out: Path | None = None,
    cnn: bool = True,
    log: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Compare, keep and write the site's personal model; returns the report (``holdout``, ``evaluate``,
    ``kept``, sizes, paths).

    Everything that can be refused is checked before a feature is computed: the student (published, of this
    federation), the ``--evaluate`` file, the holdout.

    Args:
        site: the site file.
        student: the published student (a file or its directory; None: the student beside a local site).
        evaluate: a labelled ``.npz`` to score the three candidates on as well.
        out: where the kept model goes (None: ``personal/`` beside the site's heads file).
        cnn: try the CNN from scratch among the alone candidates.
        log: progress messages.

    Raises:
        InputError: no published student, one of another federation, a bad ``--evaluate`` file, an empty
            holdout, data that does not fit the federation.
    """
    from capc_common.federation import load_shared_backbone
    from capc_common.learn.personal import CANDIDATES, personalise
    from capc_common.threads import threads_limited

    settings = TeacherSettings.load(site)
    config = settings.federation_config
    published = load_published(student or default_student(site, config), config)
    evaluation = None if evaluate is None else load_evaluation(evaluate, config)
    examples = checked_examples(settings)
    recipe = personal_recipe(cnn=cnn)
    with threads_limited(settings.torch_threads):
        space = StudentSpace.of(config, load_shared_backbone(config))
        log(f"featurising {len(examples.labels)} training and {len(examples.holdout_labels)} held-out images")
        split, space = site_split(settings, examples, space, cnn=cnn)
        seed = settings.data.seed if settings.data is not None else 0
        shared = space.shared_head(published)
        found = personalise(split, classes=config.classes, shared=shared, recipe=recipe, seed=seed, log=log)
        evaluated = None
        if evaluation is not None and evaluate is not None:
            images, labels = evaluation
            inputs = space.inputs(images, name=f"--evaluate {evaluate}", with_images=cnn)
            evaluated = scores(found, inputs, labels)
    target = out or settings.heads.parent / "personal"
    holdout = {name: found.holdout[name] for name in CANDIDATES}
    sizes = {
        "training_part": len(examples.labels),
        "holdout": len(examples.holdout_labels),
        "evaluate": None if evaluation is None else len(evaluation[1]),
    }
    card = {
        "model": f"{settings.party}'s personal model: {found.kept}, kept on its own holdout",
        "party": settings.party,
        "federation": config.name,
        "config_hash": config.config_hash(),
        "kept": found.kept,
        "reads": _reads(found, space),
        "backbone": {"name": config.backbone.name, "sha256": config.backbone.sha256},
        "compared": {
            "holdout": found.holdout,
            "evaluate": None if evaluated is None else {"file": str(evaluate), **evaluated},
            "keep_test": found.detail["keep_test"],
            "settings": {"alone": found.detail["alone"], "personalised": found.detail["personalised"]},
            "note": "each candidate's setting was chosen on the holdout; a kept linear model was then "
            "refitted on the training part and the holdout together",
        },
        "sizes": sizes,
        "data": examples.name,
        "holdout": {
            "fraction": settings.holdout.fraction,
            "rule": "held out iff SHA-256('capc-holdout\\0' ‖ data.seed ‖ label ‖ image) / 2^64 < fraction",
        },
        "recipe": recipe.describe(),
        "student": published.describe(),
        "privacy": STAYS_HERE,
    }
    model_path, card_path = save_personal(target, found, space, card)
    return {
        "party": settings.party,
        "student": published.describe(),
        "holdout": holdout,
        "evaluate": evaluated,
        "kept": found.kept,
        "keep_test": found.detail["keep_test"],
        "alone": alone_text(found.detail["alone"]),
        "sizes": sizes,
        "cnn": cnn,
        "model": str(model_path),
        "model_card": str(card_path),
        "note": STAYS_HERE,
    }


def alone_text(detail: dict[str, Any]) -> str:
    """Which model alone won: ``linear head (standardised, l2 0.1)`` or ``CNN from scratch``."""
    return "CNN from scratch" if detail["kind"] == "cnn" else f"linear head ({detail['head']})"


def _why_kept(report: dict[str, Any]) -> str:
    """Why the kept candidate: where it and alone disagree on the holdout, how often each was right, and the
    sign test's p-value (:func:`capc_common.learn.personal.keep`)."""
    test = report["keep_test"].get(report["kept"])
    if test is None:
        return "no other candidate was right significantly more often where it and alone disagree"
    return (
        f"{100 * test['gain']:+.1f} points over alone on the holdout: right on {test['wins']} of the images "
        f"where they disagree, alone on {test['losses']}; sign test p = {test['p_value']:.2g}"
    )


def report_text(report: dict[str, Any]) -> str:
    """The report for the site's operator."""
    student, sizes, evaluated = report["student"], report["sizes"], report["evaluate"]
    where = f"{sizes['holdout']} held-out images ({sizes['training_part']} in the training part"
    if evaluated is not None:
        where += f"; --evaluate: {sizes['evaluate']} images"
    epsilon = "ε not stated" if student["epsilon"] is None else f"ε {student['epsilon']:.3g}"
    lines = [
        f"{report['party']}: the {student['mechanism']} student ({epsilon}) against the site's own models, "
        f"on {where})",
        f"  {'':<14}{'holdout':>9}" + (f"{'evaluate':>10}" if evaluated is not None else ""),
    ]
    for name, accuracy in report["holdout"].items():
        line = f"  {name:<14}{100 * accuracy:>7.1f} %"
        if evaluated is not None:
            line += f"{100 * evaluated[name]:>8.1f} %"
        if name == "alone":
            line += (
                f"   ({report['alone']}{'' if report['cnn'] else '; --no-cnn: no CNN from scratch tried'})"
            )
        lines.append(line)
    lines += [
        f"kept: {report['kept']} ({_why_kept(report)})",
        f"  model {report['model']}",
        f"  card  {report['model_card']}",
        report["note"],
    ]
    return "\n".join(lines)
