"""Learning on top of a frozen backbone: SimCLR pretraining, batched teacher heads, prompted teachers
(Prom-PATE), the student."""

from capc_common.learn.augment import AugmentConfig, augment
from capc_common.learn.featurizers import BackboneFeaturizer, Featurizer, PixelFeaturizer
from capc_common.learn.heads import HeadEnsemble, HeadRecipe, fixed_votes, train_heads
from capc_common.learn.pretrain import (
    PretrainConfig,
    PretrainResult,
    calibrate_training_free,
    nt_xent,
    pretrain,
)
from capc_common.learn.prompts import PromptedTeachers, PromptRecipe, train_prompted_teachers
from capc_common.learn.student import StudentFit, accuracy, load_student, save_student, train_student
from capc_common.learn.teachers import (
    TeacherEnsemble,
    fit_teachers,
    shard_features,
    short_shards,
    train_teachers,
)

__all__ = [
    "AugmentConfig",
    "BackboneFeaturizer",
    "Featurizer",
    "HeadEnsemble",
    "HeadRecipe",
    "PixelFeaturizer",
    "PretrainConfig",
    "PretrainResult",
    "PromptRecipe",
    "PromptedTeachers",
    "StudentFit",
    "TeacherEnsemble",
    "accuracy",
    "augment",
    "calibrate_training_free",
    "fit_teachers",
    "fixed_votes",
    "load_student",
    "nt_xent",
    "pretrain",
    "save_student",
    "shard_features",
    "short_shards",
    "train_heads",
    "train_prompted_teachers",
    "train_student",
    "train_teachers",
]
