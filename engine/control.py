"""``POST /v1/chat/completions/control`` on the engine's side: the running sequence a completion id
names, and its reasoning ended there (the reference's SERVER_TASK_TYPE_CONTROL handler, with its
answers). Called on the engine's thread (``run_on_loop``), between two steps."""

from __future__ import annotations

from collections.abc import Iterable

from .tasks import Task

NO_COMPLETION = "no active completion for this id"
NOT_ARMED = "reasoning control not enabled for this completion"


def reasoning_end(running: Iterable[Task], completion_id: str) -> dict:
    """``{"success": true}``, or ``false`` with the reference's message. A budget that is not
    counting down (none, not opened yet, already forcing or done) is left as it is, and the
    answer is still a success, as the reference's."""
    task = next((t for t in running if completion_id and t.req.completion_id == completion_id),
                None)
    if task is None:
        return {"success": False, "message": NO_COMPLETION}
    if not task.req.reasoning_control:
        return {"success": False, "message": NOT_ARMED}
    if task.budget is not None:
        task.budget.force_now()
    return {"success": True}
