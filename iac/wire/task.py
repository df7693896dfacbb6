"""``TaskState``, the envelope of a delegated task, typed for its users.

At run time this is the protobuf class ``iac.TaskState`` (proto/iac.proto) itself. Its generated
stubs take the intent as the protobuf enum only, so ``TaskState(intent=iac.Intent.ASSIGN_TASK)``
would not type-check; for the type checker the class here is that protobuf class with a
constructor that takes :class:`~iac.wire.enums.Intent` (or its number or name), which is what
the protobuf runtime accepts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from iac.wire._pb import iac_pb2

if TYPE_CHECKING:
    from iac.wire.enums import Intent

    class TaskState(iac_pb2.TaskState):
        """A delegated task's envelope: ``task_id``, ``intent`` (:class:`~iac.Intent`), ``step`` of
        ``steps`` (``1 <= step <= steps``), and ``state_ref``, a reference to shared state instead
        of the history. The protobuf message ``iac.TaskState``."""

        def __init__(
            self,
            *,
            task_id: str | None = None,
            intent: Intent | int | str | None = None,
            step: int | None = None,
            steps: int | None = None,
            state_ref: str | None = None,
        ) -> None: ...

else:
    TaskState = iac_pb2.TaskState

__all__ = ["TaskState"]
