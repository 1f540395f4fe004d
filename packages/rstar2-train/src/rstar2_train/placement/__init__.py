"""Ray placement of an RL stage: data-parallel FSDP2 trainer ranks, engines and the sandbox as
actors, weight sync from the trainer's shards to every engine."""

from rstar2_train.placement.distributed import DistributedActor

__all__ = ["DistributedActor"]
