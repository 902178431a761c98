"""Where the running calls are: task group -> engines, application -> engines, engine -> tenant
-> running calls. Owned by the executor, which adds a run when it takes an engine slot and removes
it when the slot is given back, so a scheduling step reads the index instead of walking every call
(what the policy's snapshot needs: `group_engines`, `app_engines`, `tenant_running`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping


class _EnginesOf(Mapping[str, tuple[str, ...]]):
    """A read-only view: name -> the sorted engines running its calls (built on access)."""

    def __init__(self, counts: dict[str, Counter[str]]) -> None:
        self._counts = counts

    def __getitem__(self, name: str) -> tuple[str, ...]:
        return tuple(sorted(self._counts[name]))

    def __iter__(self) -> Iterator[str]:
        return iter(self._counts)

    def __len__(self) -> int:
        return len(self._counts)


class Placements:
    def __init__(self) -> None:
        self._groups: dict[str, Counter[str]] = {}
        self._apps: dict[str, Counter[str]] = {}
        self._tenants: dict[str, dict[str, int]] = {}
        self._entries: dict[int, tuple[str | None, str, str, str]] = {}  # id(run) -> (group, app, engine, tenant)
        self.group_engines: Mapping[str, tuple[str, ...]] = _EnginesOf(self._groups)
        self.app_engines: Mapping[str, tuple[str, ...]] = _EnginesOf(self._apps)
        self.tenant_running: Mapping[str, Mapping[str, int]] = self._tenants

    def add(self, run_id: int, app: str, task_group: str | None, engine_id: str, tenant: str) -> None:
        """A run of application (session) `app` took a slot on `engine_id`."""
        self.remove(run_id)
        group = None if task_group is None else f"{app}/{task_group}"
        self._entries[run_id] = (group, app, engine_id, tenant)
        if group is not None:
            self._groups.setdefault(group, Counter())[engine_id] += 1
        self._apps.setdefault(app, Counter())[engine_id] += 1
        on_engine = self._tenants.setdefault(engine_id, {})
        on_engine[tenant] = on_engine.get(tenant, 0) + 1

    def remove(self, run_id: int) -> None:
        entry = self._entries.pop(run_id, None)
        if entry is None:
            return
        group, app, engine_id, tenant = entry
        for table, name in ((self._groups, group), (self._apps, app)):
            if name is None:
                continue
            counts = table[name]
            counts[engine_id] -= 1
            if counts[engine_id] == 0:
                del counts[engine_id]
                if not counts:
                    del table[name]
        on_engine = self._tenants[engine_id]
        on_engine[tenant] -= 1
        if on_engine[tenant] == 0:
            del on_engine[tenant]
            if not on_engine:
                del self._tenants[engine_id]
