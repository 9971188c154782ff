"""The run report: JSON figures, the student's model card, and the two plots a person wants to see.

Files in the output directory: ``report.json``; ``labels.npz`` (``label``: the released label of every query
asked, in stream order, −1 where unanswered; ``batch_end``: cumulative query count after each batch);
``student.safetensors`` + ``student.card.json``; ``accuracy_vs_epsilon.png``; with ``diagnostics`` also
``consensus-NOT-PRIVATE.png``.

JSON keys (stable; others rely on them): ``student_accuracy``, ``mean_teacher_accuracy``,
``best_teacher_accuracy``, ``queries``, ``answered``, ``epsilon`` (the guarantee: the Rényi filter's limit),
``epsilon_spent`` (the realised data-independent charge at the filter's order: an odometer, not a guarantee),
``delta``, ``epsilon_data_dependent`` (PATE-2018, UNSANITISED: depends on the private histograms),
``seconds`` (per stage and total), plus details (``ensemble_accuracy``, ``curve``, ...).

What is not differentially private says so: the teachers' own accuracies (``not_private``), and, only with
``diagnostics``, the figures computed from the noiseless votes (``diagnostics_NOT_PRIVATE``).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from capc_common.data.partition import NEIGHBOURING
from capc_common.mechanisms import UNANSWERED
from capc_common.privacy.claims import CURRENT_STATISTICS, FILTER_GUARANTEE, FILTER_ODOMETER, accountant

if TYPE_CHECKING:
    from capc_common.dietpate.config import RunConfig
    from capc_common.dietpate.pipeline import Prepared, QueryLog

__all__ = ["finish_report", "finite", "plot_consensus", "plot_curve", "write_json"]

UNSANITISED = (
    "PATE-2018 data-dependent ε computed from the private vote histograms; it is not itself differentially "
    "private (no smooth sensitivity applied) and is reported for comparison with the literature only"
)
NOT_PRIVATE_TEACHERS = (
    "NOT PRIVATE: mean_teacher_accuracy, best_teacher_accuracy and ensemble_accuracy (and their lines in "
    "accuracy_vs_epsilon.png) evaluate the teachers without noise; research figures, never publish them with "
    "the student. The DP outputs are the released labels and the student"
)
NOT_PRIVATE_VALIDATION = (
    "; student_accuracy and the curve's accuracies too: they are measured on the validation hold-out of the "
    "protected training data, and choosing anything by them is a release no epsilon here accounts for "
    "(Papernot & Steinke 2022)"
)
NOT_PRIVATE_DIAGNOSTICS = (
    "NOT PRIVATE: computed from the noiseless vote histograms of the private teachers (--diagnostics); "
    "research figures, never publish them"
)


def _neighbouring(cfg: RunConfig) -> str:
    """The relation the run's ε holds for. ``dataset.validation`` and ``train_limit`` cut the training set by
    a seeded permutation of its *size*: adding or removing one example re-draws the cut and moves many
    shards, and replacing one under ``hash`` can move two teachers (twice the sensitivity the charge
    assumes), so such a development run states no per-example relation."""
    cut = cfg.dataset.validation or cfg.dataset.train_limit is not None
    if cut and cfg.teachers.partition == "hash":
        return "none per example (dataset.validation/train_limit cut the data by position: development only)"
    return NEIGHBOURING[cfg.teachers.partition]


def finite(value: float | None) -> float | None:
    """``None`` for a missing or non-finite number (JSON has no infinity)."""
    return None if value is None or not math.isfinite(value) else float(value)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as indented JSON, atomically."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2, sort_keys=False)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def plot_curve(
    path: Path, curve: list[dict[str, Any]], *, mean_teacher: float, ensemble: float, title: str
) -> None:
    """Student accuracy against the guaranteed ε (each point's filter limit), with the mean single teacher and
    the noiseless ensemble (NOT PRIVATE: research lines)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    if curve:
        ax.plot(
            [c["epsilon_target"] for c in curve],
            [c["student_accuracy"] for c in curve],
            "o-",
            label="student",
        )
    ax.axhline(
        mean_teacher,
        color="tab:gray",
        ls="--",
        label=f"mean single teacher ({mean_teacher:.3f}, NOT PRIVATE)",
    )
    ax.axhline(
        ensemble, color="tab:green", ls=":", label=f"teacher ensemble, no noise ({ensemble:.3f}, NOT PRIVATE)"
    )
    ax.set_xlabel("guaranteed ε (the Rényi filter's limit, δ fixed)")
    ax.set_ylabel("accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_consensus(
    path: Path,
    query_top: npt.NDArray[np.float64],
    answered: npt.NDArray[np.bool_],
    eval_top: npt.NDArray[np.float64],
    *,
    threshold_fraction: float | None,
    title: str,
) -> None:
    """Histogram of teacher consensus (top vote / teachers) on queries, answered or not, and on real data:
    computed from the noiseless votes, so drawn only for ``diagnostics`` and titled NOT PRIVATE."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bins = np.linspace(0, 1, 41).tolist()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.hist(
        [query_top[answered], query_top[~answered]],
        bins=bins,
        stacked=True,
        label=["synthetic, answered", "synthetic, unanswered"],
        color=["tab:blue", "tab:orange"],
        density=False,
    )
    ax2 = ax.twinx()
    ax2.hist(eval_top, bins=bins, histtype="step", color="tab:green", label="real evaluation data")
    ax2.set_ylabel("real images")
    if threshold_fraction is not None:
        ax.axvline(threshold_fraction, color="k", ls="--", label="threshold T / teachers")
    ax.set_xlabel("consensus: top vote count / number of teachers")
    ax.set_ylabel("synthetic queries")
    ax.set_title(f"NOT PRIVATE (noiseless votes): {title}", fontsize=9)
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    names = ax.get_legend_handles_labels()[1] + ax2.get_legend_handles_labels()[1]
    ax.legend(handles, names, loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _diagnostics(
    report: dict[str, Any],
    prep: Prepared,
    *,
    qlog: QueryLog,
    eval_hist: npt.NDArray[np.int64],
    title: str,
) -> list[str]:
    """Add the figures of the noiseless votes to ``report`` under ``diagnostics_NOT_PRIVATE`` (and draw their
    plot, ``consensus-NOT-PRIVATE.png``, when plots are on); returns the files written."""
    cfg = prep.config
    teachers = cfg.teachers.count
    labels = qlog.labels
    answered = labels != UNANSWERED
    plurality = qlog.histograms.argmax(axis=1) if len(labels) else np.zeros(0, np.int64)
    report["diagnostics_NOT_PRIVATE"] = {
        "note": NOT_PRIVATE_DIAGNOSTICS,
        "label_agreement_with_plurality": float(np.mean(labels[answered] == plurality[answered]))
        if answered.any()
        else None,
        "query_consensus_mean": float(np.mean(qlog.histograms.max(axis=1)) / teachers)
        if len(labels)
        else None,
    }
    if not cfg.plots:
        return []
    m = cfg.mechanism
    path = Path(cfg.output) / "consensus-NOT-PRIVATE.png"
    plot_consensus(
        path,
        qlog.histograms.max(axis=1) / teachers if len(labels) else np.zeros(0),
        answered,
        eval_hist.max(axis=1) / teachers,
        threshold_fraction=m.threshold / teachers
        if m.name == "confident-gnmax" and m.threshold is not None
        else None,
        title=title,
    )
    return [str(path)]


def finish_report(
    prep: Prepared,
    *,
    qlog: QueryLog,
    curve: list[dict[str, Any]],
    per_teacher: npt.NDArray[np.float64],
    eval_hist: npt.NDArray[np.int64],
    timings: dict[str, float],
    extra: dict[str, Any],
    save_student: Callable[[Path, dict[str, Any]], list[str]] | None,
    noise_kind: str,
    details: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Assemble the report, save the student with its model card, draw the plots, write ``report.json``.

    ``noise_kind`` says where the run's noise came from (the system CSPRNG, or a seeded stream).
    """
    cfg = prep.config
    out = Path(cfg.output)
    budget = prep.budget
    teachers = cfg.teachers.count
    labels = qlog.labels
    answered = labels != UNANSWERED
    eval_plurality = eval_hist.argmax(axis=1)
    ensemble_accuracy = float(np.mean(eval_plurality == prep.evaluation.labels))
    final = curve[-1]["student_accuracy"] if curve else None
    eps_dd = budget.epsilon_data_dependent(cfg.budget.delta)
    m = cfg.mechanism
    report: dict[str, Any] = {
        "name": cfg.name,
        "method": cfg.method,
        "seed": cfg.seed,
        "student_accuracy": final,
        "mean_teacher_accuracy": float(per_teacher.mean()),
        "best_teacher_accuracy": float(per_teacher.max()),
        "ensemble_accuracy": ensemble_accuracy,
        "queries": len(labels),
        "answered": int(answered.sum()),
        "epsilon": cfg.budget.epsilon,
        "epsilon_note": FILTER_GUARANTEE,
        "epsilon_spent": budget.epsilon,
        "epsilon_spent_note": FILTER_ODOMETER,
        "delta": cfg.budget.delta,
        "neighbouring": _neighbouring(cfg),
        "epsilon_data_dependent": finite(eps_dd),
        "epsilon_data_dependent_note": UNSANITISED,
        "accountant": accountant(prep.mechanism),
        "accounting": budget.summary(),
        "stop_reason": qlog.stop_reason,
        "evaluated_on": prep.evaluation.name,
        "evaluation_size": len(prep.evaluation.labels),
        "teachers": teachers,
        "classes": prep.classes,
        "mechanism": m.model_dump(exclude={"noise_seed"}),
        "noise": noise_kind,
        "not_private": NOT_PRIVATE_TEACHERS
        + (NOT_PRIVATE_VALIDATION if cfg.dataset.evaluate_on == "validation" else ""),
        "curve": curve,
        **extra,
        **(details or {}),
        "seconds": {**{k: round(v, 3) for k, v in timings.items()}, "total": round(sum(timings.values()), 3)},
    }
    # The released labels are DP outputs (public to the student): kept for comparison with a federation.
    np.savez(out / "labels.npz", label=labels, batch_end=np.asarray(qlog.batch_ends, np.int64))
    files: list[str] = [str(out / "labels.npz")]
    if save_student is not None and final is not None:
        card = {
            "model": "DIET-PATE student" if cfg.method == "diet-pate" else "PATE (no public data) student",
            "dataset": cfg.dataset.name,
            "classes": prep.classes,
            "class_names": list(prep.train.class_names),
            "privacy": {
                **{k: report[k] for k in ("epsilon", "epsilon_note", "epsilon_spent", "epsilon_spent_note")},
                "delta": cfg.budget.delta,
                "accountant": report["accountant"],
                "neighbouring": report["neighbouring"],
                "order": budget.filter.order,
                "noise": noise_kind,
            },
            "teachers": teachers,
            "queries": {
                "generator": cfg.queries.generator,
                "seed": cfg.queries.seed,
                "asked": len(labels),
                "answered": int(answered.sum()),
            },
            "mechanism": report["mechanism"],
            "accuracy": {"value": final, "on": prep.evaluation.name},
            "inference": {
                "bn_mode": cfg.backbone.bn_mode,
                "min_batch": cfg.student.eval_bn_batch,
                "note": CURRENT_STATISTICS
                if cfg.backbone.bn_mode == "current"
                else "running statistics: each image's prediction depends on that image alone",
            },
        }
        files += save_student(out, card)
    title = f"{cfg.dataset.name}, {teachers} teachers, {cfg.queries.generator}"
    if cfg.plots:
        plot_curve(
            out / "accuracy_vs_epsilon.png",
            curve,
            mean_teacher=float(per_teacher.mean()),
            ensemble=ensemble_accuracy,
            title=title,
        )
        files.append(str(out / "accuracy_vs_epsilon.png"))
    if cfg.diagnostics:
        files += _diagnostics(report, prep, qlog=qlog, eval_hist=eval_hist, title=title)
    report["files"] = [*files, str(out / "report.json")]
    write_json(out / "report.json", report)
    return report
