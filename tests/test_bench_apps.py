"""Application benchmarks: workload scaling, prompt rendering, and one tiny end-to-end run of an
app on Parrot and on the request-level baseline (tiny model); the report table is in
test_bench_report.py, the network model in test_bench_netsim.py."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import random
from pathlib import Path

import pytest

from benchmarks.apps.baselines import Completion, OutputError, SessionClient, check_completion, render_prompt
from benchmarks.apps.configs import Config, plan_configs, step_ms_at
from benchmarks.apps.deploy import API_KEY, LocalServer, ServerSpec, UpstreamServer
from benchmarks.apps.run import Context, run_unit
from benchmarks.apps.scaling import FULL, QUICK
from benchmarks.apps.servers import openai_factory, parrot_over
from benchmarks.apps.workloads import all_scenarios, chain_summary, gpts, map_reduce
from benchmarks.apps.workloads.common import Corpus, Scenario, salt_digits
from benchmarks.common.netsim import RttModel
from benchmarks.common.paper import load_paper_workloads
from benchmarks.data import Document
from parrot.engine.config import EngineConfig
from parrot.launch import OpenAIUpstream
from parrot.serve import ManagerConfig
from parrot.text import Tokenizer

PAPER = load_paper_workloads()

# ---- scaling --------------------------------------------------------------------------------------


def test_scale_lengths_are_clamped() -> None:
    assert QUICK.prompt_len(7437) == 930 and QUICK.prompt_len(20_000) == 1024 and QUICK.prompt_len(1) == 1
    assert QUICK.output_len(704) == 32 and QUICK.output_len(89) == 25 and QUICK.output_len(416) == 26
    assert FULL.output_len(704) == 88 and FULL.output_len(1100) == 100


def test_quick_scenarios_are_scaled_down_and_keep_the_paper_shapes() -> None:
    scenarios = all_scenarios(QUICK, PAPER)
    assert [s.key for s in scenarios] == [
        "chain_summary/alone",
        "chain_summary/many4",
        "map_reduce/default",
        "gpts/rate2",
        "gpts/rate4",
        "gpts/rate8",
        "multi_agent/files4",
        "copilot/n6",
        "mixed/default",
    ]
    by_key = {s.key: s for s in scenarios}
    chain = by_key["chain_summary/alone"].params
    assert [chain.chunk_tokens, chain.output_tokens, chain.num_chunks, chain.num_apps] == [256, 25, 4, 1]
    gpts = by_key["gpts/rate2"].params
    assert [(a.prompt_tokens, a.query_tokens, a.output_tokens) for a in gpts.apps] == [
        (930, 7, 32),
        (140, 8, 25),
        (212, 4, 32),
        (254, 4, 26),
    ]
    agents = by_key["multi_agent/files4"].params
    assert [r.role for r in agents.rounds] == ["architect", "coder", "reviewer", "reviser"]
    assert agents.num_calls == 1 + 3 * 4
    assert agents.num_output_tokens == 32 + sum(agents.outs(r)[i] for r in agents.rounds[1:] for i in range(4))
    mixed = by_key["mixed/default"].params
    assert mixed.app_starts_s == (1.0, 3.0) and mixed.map_reduce.num_chunks == 4
    for s in scenarios:  # every scenario says how it was scaled
        assert "paper" in s.scaling
    ablations = {s.key: s.ablations for s in scenarios if s.ablations}
    assert ablations == {
        "chain_summary/alone": ("dag", "early_fill"),
        "chain_summary/many4": ("dag", "policy"),
        "map_reduce/default": ("dag", "objective"),
        "gpts/rate8": ("prefix", "policy"),
        "multi_agent/files4": ("prefix", "attention", "early_fill", "dag"),
        "copilot/n6": ("prefix", "attention"),
        "mixed/default": ("objective", "policy"),
    }
    assert len(all_scenarios(QUICK, PAPER, {"gpts"})) == 3


def test_full_mode_sweeps_have_plot_points() -> None:
    scenarios = all_scenarios(FULL, PAPER, {"chain_summary"})
    points = {(fig, x) for s in scenarios for fig, _, x in s.plots}
    assert {("chain_output", 25.0), ("chain_output", 100.0), ("chain_chunk", 1024.0), ("chain_many", 12.0)} <= points


def test_each_repeat_draws_its_own_arrival_schedule_and_repeat_zero_keeps_the_first() -> None:
    by_key = {s.key: s for s in all_scenarios(QUICK, PAPER)}
    scenario = by_key["gpts/rate4"]
    draw0, draw1, draw2 = (gpts.arrivals(scenario.params_for(r)) for r in range(3))
    assert scenario.params_for(0) is scenario.params and scenario.params.draw == 0
    assert len(draw0) == len(draw1) == len(draw2) == 8 and len({tuple(draw0), tuple(draw1), tuple(draw2)}) == 3
    assert draw1 == gpts.arrivals(scenario.params_for(1))  # the same for every configuration of a repeat
    assert sorted(a for _, a in draw1) == sorted(a for _, a in draw0) == [0, 0, 1, 1, 2, 2, 3, 3]
    # Repeat 0's is the schedule every run drew before repeats had draws of their own.
    rng = random.Random("gpts/4.0")
    order = [i % 4 for i in range(8)]
    rng.shuffle(order)
    offsets = list(itertools.accumulate((rng.expovariate(4.0) for _ in order[:-1]), initial=0.0))
    assert draw0 == list(zip(offsets, order, strict=True))
    assert by_key["chain_summary/many4"].params_for(2).draw == 2  # its background arrivals
    no_draw = by_key["map_reduce/default"]
    assert no_draw.params_for(2) is no_draw.params  # nothing random to draw: the same parameters


# ---- prompts and clients --------------------------------------------------------------------------


def test_render_prompt_stops_at_the_output() -> None:
    assert render_prompt(chain_summary.REFINE, {"summary": "S", "chunk": "C"}) == (
        "The summary so far: S\n\nRefine the summary with the next part of the text.\n\nText: C\n\nRefined summary:"
    )
    assert render_prompt(map_reduce.reduce_template(2), {"s0": "a", "s1": "b"}).endswith(
        "Summary 1: a\nSummary 2: b\n\nCombined summary:"
    )


def test_completion_checks_refuse_wrong_lengths() -> None:
    assert check_completion(Completion("x", 5), 5, "w").text == "x"
    assert check_completion(Completion("x", None), 5, "w").text == "x"
    with pytest.raises(OutputError, match="3 tokens generated, expected exactly 5"):
        check_completion(Completion("x", 3), 5, "w")
    with pytest.raises(OutputError, match="empty"):
        check_completion(Completion("", 5), 5, "w")


def test_plan_names_what_is_not_available() -> None:
    plan = plan_configs("smollm2-135m", "bfloat16", 2)
    keys = [c.key for c in plan.configs]
    assert keys[:3] == ["parrot", "a", "b"]
    assert "no_server_dag" in keys
    assert all(c.ablation for c in plan.configs if c.key.startswith("no_"))
    assert {c.optimization for c in plan.configs if c.ablation} <= {
        "dag",
        "early_fill",
        "prefix",
        "objective",
        "policy",
        "attention",
    }
    assert (
        plan_configs("smollm2-135m", "bfloat16", 2, tpot_target_ms=180.0).specs[0].manager.scheduling.tpot_target_ms
        == 180.0
    )
    lat = next(s for s in plan.specs if s.name == "lat")
    tput = next(s for s in plan.specs if s.name == "tput")
    assert lat.engine.latency_max_batched_tokens is not None and tput.engine.latency_max_batched_tokens is None
    if plan.prefix_field is None:
        assert any("prefix sharing" in u for u in plan.unavailable)


def test_step_time_is_interpolated_between_profile_buckets() -> None:
    profile = {1: 50.0, 64: 100.0, 256: 300.0}
    assert step_ms_at(profile, 64) == 100.0
    assert step_ms_at(profile, 128) == pytest.approx(100.0 + 200.0 * 64 / 192)
    assert step_ms_at(profile, 512) is None and step_ms_at({}, 128) is None


# ---- end to end on the tiny model -----------------------------------------------------------------


class TinyCorpus(Corpus):
    """Synthetic documents (no data download): the apps only need text of enough tokens."""

    def documents(self, n: int, min_tokens: int) -> tuple[Document, ...]:
        words = "river mountain harbor lantern meadow"
        return tuple(Document(f"doc{i}", f"Part {i}. " + f"The {words} of part {i}. " * 40, 0) for i in range(n))


@pytest.fixture
def tiny_server(tiny_model_folder: Path):  # type: ignore[no-untyped-def]
    spec = ServerSpec(
        "tiny",
        EngineConfig(model=str(tiny_model_folder), dtype="float32", num_blocks=1024, latency_max_batched_tokens=64),
        ManagerConfig(),
    )
    server = LocalServer(spec).start()
    yield server
    server.stop()


def tiny_map_reduce(
    server: LocalServer, output_tokens: int, rtt_ms: float, chunk_tokens: int = 24
) -> tuple[Scenario, Context]:
    """Map-reduce over 3 chunks of `chunk_tokens` on the tiny server, one round trip of `rtt_ms`."""
    params = map_reduce.Params(chunk_tokens=chunk_tokens, output_tokens=output_tokens, num_chunks=3)
    scenario = Scenario(map_reduce.NAME, "mr/tiny", "tiny", params, (map_reduce.JCT,), "map_reduce", map_reduce.run, "")
    ctx = Context(
        scale=QUICK,
        corpus=TinyCorpus(Tokenizer(server.engine.model_folder)),
        rtt=RttModel((rtt_ms,)),
        servers={"tiny": server},
        clients={"tiny": lambda: SessionClient(server.url)},
        client_kind={"tiny": "sessions"},
        timeout_s=120.0,
    )
    return scenario, ctx


def test_map_reduce_runs_end_to_end_on_parrot_and_the_baseline(tiny_server: LocalServer) -> None:
    scenario, ctx = tiny_map_reduce(tiny_server, output_tokens=5, rtt_ms=20.0)
    configs = [
        Config("parrot", "Parrot", "tiny", parrot=True),
        Config("no_dag", "no DAG", "tiny", parrot=True, server_dag=False),
        Config("a", "(a)", "tiny", parrot=False),
    ]

    async def go() -> list[dict]:
        return [await run_unit(scenario, c, ctx) for c in configs]

    parrot, no_dag, baseline = asyncio.run(go())
    for record in (parrot, no_dag, baseline):
        assert "error" not in record and record["num_calls"] == 4, record.get("error")
        assert record["expected_output_tokens"] == record["generated_tokens"] == 20  # 3 maps + a reduce, 5 tokens each
        assert record["metrics"]["jct_s"] > 0.02  # at least one simulated round trip
        assert record["cpu_s"] > 0.0 and "vllm_timings_ms" not in record  # the engine runs in this process
        # its engine steps by kind (the sim's CPU fit): every row once, prompts and outputs but each call's last
        rows = sum(k["decode_rows"] + k["prefill_tokens"] for k in record["steps"].values())
        assert rows == record["prefill_tokens"] + 16
    assert [parrot["round_trips"], no_dag["round_trips"], baseline["round_trips"]] == [1, 2, 4]
    assert tiny_server.wait_idle().num_running == 0


def test_parrot_over_an_openai_upstream_runs_an_app(tiny_server: LocalServer) -> None:
    """The Parrot+vLLM configuration's path (`--with-vllm`), with Parrot's own OpenAI routes standing
    in for vLLM: a manager whose one engine is the adapter runs the SDK app; tokens are counted by
    the adapter; no KV peak is recorded (the adapter holds no KV)."""
    folder = tiny_server.engine.model_folder
    upstream = OpenAIUpstream(tiny_server.url, tiny_server.model, str(folder), api_key=API_KEY)
    parrot = ServerSpec("parrot", tiny_server.spec.engine, ManagerConfig())
    over = UpstreamServer(parrot_over(upstream, parrot)).start()
    try:
        assert [over.model, over.kv_reported] == ["tiny", False]
        params = map_reduce.Params(chunk_tokens=24, output_tokens=5, num_chunks=3)
        key = "mr/tiny"
        scenario = Scenario(map_reduce.NAME, key, "tiny", params, (map_reduce.JCT,), "map_reduce", map_reduce.run, "")
        ctx = Context(
            scale=QUICK,
            corpus=TinyCorpus(Tokenizer(folder)),
            rtt=RttModel((20.0,)),
            servers={"parrot_vllm": over},
            clients={"parrot_vllm": lambda: SessionClient(over.url)},
            client_kind={"parrot_vllm": "sessions"},
            timeout_s=120.0,
        )
        record = asyncio.run(run_unit(scenario, Config("parrot_vllm", "Parrot+vLLM", "parrot_vllm", True), ctx))
        assert "error" not in record, record.get("error")
        assert record["expected_output_tokens"] == record["generated_tokens"] == 20
        assert record["prefill_tokens"] > 0 and "peak_kv_tokens" not in record
        assert tiny_server.stats().num_decode_tokens >= 20  # the upstream did the generating
    finally:
        over.stop()


def test_salted_corpus_keeps_runs_apart(tiny_model_folder: Path) -> None:
    corpus = TinyCorpus(Tokenizer(tiny_model_folder))
    doc = corpus.documents(1, 0)[0]
    plain = corpus.chunks(doc, 16, 2)
    a, b = corpus.salted("chain/parrot_vllm-0"), corpus.salted("chain/d-0")
    assert a.chunks(doc, 16, 2) == [f"(run {salt_digits('chain/parrot_vllm-0')}) " + c for c in plain]
    assert b.truncate(doc.text, 8).startswith(f"(run {salt_digits('chain/d-0')}) ")
    assert len({a.salt_prefix, b.salt_prefix}) == 2  # runs apart
    assert len(corpus.tokenizer.encode(a.salt_prefix)) == len(corpus.tokenizer.encode(b.salt_prefix))
    assert corpus.chunks(doc, 16, 2) == plain  # the base corpus is unchanged
    assert a._ids is corpus._ids  # tokenizations are shared, not redone per run


def test_a_repeat_is_not_served_from_the_previous_runs_cache(tiny_server: LocalServer) -> None:
    """The server reuses prompt prefixes across requests; a repeat must still compute its prompts."""
    scenario, ctx = tiny_map_reduce(tiny_server, output_tokens=3, rtt_ms=1.0, chunk_tokens=96)
    ctx.clients["tiny"] = openai_factory(tiny_server.url, tiny_server.model)
    config = Config("c", "(c)", "tiny", parrot=False)

    async def go() -> list[dict]:
        return [await run_unit(scenario, config, ctx, repeat) for repeat in (0, 1)]

    first, second = asyncio.run(go())
    assert "error" not in first and "error" not in second
    assert second["prefill_tokens"] == first["prefill_tokens"] > 3 * 96


def test_another_scenario_on_the_same_document_is_not_served_from_the_cache(tiny_server: LocalServer) -> None:
    """Scenarios read the same documents (chain and map-reduce chunks): the salt names the scenario,
    so a request-level client whose server reuses prompt prefixes (64-token blocks) computes every
    prompt again."""
    scenario, ctx = tiny_map_reduce(tiny_server, output_tokens=3, rtt_ms=1.0, chunk_tokens=96)
    ctx.clients["tiny"] = openai_factory(tiny_server.url, tiny_server.model)
    twin = dataclasses.replace(scenario, key="mr/tiny-twin")
    config = Config("c", "(c)", "tiny", parrot=False)

    async def go() -> list[dict]:
        return [await run_unit(s, config, ctx) for s in (scenario, twin)]

    first, second = asyncio.run(go())
    assert "error" not in first and "error" not in second
    assert first["prefill_tokens"] > 3 * 96
    assert second["prefill_tokens"] >= first["prefill_tokens"]  # the twin's salt is a few tokens longer
