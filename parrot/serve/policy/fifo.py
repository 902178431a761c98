"""The `fifo` scheduling policy: submission order, least-loaded engine (the baseline policy)."""

from __future__ import annotations

from parrot.serve.policy.plan import CallKey, Dispatch, EarlyFill, EngineView, FailCall, Plan, Snapshot


class FifoPolicy:
    """Calls in submission order (so producers before consumers, and no starvation); each ready
    call goes to the least-loaded engine of its model, or to the engine already holding its
    context; early fills go where the fewest early-filled calls wait."""

    def plan(self, snapshot: Snapshot) -> Plan:
        running = {e.engine_id: e.num_running_calls for e in snapshot.engines}
        early = {e.engine_id: e.num_early_filled_calls for e in snapshot.engines}
        engines = {e.engine_id: e for e in snapshot.engines}
        fail: list[FailCall] = []
        early_fill: list[EarlyFill] = []
        dispatch: list[Dispatch] = []
        blocked: list[CallKey] = []
        for call in sorted(snapshot.calls, key=lambda c: c.order):
            if call.failed_var_id is not None:
                fail.append(FailCall(call.key, call.failed_var_id))
            elif call.inputs_ready:
                engine_id = call.engine_id or _least(engines, running, call.model)
                if engine_id is None or running[engine_id] >= engines[engine_id].max_running_calls:
                    blocked.append(call.key)
                    continue
                running[engine_id] += 1
                dispatch.append(Dispatch(call.key, engine_id))
            elif snapshot.early_fill and call.num_ready_pieces > call.num_filled_pieces:
                engine_id = call.engine_id
                if engine_id is None:
                    engine_id = _least(engines, early, call.model)
                    if engine_id is None or early[engine_id] >= engines[engine_id].max_early_filled_calls:
                        continue
                    early[engine_id] += 1
                early_fill.append(EarlyFill(call.key, engine_id, call.num_ready_pieces))
        return Plan(tuple(fail), tuple(early_fill), tuple(dispatch), tuple(blocked))


def _least(engines: dict[str, EngineView], load: dict[str, int], model: str) -> str | None:
    candidates = [e for e in engines if engines[e].model == model and engines[e].alive]
    return min(candidates, key=lambda e: (load[e], e), default=None)
