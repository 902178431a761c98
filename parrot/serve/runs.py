"""A batch run to its end in a session of its own, in one request (`POST /v1/run`).

A one-call application (a GPTs-like request) otherwise pays three requests: create the session
with its batch, get the output, delete the session. Here the session is created with the batch,
the answer waits for the outputs, and the session is deleted before the answer is sent, whatever
happens: an output's error, the timeout (the calls still running are cancelled: 408), or the
client leaving (the route cancels the run). Composed of the Manager's own operations only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from parrot.protocol.errors import ParrotError
from parrot.protocol.public_api import CreateSessionRequest, RunRequest, RunResult, VariableValue

if TYPE_CHECKING:
    from parrot.serve.manager import Manager


async def run_once(manager: Manager, api_key: str | None, req: RunRequest) -> RunResult:
    if req.outputs is not None:
        known = {v.var_id for v in req.submit.variables if v.var_id is not None}
        unknown = next((v for v in req.outputs if v not in known), None)
        if unknown is not None:
            raise ParrotError(f"output {unknown!r} is not a variable of `submit.variables`", field="outputs")
    created = await manager.open_session(api_key, CreateSessionRequest(submit=req.submit))
    session = manager.session(created.session_id, created.token)
    assert created.submitted is not None
    try:
        outputs = req.outputs
        if outputs is None:
            outputs = [v for call in created.submitted.calls for v in call.outputs.values()]
        # No await since the batch was committed: objectives are deduced with the outputs awaited
        # before the executor's next step dispatches any call.
        manager.note_awaited(session, dict.fromkeys(outputs, req.criteria))
        deadline = manager.pool.clock.now() + req.timeout_s
        values: list[VariableValue] = []
        for i, var_id in enumerate(outputs):
            wait_s = max(deadline - manager.pool.clock.now(), 1e-3)
            try:  # one request: one client wait counted, whatever the number of outputs
                values.append(await manager.get_variable(session, var_id, req.criteria, wait_s, counted=i == 0))
            except ParrotError as e:
                if e.status != 408:
                    raise
                message = f"the run's outputs were not ready within {req.timeout_s:g} s; its calls were cancelled"
                raise ParrotError(message, status=408, field="timeout_s") from e
        return RunResult(submitted=created.submitted, values=values)
    finally:
        await manager.delete_session(session, "ended with its run")
