"""Settings of the HTTP service (``rstar2-sandbox serve``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from rstar2_sandbox.dispatch import DEFAULT_MAX_QUEUE
from rstar2_sandbox.models import DEFAULT_TIMEOUT_S


class ServerSettings(BaseModel):
    """Limits and defaults of the HTTP front end."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field(default="127.0.0.1", description="Address to listen on.")
    port: int = Field(default=8080, ge=0, le=65535, description="TCP port (0: any free port).")
    max_queue: int = Field(
        default=DEFAULT_MAX_QUEUE, ge=0, description="Calls waiting for a slot before 503."
    )
    max_batch: int = Field(default=4096, ge=1, description="Most calls in one batch request.")
    max_body_bytes: int = Field(
        default=64 << 20,
        ge=1 << 16,
        description="Largest request body accepted; each endpoint's own limit follows from the "
        "code, stdin and batch limits, up to this.",
    )
    compat_timeout_s: float = Field(
        default=DEFAULT_TIMEOUT_S,
        gt=0,
        le=300,
        description="Wall-clock limit for Code Judge calls, which carry none.",
    )
    codejudge_output_chars: int | None = Field(
        default=None,
        ge=0,
        description="Cut Code Judge stdout and stderr to their first N characters, as Code Judge "
        "itself does (1000 there; rStar2-Agent's client expects it). None: send them whole.",
    )
    response_buffer_mb: int = Field(
        default=64,
        ge=1,
        description="Batch results that finished and wait to be streamed (MiB): the memory "
        "they may take over all responses (beyond it they wait in a temporary file), and each "
        "batch's window: it admits no further call while its own waiting results reach this.",
    )
    spool_dir: str | None = Field(
        default=None,
        description="Directory of those temporary files (default: the system's temp directory).",
    )
