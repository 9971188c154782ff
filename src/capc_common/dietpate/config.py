"""``run.yaml``: everything a central DIET-PATE (or PATE-baseline) run needs, validated before any work.

One frozen pydantic model per section; unknown keys are refused so a typo never silently falls back to a
default. :func:`load_config` turns any validation problem into an :class:`~capc_common.errors.InputError`
that names the offending key, its value and what is allowed. Checks that need the data or the backbone
(shapes, more teachers than samples, a budget too small for one query) run in
:func:`capc_common.dietpate.pipeline.prepare`, still before any expensive stage.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from capc_common.errors import InputError
from capc_common.learn.heads import HeadRecipe
from capc_common.learn.student import STUDENT_CANDIDATES

if TYPE_CHECKING:
    from capc_common.mechanisms import SelectionMechanism

__all__ = [
    "BackboneSection",
    "BaselineSection",
    "BudgetSection",
    "DatasetSection",
    "MechanismSection",
    "QueriesSection",
    "RecipeSection",
    "RunConfig",
    "StudentSection",
    "TeachersSection",
    "load_config",
]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatasetSection(_Section):
    """The private data: a named dataset, optionally subsampled, and a validation split for tuning.

    ``validation`` images are held out of the *training* split (never the test split) so that
    hyper-parameters can be tuned without touching the test set; ``evaluate_on: validation`` then reports
    accuracy on them instead of the test set. Such tuning is a release of the protected training data that
    the run's ε does not cover (Papernot & Steinke 2022); the report's ``not_private`` says so.
    """

    name: str = "fashion-mnist"
    root: str | None = None
    train_limit: int | None = Field(default=None, ge=1)
    test_limit: int | None = Field(default=None, ge=1)
    validation: int = Field(default=0, ge=0)
    evaluate_on: Literal["test", "validation"] = "test"

    @model_validator(mode="after")
    def _validation_needed(self) -> Self:
        if self.evaluate_on == "validation" and self.validation == 0:
            raise ValueError("evaluate_on: validation needs validation > 0 (images held out of train)")
        return self


class RecipeSection(_Section):
    """How a head is fitted (:class:`capc_common.learn.HeadRecipe`); the defaults are the library's."""

    kind: Literal["linear", "mlp"] = "linear"
    hidden: int = Field(default=256, ge=1)
    optimizer: Literal["adam", "lbfgs"] = "adam"
    steps: int = Field(default=HeadRecipe.steps, ge=1)
    lr: float = Field(default=HeadRecipe.lr, gt=0)
    l2: float = Field(default=HeadRecipe.l2, ge=0)
    label_smoothing: float = Field(default=HeadRecipe.label_smoothing, ge=0, lt=1)
    tolerance: float = Field(default=HeadRecipe.tolerance, gt=0)

    @model_validator(mode="after")
    def _valid_recipe(self) -> Self:
        try:
            self.recipe()
        except InputError as exc:  # cross-field rules (e.g. lbfgs needs l2 > 0), before any work
            raise ValueError(str(exc)) from None
        return self

    def recipe(self) -> HeadRecipe:
        """The library recipe."""
        return HeadRecipe(**self.model_dump())


class TeachersSection(_Section):
    """The teachers: how many, how the training data is split, and how each head is fitted.

    ``partition: hash`` (the default) assigns each example by a hash of its content, so ε holds for adding
    or removing one example; ``iid``/``imbalanced``/``dirichlet`` re-deal every shard when the data
    changes and hold for replacing one example (reports state which).
    """

    count: int = Field(default=200, ge=1)
    partition: Literal["hash", "iid", "imbalanced", "dirichlet"] = "hash"
    imbalance_ratio: float | None = Field(default=None, ge=1)
    alpha: float | None = Field(default=None, gt=0)
    recipe: RecipeSection = RecipeSection()


class BackboneSection(_Section):
    """The shared frozen backbone and its BatchNorm statistics mode.

    ``student`` names a different backbone for the student (the paper's "different initialisation"
    ablation); ``same`` uses the teachers' one.
    """

    name: str = "default"
    sha256: str | None = None
    bn_mode: Literal["current", "running"] = "current"
    bn_batch: int = Field(default=64, ge=2)
    student: str = "same"


class QueriesSection(_Section):
    """The synthetic query stream: generator, seed, batch size, and the most queries to ask."""

    generator: str = "dead_leaves"
    seed: int = Field(default=1, ge=0, lt=2**63)
    batch_size: int = Field(default=256, ge=1)
    max_queries: int = Field(default=20_000, ge=1)
    shrink_tail: bool = True


class MechanismSection(_Section):
    """The aggregation mechanism and its noise (σ are standard deviations of the integer noise)."""

    name: Literal["confident-gnmax", "gnmax", "lnmax"] = "confident-gnmax"
    threshold: float | None = Field(default=None, ge=0)
    sigma1: float | None = Field(default=None, gt=0)
    sigma2: float | None = Field(default=None, gt=0)
    scale: float | None = Field(default=None, gt=0)
    noise_seed: str | None = None

    @model_validator(mode="after")
    def _parameters(self) -> Self:
        need = {
            "confident-gnmax": ("threshold", "sigma1", "sigma2"),
            "gnmax": ("sigma2",),
            "lnmax": ("scale",),
        }[self.name]
        missing = [k for k in need if getattr(self, k) is None]
        if missing:
            raise ValueError(f"mechanism {self.name} needs {', '.join(missing)}")
        return self

    def build(self, *, teachers: int, classes: int) -> SelectionMechanism:
        """The mechanism object these parameters describe, for ``teachers`` heads over ``classes``."""
        from capc_common.mechanisms import ConfidentGNMax, GNMax, LNMax

        if self.name == "confident-gnmax":
            assert self.threshold is not None and self.sigma1 is not None and self.sigma2 is not None
            return ConfidentGNMax(
                classes=classes,
                teachers=teachers,
                threshold=self.threshold,
                sigma1=self.sigma1,
                sigma2=self.sigma2,
            )
        if self.name == "gnmax":
            assert self.sigma2 is not None
            return GNMax(classes=classes, sigma=self.sigma2)
        assert self.scale is not None
        return LNMax(classes=classes, scale=self.scale)


class BudgetSection(_Section):
    """The (ε, δ) at which the run stops, and the Rényi filter's fixed order (``auto``: planned)."""

    epsilon: float = Field(default=6.0, gt=0)
    delta: float = Field(default=1e-5, gt=0, lt=1)
    order: float | Literal["auto"] = "auto"
    expected_answer_rate: float = Field(default=0.3, gt=0, le=1)

    @model_validator(mode="after")
    def _order(self) -> Self:
        if self.order != "auto" and not float(self.order) > 1:
            raise ValueError(f"order must be > 1 or 'auto', got {self.order}")
        return self


def _sections(recipes: tuple[HeadRecipe, ...]) -> tuple[RecipeSection, ...]:
    return tuple(RecipeSection(**r.describe()) for r in recipes)  # type: ignore[arg-type]


class StudentSection(_Section):
    """The student: candidate recipes chosen among on answered queries only, pseudo-labels, evaluation."""

    candidates: tuple[RecipeSection, ...] = _sections(STUDENT_CANDIDATES)
    holdout: float = Field(default=0.2, ge=0, lt=1)
    pseudo_labels: bool = True
    pseudo_confidence: float = Field(default=0.9, gt=0, le=1)
    pseudo_weight: float = Field(default=0.5, gt=0, le=1)
    eval_bn_batch: int = Field(default=64, ge=16)
    eval_running: bool = False
    curve_points: int = Field(default=4, ge=1)
    curve_epsilons: tuple[float, ...] | None = None

    @model_validator(mode="after")
    def _grid(self) -> Self:
        if not self.candidates:
            raise ValueError("student.candidates must list at least one recipe")
        if self.curve_epsilons is not None and (not self.curve_epsilons or min(self.curve_epsilons) <= 0):
            raise ValueError(
                f"curve_epsilons must be a non-empty list of budgets > 0, got {list(self.curve_epsilons)}"
            )
        return self


class BaselineSection(_Section):
    """PATE without public data: no pretrained backbone; teachers and student are MLPs on raw pixels,
    randomly initialised and trained from scratch (the student on the answered synthetic queries)."""

    recipe: RecipeSection = RecipeSection(kind="mlp", hidden=128, steps=100, lr=1e-3)
    student: tuple[RecipeSection, ...] = (RecipeSection(kind="mlp", hidden=128, steps=200, lr=1e-3, l2=1e-4),)


class RunConfig(_Section):
    """A whole central run. ``method`` picks DIET-PATE or the PATE-without-public-data baseline."""

    name: str = "dietpate"
    method: Literal["diet-pate", "pate-scratch"] = "diet-pate"
    seed: int = Field(default=0, ge=0, lt=2**63)
    dataset: DatasetSection = DatasetSection()
    teachers: TeachersSection = TeachersSection()
    backbone: BackboneSection = BackboneSection()
    queries: QueriesSection = QueriesSection()
    mechanism: MechanismSection = MechanismSection(threshold=150, sigma1=120, sigma2=40)
    budget: BudgetSection = BudgetSection()
    student: StudentSection = StudentSection()
    baseline: BaselineSection = BaselineSection()
    output: str = "runs/dietpate"
    plots: bool = True
    save_teachers: bool = False
    #: Also report figures computed from the *noiseless* votes (agreement of the released labels with the
    #: plurality, the teachers' consensus on the queries and its plot), marked NOT PRIVATE: research only.
    diagnostics: bool = False

    @model_validator(mode="after")
    def _batches(self) -> Self:
        bn = self.backbone.bn_batch
        if self.queries.batch_size % bn:
            raise ValueError(
                f"queries.batch_size {self.queries.batch_size} must be a multiple of backbone.bn_batch {bn} "
                "(queries are featurised in chunks of exactly bn_batch, as in the federation)"
            )
        if self.queries.max_queries < bn:
            raise ValueError(f"queries.max_queries {self.queries.max_queries} is below one bn_batch ({bn})")
        if self.teachers.partition == "imbalanced" and self.teachers.imbalance_ratio is None:
            raise ValueError("teachers.partition imbalanced needs teachers.imbalance_ratio")
        if self.teachers.partition == "dirichlet" and self.teachers.alpha is None:
            raise ValueError("teachers.partition dirichlet needs teachers.alpha")
        return self

    def with_overrides(
        self,
        *,
        epsilon: float | None = None,
        teachers: int | None = None,
        seed: int | None = None,
        output: str | None = None,
        diagnostics: bool | None = None,
    ) -> RunConfig:
        """A copy with the CLI overrides applied and re-validated."""
        data = self.model_dump()
        if output is not None:
            data["output"] = output
        if diagnostics is not None:
            data["diagnostics"] = diagnostics
        if epsilon is not None:
            data["budget"]["epsilon"] = epsilon
        if teachers is not None:
            data["teachers"]["count"] = teachers
        if seed is not None:
            data["seed"] = seed
        return _validate(data, source="overrides")


def _validate(data: Any, *, source: str) -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}"
            + (
                f" (got {err['input']!r})"
                if err["type"] != "missing" and not isinstance(err["input"], dict)
                else ""
            )
            for err in exc.errors()
        )
        raise InputError(f"invalid run config {source}: {problems}") from exc


def load_config(path: str | Path) -> RunConfig:
    """Read and validate a ``run.yaml``.

    Raises:
        InputError: the file is missing, is not YAML, or a key is unknown or out of range (the message
            names every problem).
    """
    source = Path(path)
    if not source.is_file():
        raise InputError(f"run config {source} does not exist; see configs/ for examples")
    try:
        data = yaml.safe_load(source.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise InputError(f"run config {source} is not valid YAML: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError(f"run config {source} must be a YAML mapping, got {type(data).__name__}")
    return _validate(data, source=str(source))
