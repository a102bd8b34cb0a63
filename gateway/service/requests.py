"""What a caller may say when it asks the gateway for something.

Only who is asking (the principal), the task and the environment. Every fact that
grants (connection status, budget, evidence, approvals, operation history) is the
gateway's own, read from its store at decision time; these models have no field
through which a caller could assert one (they forbid unknown fields).
"""

from __future__ import annotations

from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from capgate.gateway.errors import quote
from capgate.gateway.model.facts import Identifier, Principal, Task

__all__ = ["AgentRequest"]


#: Longest unknown field name an error names whole; a longer one is cut short.
_NAME_SHOWN: Final = 60


class AgentRequest(BaseModel):
    """An agent's standing request: who it is, which task, which environment.

    The task must carry its ``id``: evidence and task budgets are kept per task.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    principal: Principal
    task: Task
    environment: Identifier
    #: How the front that made this request established who the agent is
    #: (``token:<binding>``, ``stdio``); recorded with every proposal. A library
    #: caller that authenticated its agent may say how; None reads as ``library``.
    authenticated_by: str | None = Field(
        default=None, min_length=1, max_length=300, pattern=r"^[\x21-\x7e]+$"
    )

    @model_validator(mode="before")
    @classmethod
    def _unknown_names_cut_short(cls, data: Any) -> Any:
        # extra="forbid" refuses an unknown field under its own name, and pydantic
        # prints that name whole: a megabyte-long key would make a megabyte-long
        # message. Such a key is renamed to its quoted, cut form (never a field's
        # name), and refused all the same.
        if not isinstance(data, dict):
            return data
        return {
            quote(key, 40)
            if isinstance(key, str) and key not in cls.model_fields and len(key) > _NAME_SHOWN
            else key: value
            for key, value in data.items()
        }

    @field_validator("task")
    @classmethod
    def _task_has_an_id(cls, task: Task) -> Task:
        if task.id is None:
            raise ValueError("the task needs an id: the gateway keeps evidence per task")
        return task

    @property
    def tenant(self) -> str:
        return self.principal.tenant

    @property
    def task_id(self) -> str:
        assert self.task.id is not None  # checked on construction
        return self.task.id
