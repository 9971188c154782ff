"""Central Prom-PATE: prompted teachers vote on synthetic queries, a selection mechanism answers them within a
budget, and the library's student learns the answers.

The teachers (:mod:`capc_common.learn.prompts`) are a new *contribution*, not a new mechanism: their votes
form per-query histograms exactly like DIET-PATE heads' (one example moves one teacher, so one vote), and the
aggregation and accounting are the existing selection mechanism's (Confident-GNMax by default) through the
same Rényi-filter budget as ``capc dietpate run`` (:func:`~capc_common.privacy.plan_budget`): a
batch starts only if its worst case fits, and is charged its screening plus its actual answers. No new
accounting formula is involved; ``tests/mechanisms/test_prompate.py`` checks that the ε charged equals the
Confident-GNMax accountant's for the same queries and answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from capc_common.aggregation import MechanismNoise, check_histograms, mechanism_noise
from capc_common.errors import InputError
from capc_common.mechanisms.base import UNANSWERED, TrainedTeachers
from capc_common.mechanisms.pate import ConfidentGNMax
from capc_common.mechanisms.voters import PartyResources, PromptedVoter, Voter
from capc_common.privacy import plan_budget

if TYPE_CHECKING:
    from capc_common.learn.prompts import PromptedTeachers, PromptRecipe
    from capc_common.learn.student import StudentFit
    from capc_common.mechanisms.base import SelectionMechanism
    from capc_common.models import Backbone, FixedFront

__all__ = [
    "Answers",
    "PromPATE",
    "PromPATEResult",
    "answer_within_budget",
    "release_and_learn",
    "run_prom_pate",
]


class PromPATE(ConfidentGNMax):
    """Confident-GNMax over the votes of prompted teachers: the federation's Prom-PATE.

    Only what a party contributes changes — prompted teachers trained on its own shards
    (:meth:`train_teachers`) and voting on the query images (:class:`~capc_common.mechanisms.voters.
    PromptedVoter`); each still casts one vote per query, so the accounting, the noise, the 2PC and the
    ledger are Confident-GNMax's, inherited unchanged.

    Args:
        recipe: how every party trains its prompted teachers (federation.yaml's, so the hash covers it).
        **confident: :class:`ConfidentGNMax`'s arguments (classes, teachers, threshold, σ1, σ2, min_teachers).
    """

    name = "prom-pate"
    shares_fixed_front = False

    def __init__(self, *, recipe: PromptRecipe, **confident: Any) -> None:
        super().__init__(**confident)
        self.recipe = recipe

    def voter(self, party: PartyResources) -> Voter:
        """The party's prompted teachers, refused if trained on another backbone or recipe."""
        from capc_common.learn.prompts import PromptedTeachers  # torch: only the parties that vote pay for it

        teachers = PromptedTeachers.load(party.teachers_file, backbone=party.backbone, recipe=self.recipe)
        if teachers.classes != self.classes:
            raise InputError(
                f"{party.teachers_file} holds teachers over {teachers.classes} classes; the federation has "
                f"{self.classes}: retrain them"
            )
        return PromptedVoter(teachers)

    def train_teachers(
        self,
        backbone: Backbone,
        images: npt.NDArray[np.uint8],
        labels: npt.NDArray[np.int64],
        shards: Sequence[npt.NDArray[np.int64]],
        *,
        bn_batch: int,
        front: FixedFront | None = None,
    ) -> TrainedTeachers:
        """One prompted teacher per shard, each on its shard alone
        (:func:`~capc_common.learn.prompts.train_prompted_teachers`); the sanity figure is each teacher's
        accuracy on its own shard. ``front`` is not used: a prompt changes the images before the fixed
        front end (:attr:`shares_fixed_front` is False)."""
        from capc_common.learn.prompts import train_prompted_teachers

        teachers = train_prompted_teachers(
            backbone, images, labels, shards, classes=self.classes, bn_batch=bn_batch, recipe=self.recipe
        )
        voting = [(t, s) for t, s in enumerate(shards) if t not in teachers.abstaining]
        right = sum(int(np.sum(teachers.teacher(t).predict(images[s])[0] == labels[s])) for t, s in voting)
        rows = sum(len(s) for _, s in voting)
        return TrainedTeachers(
            save=teachers.save,
            train_accuracy=right / rows if rows else None,
            abstaining=teachers.abstaining,
        )


@dataclass(frozen=True)
class Answers:
    """What a budgeted run of a selection mechanism released.

    Attributes:
        labels: ``(queries,)`` released labels of the queries asked, −1 where unanswered.
        answered: how many were answered.
        epsilon: rigorous data-independent ε spent (at the filter's order, δ of the run).
        order: the Rényi filter's order (planned before the first query).
        rdp: RDP spent at that order.
    """

    labels: npt.NDArray[np.int64]
    answered: int
    epsilon: float
    order: float
    rdp: float

    @property
    def queries(self) -> int:
        """Queries asked (screened)."""
        return len(self.labels)


def answer_within_budget(
    histograms: npt.ArrayLike,
    *,
    mechanism: SelectionMechanism,
    epsilon: float,
    delta: float,
    batch: int = 256,
    noise: MechanismNoise | None = None,
    expected_answer_rate: float = 0.3,
) -> Answers:
    """Answer the queries in order, batch by batch, until the budget (or the histograms) run out.

    As the guardian does, a batch starts only if its worst case (every query answered) fits what remains;
    smaller batches (halving) are tried before stopping so the end of the budget is not wasted. The noise is
    drawn in the mechanism's canonical order from ``noise`` (CSPRNGs by default).

    Raises:
        InputError: malformed histograms, or a budget that cannot pay for one query.
    """
    hist = check_histograms(histograms, classes=mechanism.classes)
    if batch < 1:
        raise InputError(f"batch must be >= 1, got {batch}")
    budget = plan_budget(
        mechanism,
        epsilon=epsilon,
        delta=delta,
        expected_answer_rate=expected_answer_rate,
        smallest_batch=1,
    )
    noise = noise or mechanism_noise()
    labels: list[npt.NDArray[np.int64]] = []
    first = 0
    while first < len(hist):
        count = min(batch, len(hist) - first)
        while count > 1 and not budget.fits(count):
            count //= 2
        if not budget.fits(count):
            break
        part = hist[first : first + count]
        released = mechanism.answer(part, noise)
        budget.charge(part, released != UNANSWERED)
        labels.append(released)
        first += count
    out = np.concatenate(labels) if labels else np.zeros(0, np.int64)
    return Answers(
        labels=out,
        answered=int(np.sum(out != UNANSWERED)),
        epsilon=budget.epsilon,
        order=budget.filter.order,
        rdp=budget.filter.spent_rdp,
    )


@dataclass(frozen=True)
class PromPATEResult:
    """One Prom-PATE run: the teachers' histograms, what was released, and the student.

    Attributes:
        histograms: ``(Q, classes)`` votes of the prompted teachers on every query (reusable across budgets).
        answers: the budgeted release.
        student: the student trained on the answered queries (``None`` if nothing was answered).
    """

    histograms: npt.NDArray[np.int64]
    answers: Answers
    student: StudentFit | None


def release_and_learn(
    histograms: npt.ArrayLike,
    *,
    student_features: npt.ArrayLike,
    mechanism: SelectionMechanism,
    epsilon: float,
    delta: float,
    answer_batch: int = 256,
    noise: MechanismNoise | None = None,
    seed: int = 0,
) -> PromPATEResult:
    """Answer the teachers' votes within the budget and train the library's student on the answers.

    The votes are a deterministic function of the teachers and the public queries (computing them costs no
    privacy), so a caller may keep them and release them afresh at several budgets.

    Args:
        histograms: ``(Q, classes)`` votes on the queries, in query order.
        student_features: ``(Q, dim)`` the student's features of the same queries.
        mechanism: the selection mechanism (its ``classes`` are the histograms').
        epsilon: the budget ε.
        delta: δ.
        answer_batch: queries per budgeted batch.
        noise: both parties' noise sources (CSPRNGs by default; seeded only in tests).
        seed: the student's hold-out split and initialisation (public randomness).

    Raises:
        InputError: mismatched shapes, or a budget that cannot pay for one query.
    """
    from capc_common.learn.student import train_student

    hist = check_histograms(histograms, classes=mechanism.classes)
    feats = np.asarray(student_features, dtype=np.float32)
    if feats.ndim != 2 or feats.shape[0] != len(hist):
        raise InputError(
            f"student_features must be ({len(hist)}, dim) like the histograms, got {feats.shape}"
        )
    answers = answer_within_budget(
        hist, mechanism=mechanism, epsilon=epsilon, delta=delta, batch=answer_batch, noise=noise
    )
    done = answers.labels != UNANSWERED
    student = None
    if answers.answered:
        asked = feats[: answers.queries]
        student = train_student(
            asked[done],
            answers.labels[done],
            classes=mechanism.classes,
            unlabelled=asked[~done] if np.any(~done) else None,
            seed=seed,
        )
    return PromPATEResult(histograms=hist, answers=answers, student=student)


def run_prom_pate(
    teachers: PromptedTeachers,
    queries: npt.NDArray[np.uint8],
    *,
    student_features: npt.ArrayLike,
    mechanism: SelectionMechanism,
    epsilon: float,
    delta: float,
    vote_batch: int = 256,
    answer_batch: int = 256,
    noise: MechanismNoise | None = None,
    seed: int = 0,
) -> PromPATEResult:
    """The whole central Prom-PATE after training: the teachers vote, then :func:`release_and_learn`.

    Args:
        teachers: the prompted teachers (:func:`~capc_common.learn.prompts.train_prompted_teachers`).
        queries: uint8 synthetic query images ``(Q, H, W, C)`` (public).
        student_features: ``(Q, dim)`` the student's features of the same queries.
        mechanism: the selection mechanism (its ``classes`` must be the teachers').
        epsilon: the budget ε.
        delta: δ.
        vote_batch: the teachers' voting batch (BatchNorm chunks never cross it).
        answer_batch: queries per budgeted batch.
        noise: both parties' noise sources (CSPRNGs by default; seeded only in tests).
        seed: the student's hold-out split and initialisation (public randomness).

    Raises:
        InputError: mismatched classes or shapes, or a budget that cannot pay for one query.
    """
    if mechanism.classes != teachers.classes:
        raise InputError(f"the mechanism has {mechanism.classes} classes but the teachers {teachers.classes}")
    return release_and_learn(
        teachers.histograms(queries, batch=vote_batch),
        student_features=student_features,
        mechanism=mechanism,
        epsilon=epsilon,
        delta=delta,
        answer_batch=answer_batch,
        noise=noise,
        seed=seed,
    )
