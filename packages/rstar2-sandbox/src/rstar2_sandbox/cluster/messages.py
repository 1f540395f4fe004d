"""Records that travel through Redis: queued calls and their results."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rstar2_sandbox.isolation import IsolationReport
from rstar2_sandbox.models import RunRequest, RunResult, RunStatus


class TaskMessage(BaseModel):
    """One queued call: who waits for it and what to run."""

    model_config = ConfigDict(extra="forbid")

    request_id: str = Field(min_length=1, description="Unique id of this call.")
    reply_to: str = Field(min_length=1, description="Id of the front end that waits for it.")
    request: RunRequest

    def to_fields(self) -> dict[str, str]:
        """Stream entry fields; ids are kept apart from the body so a bad body can be answered."""
        return {
            "id": self.request_id,
            "reply": self.reply_to,
            "request": self.request.model_dump_json(),
        }


class ResultMessage(BaseModel):
    """The result of one call, as pushed to the front end that waits for it."""

    model_config = ConfigDict(extra="forbid")

    request_id: str = Field(min_length=1)
    result: RunResult
    worker: str = Field(description="Worker that produced it.")
    deliveries: int = Field(ge=1, description="How many times the call was handed to a worker.")


class Delivery(BaseModel):
    """A stream entry handed to a worker: the call, or why it could not be read."""

    model_config = ConfigDict(extra="forbid")

    entry_id: str
    deliveries: int = Field(ge=1, description="Times handed to a worker, this time included.")
    task: TaskMessage | None = Field(default=None, description="The call, when the entry is valid.")
    request_id: str | None = Field(default=None, description="Its id, even when invalid.")
    reply_to: str | None = Field(default=None, description="Its front end, even when invalid.")
    error: str | None = Field(default=None, description="Why the entry is not a valid call.")

    @classmethod
    def parse(cls, entry_id: str, fields: dict[str, str], deliveries: int) -> Delivery:
        """Read a stream entry; a malformed one keeps whatever ids it has and an error."""
        request_id = fields.get("id") or None
        reply_to = fields.get("reply") or None
        found = {"entry_id": entry_id, "deliveries": deliveries}
        found |= {"request_id": request_id, "reply_to": reply_to}
        if request_id is None or reply_to is None:
            missing = [name for name in ("id", "reply") if not fields.get(name)]
            return cls(**found, error=f"stream entry {entry_id} lacks field(s) {missing}")
        try:
            request = RunRequest.model_validate_json(fields.get("request", ""))
        except ValidationError as exc:
            error = f"stream entry {entry_id} field 'request' is not a valid RunRequest: {exc}"
            return cls(**found, error=error)
        task = TaskMessage(request_id=request_id, reply_to=reply_to, request=request)
        return cls(**found, task=task)


class WorkerInfo(BaseModel):
    """What a worker tells front ends with each heartbeat, for /v1/info and /healthz."""

    model_config = ConfigDict(extra="forbid")

    slots: int = Field(ge=1, description="Calls it runs at once.")
    preloaded: list[str] = Field(default_factory=list, description="Modules its executors load.")
    isolation: IsolationReport | None = Field(
        default=None, description="Isolation of its executors, where known."
    )


def internal_error(message: str) -> RunResult:
    """A result for a call the cluster could not run; the reason goes to stderr."""
    return RunResult(status=RunStatus.INTERNAL_ERROR, stderr=message)
