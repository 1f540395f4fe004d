"""rstar2-algo.

GRPO-RoC math on torch tensors: group advantages, Resample-on-Correct, clip-higher policy loss,
chunked log-probs.
"""

from importlib.metadata import version

from rstar2_algo._groups import GroupIds
from rstar2_algo._rng import RandomSource
from rstar2_algo.advantages import AdvantageScale, GroupAdvantages, group_advantages
from rstar2_algo.aggregation import LossAggregation, aggregate
from rstar2_algo.decoupled import BehaviourWeights, WeightStats, behaviour_weights, ess_fraction
from rstar2_algo.filtering import DroppedGroup, DropReason, GroupFilter, filter_groups
from rstar2_algo.fused_head import HeadLogProbs, fused_linear_logprobs
from rstar2_algo.kl import KLEstimator, kl_divergence
from rstar2_algo.logprobs import entropy_from_logits, selective_log_softmax
from rstar2_algo.policy_loss import PolicyLoss, policy_loss
from rstar2_algo.quality import TrajectoryQuality
from rstar2_algo.roc import (
    RocSelection,
    RocStats,
    RocStrategy,
    resample_groups,
    resample_on_correct,
    split_quota,
)

__version__ = version("rstar2-algo")

__all__ = [
    "AdvantageScale",
    "BehaviourWeights",
    "DropReason",
    "DroppedGroup",
    "GroupAdvantages",
    "GroupFilter",
    "GroupIds",
    "HeadLogProbs",
    "KLEstimator",
    "LossAggregation",
    "PolicyLoss",
    "RandomSource",
    "RocSelection",
    "RocStats",
    "RocStrategy",
    "TrajectoryQuality",
    "WeightStats",
    "__version__",
    "aggregate",
    "behaviour_weights",
    "entropy_from_logits",
    "ess_fraction",
    "filter_groups",
    "fused_linear_logprobs",
    "group_advantages",
    "kl_divergence",
    "policy_loss",
    "resample_groups",
    "resample_on_correct",
    "selective_log_softmax",
    "split_quota",
]
