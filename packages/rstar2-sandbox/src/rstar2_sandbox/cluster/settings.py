"""Settings of a Redis-backed cluster, shared by its front ends and workers."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ClusterSettings(BaseModel):
    """Knobs of the cluster queue; front ends and workers of one cluster must agree on them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key_prefix: str = Field(
        default="rstar2:sandbox",
        min_length=1,
        description="Prefix of every Redis key; lets several clusters share one Redis.",
    )
    max_queue: int = Field(
        default=10_000,
        gt=0,
        description="Calls that may wait for a worker (running ones aside); more get 503.",
    )
    retry_after_s: float = Field(
        default=1.0, gt=0, description="Retry-After a front end suggests when the queue is full."
    )
    lease_s: float = Field(
        default=15.0,
        gt=0,
        description=(
            "A call held by a worker that has not renewed its lease for this long is reclaimed "
            "by another worker; live workers renew every third of it."
        ),
    )
    max_deliveries: int = Field(
        default=2,
        ge=1,
        description="Deliveries of one call before it fails with internal_error (2: one retry).",
    )
    result_ttl_s: float = Field(
        default=600.0,
        gt=0,
        description=(
            "How long a call's completion marker (which discards a late duplicate result) and "
            "unread reply lists live in Redis; longer than the longest call."
        ),
    )
    frontend_ttl_s: float = Field(
        default=60.0,
        gt=0,
        description=(
            "A front end that has not refreshed its liveness key for this long is gone: workers "
            "discard its calls instead of running them for nobody."
        ),
    )
    result_timeout_s: float = Field(
        default=3600.0,
        gt=0,
        description="A front end waits this long for a result before answering internal_error.",
    )
