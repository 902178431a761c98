"""Context leases: contexts whose ids a lease names are freed once it runs out and no work is
queued on them; a renewed lease keeps them; contexts no lease names stay."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import ValidationError

from parrot.engine.async_engine import AsyncEngine
from parrot.engine.config import EngineConfig
from parrot.engine.leases import LeaseKeeper, LeaseTable
from parrot.protocol.engine_api import ExtendRequest, FreeContextRequest, LeaseRequest
from parrot.protocol.engine_client import extend_only
from parrot.protocol.errors import conflict


def test_the_lease_table_expires_at_its_deadline_and_a_renewal_extends_it() -> None:
    now = [10.0]
    table = LeaseTable(clock=lambda: now[0])
    table.renew(LeaseRequest(prefixes=["s-aaaa-", "pfx-aaaa-"], ttl_s=5))
    now[0] = 14.0
    table.renew(LeaseRequest(prefixes=["s-aaaa-"], ttl_s=5))  # renewed until 19
    assert table.expired() == ()
    now[0] = 15.0
    assert table.expired() == ("pfx-aaaa-",)
    now[0] = 19.0
    assert sorted(table.expired()) == ["pfx-aaaa-", "s-aaaa-"]


def test_a_context_with_work_queued_is_freed_by_a_later_sweep() -> None:
    contexts = {"s-aaaa-1.c0", "s-aaaa-1.c1", "other"}
    busy = {"s-aaaa-1.c1"}

    def free(req: FreeContextRequest) -> None:
        if req.context_id in busy:
            raise conflict("busy", "context_id")
        contexts.discard(req.context_id)

    keeper = LeaseKeeper(lambda prefixes: sorted(c for c in contexts if c.startswith(prefixes)), free)
    keeper.table.renew(LeaseRequest(prefixes=["s-aaaa-"], ttl_s=1e-9))
    assert keeper.sweep() == 1
    assert [sorted(contexts), list(keeper.table.deadlines)] == [["other", "s-aaaa-1.c1"], ["s-aaaa-"]]
    busy.clear()  # its generation ended
    assert keeper.sweep() == 1
    assert [sorted(contexts), keeper.table.deadlines] == [["other"], {}]  # the lease is done


def test_an_engine_frees_an_expired_leases_contexts_and_keeps_the_rest(tiny_model_folder: Path) -> None:
    engine = AsyncEngine(EngineConfig(model=str(tiny_model_folder), dtype="float32", num_blocks=64, block_size=16))
    engine.leases.sweep_s = 0.02
    engine.start()

    async def main() -> None:  # the engine server's lease route calls `engine.leases.renew`
        for context_id in ("s-run1-x.c0", "pfx-run1-0-abc", "pfx-run2-0-abc", "mine"):
            await extend_only(engine, ExtendRequest(context_id=context_id, token_ids=list(range(1, 40))))
        lease = LeaseRequest(prefixes=["s-run1-", "pfx-run1-"], ttl_s=0.3)
        engine.leases.renew(lease)
        engine.leases.renew(LeaseRequest(prefixes=["pfx-run2-"], ttl_s=60))
        for _ in range(5):  # renewed while its holder lives: kept
            await asyncio.sleep(0.1)
            engine.leases.renew(lease)
        assert len(engine.engine.context_ids(("",))) == 4
        await asyncio.sleep(0.6)  # the holder is gone
        assert sorted(engine.engine.context_ids(("",))) == ["mine", "pfx-run2-0-abc"]
        await engine.free(FreeContextRequest(context_id="mine"))
        await engine.free(FreeContextRequest(context_id="pfx-run2-0-abc"))
        stats = await engine.stats()
        assert [stats.num_contexts, stats.num_blocks_free] == [0, stats.num_blocks_total]
        await engine.leases.stop()

    try:
        asyncio.run(main())
    finally:
        engine.stop()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prefixes": [], "ttl_s": 1}, "prefixes"),
        ({"prefixes": ["s-"], "ttl_s": 1}, "prefixes"),  # too short: would name others' contexts
        ({"prefixes": ["s-aaaa-"], "ttl_s": 0}, "ttl_s"),
    ],
)
def test_a_lease_request_names_specific_prefixes(body: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        LeaseRequest.model_validate(body)
    assert [str(e["loc"][0]) if e["loc"] else "prefixes" for e in info.value.errors()] == [field]
