"""rstar2-algo.

GRPO-RoC math on torch tensors: group advantages, Resample-on-Correct, clip-higher policy loss,
chunked log-probs.

Names are loaded on first use: the record and the vocabularies that configs and the rollout loop
name (``TrajectoryQuality``, ``LossAggregation``) import without torch, so a config is validated
without loading it.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rstar2_algo._groups import GroupIds as GroupIds
    from rstar2_algo._rng import RandomSource as RandomSource
    from rstar2_algo.advantages import AdvantageScale as AdvantageScale
    from rstar2_algo.advantages import GroupAdvantages as GroupAdvantages
    from rstar2_algo.advantages import group_advantages as group_advantages
    from rstar2_algo.aggregation import aggregate as aggregate
    from rstar2_algo.aggregation_modes import LossAggregation as LossAggregation
    from rstar2_algo.decoupled import BehaviourWeights as BehaviourWeights
    from rstar2_algo.decoupled import WeightStats as WeightStats
    from rstar2_algo.decoupled import behaviour_weights as behaviour_weights
    from rstar2_algo.decoupled import ess_fraction as ess_fraction
    from rstar2_algo.filtering import DroppedGroup as DroppedGroup
    from rstar2_algo.filtering import DropReason as DropReason
    from rstar2_algo.filtering import GroupFilter as GroupFilter
    from rstar2_algo.filtering import filter_groups as filter_groups
    from rstar2_algo.fused_head import HeadLogProbs as HeadLogProbs
    from rstar2_algo.fused_head import fused_linear_logprobs as fused_linear_logprobs
    from rstar2_algo.kl import KLEstimator as KLEstimator
    from rstar2_algo.kl import kl_divergence as kl_divergence
    from rstar2_algo.logprobs import SUPPORT_PAD as SUPPORT_PAD
    from rstar2_algo.logprobs import entropy_from_logits as entropy_from_logits
    from rstar2_algo.logprobs import selective_log_softmax as selective_log_softmax
    from rstar2_algo.logprobs import support_tensor as support_tensor
    from rstar2_algo.policy_loss import PolicyLoss as PolicyLoss
    from rstar2_algo.policy_loss import policy_loss as policy_loss
    from rstar2_algo.quality import TrajectoryQuality as TrajectoryQuality
    from rstar2_algo.roc import RocSelection as RocSelection
    from rstar2_algo.roc import RocStats as RocStats
    from rstar2_algo.roc import RocStrategy as RocStrategy
    from rstar2_algo.roc import resample_groups as resample_groups
    from rstar2_algo.roc import resample_on_correct as resample_on_correct
    from rstar2_algo.roc import split_quota as split_quota

    __version__: str

_EXPORTS = {
    "GroupIds": "rstar2_algo._groups",
    "RandomSource": "rstar2_algo._rng",
    "AdvantageScale": "rstar2_algo.advantages",
    "GroupAdvantages": "rstar2_algo.advantages",
    "group_advantages": "rstar2_algo.advantages",
    "aggregate": "rstar2_algo.aggregation",
    "LossAggregation": "rstar2_algo.aggregation_modes",
    "BehaviourWeights": "rstar2_algo.decoupled",
    "WeightStats": "rstar2_algo.decoupled",
    "behaviour_weights": "rstar2_algo.decoupled",
    "ess_fraction": "rstar2_algo.decoupled",
    "DropReason": "rstar2_algo.filtering",
    "DroppedGroup": "rstar2_algo.filtering",
    "GroupFilter": "rstar2_algo.filtering",
    "filter_groups": "rstar2_algo.filtering",
    "HeadLogProbs": "rstar2_algo.fused_head",
    "fused_linear_logprobs": "rstar2_algo.fused_head",
    "KLEstimator": "rstar2_algo.kl",
    "kl_divergence": "rstar2_algo.kl",
    "entropy_from_logits": "rstar2_algo.logprobs",
    "SUPPORT_PAD": "rstar2_algo.logprobs",
    "selective_log_softmax": "rstar2_algo.logprobs",
    "support_tensor": "rstar2_algo.logprobs",
    "PolicyLoss": "rstar2_algo.policy_loss",
    "policy_loss": "rstar2_algo.policy_loss",
    "TrajectoryQuality": "rstar2_algo.quality",
    "RocSelection": "rstar2_algo.roc",
    "RocStats": "rstar2_algo.roc",
    "RocStrategy": "rstar2_algo.roc",
    "resample_groups": "rstar2_algo.roc",
    "resample_on_correct": "rstar2_algo.roc",
    "split_quota": "rstar2_algo.roc",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        return version("rstar2-algo")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rstar2_algo' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
