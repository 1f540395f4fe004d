"""Request and result records of one execution: the boundary all front ends and clients share."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

# Defaults sized for a model's Python tool: short snippets, small outputs.
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_MB = 1024
DEFAULT_OUTPUT_LIMIT_BYTES = 1 << 20
MAX_CODE_BYTES = 1 << 20
MAX_STDIN_BYTES = 1 << 20


class RunStatus(StrEnum):
    """How one execution ended."""

    SUCCESS = "success"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    MEMORY_EXCEEDED = "memory_exceeded"
    OUTPUT_LIMIT_EXCEEDED = "output_limit_exceeded"
    INTERNAL_ERROR = "internal_error"


class RunRequest(BaseModel):
    """One piece of Python source to run, with its stdin and limits."""

    model_config = ConfigDict(extra="forbid")

    code: str = Field(max_length=MAX_CODE_BYTES, description="Python source to execute.")
    stdin: str = Field(default="", max_length=MAX_STDIN_BYTES, description="Standard input.")
    timeout_s: float = Field(
        default=DEFAULT_TIMEOUT_S, gt=0, le=300, description="Wall-clock limit in seconds."
    )
    memory_mb: int = Field(
        default=DEFAULT_MEMORY_MB, gt=0, le=65536, description="Address-space budget in MiB."
    )
    output_limit_bytes: int = Field(
        default=DEFAULT_OUTPUT_LIMIT_BYTES,
        gt=0,
        le=64 << 20,
        description="Cap on stdout and on stderr, each, in bytes.",
    )
    display_last_expr: bool = Field(
        default=False,
        description="Print the repr of a trailing expression when nothing was printed.",
    )


class RunResult(BaseModel):
    """What one execution produced."""

    model_config = ConfigDict(extra="forbid")

    status: RunStatus
    exit_code: int | None = Field(default=None, description="Exit code when the process exited.")
    signal: int | None = Field(default=None, description="Signal number when it was killed.")
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    wall_time_s: float = Field(default=0.0, ge=0)
    cpu_time_s: float = Field(default=0.0, ge=0)

    @property
    def ok(self) -> bool:
        """True when the code ran to completion without error."""
        return self.status is RunStatus.SUCCESS


class BatchRequest(BaseModel):
    """Body of ``POST /v1/run/batch``."""

    model_config = ConfigDict(extra="forbid")

    requests: list[RunRequest] = Field(description="Calls to run; results keep this order.")


class BatchResponse(BaseModel):
    """Response of ``POST /v1/run/batch``: one result per request, in request order."""

    model_config = ConfigDict(extra="forbid")

    results: list[RunResult]
