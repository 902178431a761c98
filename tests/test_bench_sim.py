"""The simulator suite: its comparison arithmetic (ratios against the paper's ranges) and its apps
run end to end by both kinds of client."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from benchmarks.apps.baselines import render_prompt
from benchmarks.apps.workloads import multi_agent
from benchmarks.common.netsim import RttModel
from benchmarks.common.paper import load_paper_workloads
from benchmarks.sim import paper as sim_paper
from benchmarks.sim.cluster import CONFIGS, AppResult, Call, Cluster, Input, Ref, run_app, tokenizer_folder
from benchmarks.sim.fit_cpu import profile_toml, step_groups
from benchmarks.sim.paper import difference, ratio_of, sustainable_rate
from benchmarks.sim.suite import GPTS_THRESHOLD_MS, Comparison, Result, points
from benchmarks.sim.words import Words
from benchmarks.sim.workloads import run_gpts, template_call
from parrot.protocol.template import escape_text
from parrot.sim import profiles
from parrot.sim.loop import run_virtual
from parrot.sim.profiles import setup
from parrot.text import Tokenizer


def test_difference_is_zero_inside_the_range_and_relative_to_the_nearest_bound() -> None:
    assert [difference(1.2, 1.18, 1.38), difference(1.0, 2.0, 2.5), difference(3.0, 2.0, 2.5)] == [0.0, -0.5, 0.2]


def test_ratio_is_the_largest_baseline_over_parrot_across_points() -> None:
    c = Comparison("Fig", "x", ("p/1", "p/2"), "jct_s", "b", 1.0, 2.0)
    table = {
        ("p/1", "parrot"): {"jct_s": 2.0},
        ("p/1", "b"): {"jct_s": 3.0},
        ("p/2", "parrot"): {"jct_s": 1.0},
        ("p/2", "b"): {"jct_s": 4.0},
    }
    assert ratio_of(c, table) == 4.0


def test_sustainable_rate_ratio() -> None:
    c = Comparison("Fig", "x", ("g/1", "g/4", "g/16"), "norm_latency_ms", "c", 12.0, 12.0, True)
    table = {
        ("g/1", "parrot"): {"norm_latency_ms": 30.0},
        ("g/4", "parrot"): {"norm_latency_ms": 40.0},
        ("g/16", "parrot"): {"norm_latency_ms": 150.0},
        ("g/1", "c"): {"norm_latency_ms": 90.0},
        ("g/4", "c"): {"norm_latency_ms": 120.0},
    }
    # Parrot crosses 100 ms/token between 4 and 16 req/s: 4 x 4^(60/110); the baseline between 1 and
    # 4: 4^(10/30); its 16 req/s point was not run (over at a lower rate) and counts as over.
    assert sustainable_rate(c, table, "parrot") == pytest.approx(4 * 4 ** (60 / 110))
    assert sustainable_rate(c, table, "c") == pytest.approx(4 ** (10 / 30))
    assert ratio_of(c, table) == pytest.approx(4 * 4 ** (60 / 110) / 4 ** (10 / 30))
    # Never over: the highest rate swept (a lower bound); over at the lowest: none.
    table[("g/16", "parrot")] = {"norm_latency_ms": 90.0}
    assert sustainable_rate(c, table, "parrot") == 16.0
    table[("g/1", "parrot")] = {"norm_latency_ms": 101.0}
    assert sustainable_rate(c, table, "parrot") is None


@pytest.mark.parametrize("config", ["a", "parrot"])
def test_a_two_call_chain_runs_on_the_simulated_cpu(config: str) -> None:
    # Both client kinds over the simulator: request by request (a) and the whole DAG (Parrot).
    calls = [
        Call(("Summarize: ", Input("alpha beta gamma"), "\nSummary:"), "s", 4),
        Call(("Refine: ", Ref("s"), "\nBetter:"), "t", 4),
    ]

    async def main() -> AppResult:
        async with Cluster(setup("cpu-smollm2"), CONFIGS[config]) as cluster:
            return await run_app(cluster, calls, ["t"], RttModel((10.0,)).sampler("t"))

    result = run_virtual(main())
    assert result.values == {"t": " the" * 4}
    assert result.latency_s > 0.01  # a round trip of 10 ms at least, in virtual time


def test_a_template_call_renders_the_real_apps_prompt() -> None:
    """The simulated multi-agent app is built from the real app's templates, placeholders bound."""
    params = multi_agent.Params(num_files=2, context_tokens=8, rounds=())
    templates = multi_agent.Templates(params, escape_text("a {context} with braces"))
    template, inputs = templates.branch("reviser", 1, with_reviews=True)
    values = {name: f"<{name}>" for name in inputs}
    call = template_call(template, {n: Ref(f"out-{n}") for n in inputs}, "r", 7)
    rendered = "".join(p if isinstance(p, str) else values[p.name.removeprefix("out-")] for p in call.pieces)
    assert rendered == render_prompt(template, values)
    assert [p.name for p in call.pieces if isinstance(p, Ref)] == [f"out-{n}" for n in inputs]
    assert call.output == "r"
    assert call.max_tokens == 7


def gpts_latency(config: str, warm: bool) -> float:
    apps = [{"app_name": "A", "prompt_length": 400, "query_length": 4, "output_length": 8}]

    async def main() -> dict[str, float]:
        async with Cluster(setup("cpu-smollm2"), CONFIGS[config]) as cluster:
            words = Words(Tokenizer(tokenizer_folder()))
            rtt = RttModel((0.0,)).sampler("g")
            return await run_gpts(cluster, rtt, words, apps, 1.0, 2, schedule=[(0.0, 0), (5.0, 0)], warm=warm)

    return run_virtual(main())["norm_latency_ms"]


def test_gpts_warm_up_puts_the_system_prompt_in_the_prefix_cache_before_the_clock() -> None:
    # Parrot shares the system prompt: warmed, the first measured request does not compute it.
    assert gpts_latency("parrot", warm=True) < 0.8 * gpts_latency("parrot", warm=False)
    # Without prefix sharing every request computes it: the warm-up changes nothing measured.
    assert gpts_latency("a", warm=True) == pytest.approx(gpts_latency("a", warm=False), rel=1e-6)


def test_the_cpu_fit_becomes_the_cost_models_terms() -> None:
    """The AMD AVX512 fit (15.1 ms a step, 0.679 ms a prefill token, 1.38 ms a decoded
    row) gives hardware.toml's [cpu-2core]: 2 x 106.2M body FLOPs in 0.679 ms is 0.313 TFLOP/s,
    the 269 MB of weights at 20 GB/s are 13.45 ms of the step, a row's 2 x 134.5M FLOPs 0.86 ms."""
    toml = profile_toml("cpu-2core", profiles.model("smollm2-135m"), 15.1, 0.679, 1.38, 20.0)
    fitted = dict(line.split(" = ") for line in toml.splitlines()[1:])
    hw = profiles.hardware("cpu-2core")
    assert float(fitted["peak_tflops"]) == pytest.approx(hw.peak_tflops, abs=0.001)
    assert float(fitted["mem_bw_gbps"]) == hw.mem_bw_gbps
    assert float(fitted["step_overhead_ms"]) == pytest.approx(hw.step_overhead_ms, abs=0.05)
    assert float(fitted["row_overhead_ms"]) == pytest.approx(hw.row_overhead_ms, abs=0.01)
    # A step faster than its weights at that bandwidth: the bandwidth is lowered, no overhead left.
    fp32 = profile_toml("x", profiles.model("smollm2-135m-fp32"), 20.0, 2.0, 3.0, 20.0)
    assert "step_overhead_ms = 0.00" in fp32 and "mem_bw_gbps = 26.9" in fp32


def test_the_fit_reads_a_step_profile_or_an_application_benchmarks_builtin_runs() -> None:
    kinds = {"decode": {"steps": 3, "seconds": 0.1, "decode_rows": 3, "prefill_tokens": 0}}
    assert step_groups([{"scenario": "chain_summary/alone", "kinds": kinds}], set()) == [kinds]
    records = [
        {"scenario": "gpts/rate2", "config": "parrot", "steps": kinds},
        {"scenario": "gpts/rate4", "config": "a", "steps": kinds, "error": "TimeoutError: "},  # failed: left out
        {"scenario": "copilot/n6", "config": "parrot", "steps": kinds},  # held out
        {"scenario": "gpts/rate2", "config": "d", "metrics": {}},  # vLLM: no builtin engine steps
    ]
    assert step_groups({"records": records}, {"gpts", "map_reduce"}) == [kinds]


def test_a_gpts_sweep_stops_a_configuration_past_its_limit_and_others_do_not() -> None:
    pts = {p.key: p for p in points(load_paper_workloads(), quick=True)}
    gpts, chain = pts["gpts/4"], next(p for k, p in pts.items() if k.startswith("chain/"))
    assert gpts.stop_over == ("norm_latency_ms", GPTS_THRESHOLD_MS)
    assert chain.stop_over is None

    def result(point: str, latency: float) -> Result:
        return Result(point, "b", {"norm_latency_ms": latency, "jct_s": 1e9}, 1.0, 1.0)

    assert sim_paper.past_limit(gpts, result("gpts/4", GPTS_THRESHOLD_MS + 1))
    assert not sim_paper.past_limit(gpts, result("gpts/4", GPTS_THRESHOLD_MS))
    assert not sim_paper.past_limit(chain, result(chain.key, 1e9))


def test_finished_applications_leave_no_reference_cycles() -> None:
    # What the manager makes for an application is freed by reference counting when the app ends:
    # the collector (parrot/web/heap.py) never has garbage of theirs to find, so collecting rarely
    # costs no memory. Checked over the whole path: sessions, the DAG, runs on simulated engines.
    from benchmarks.sim.cluster import run_parrot
    from benchmarks.sim.scale import app_calls

    words = Words(Tokenizer(tokenizer_folder()))
    system = words.text("cycles/system", 64)
    rtt = RttModel((0.0,)).sampler("cycles")

    async def main() -> tuple[int, list[str]]:
        async with Cluster(setup("a100-13b"), CONFIGS["parrot"], 4) as cluster:
            warm = [app_calls(words, system, i) for i in range(8)]
            await asyncio.gather(*(run_parrot(cluster.manager, c, [c[-1].output], rtt) for c in warm))
            gc.collect()  # what start-up and the first apps left (caches, pools)
            gc.disable()
            try:
                apps = [app_calls(words, system, i) for i in range(8, 48)]
                results = await asyncio.gather(*(run_parrot(cluster.manager, c, [c[-1].output], rtt) for c in apps))
                gc.set_debug(gc.DEBUG_SAVEALL)
                found = gc.collect()
                kinds = sorted({type(o).__qualname__ for o in gc.garbage})
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
                gc.enable()
            assert all(r.values for r in results)
            return found, kinds

    found, kinds = run_virtual(main())
    assert kinds == []
    assert found == 0


def test_a_step_computes_only_dirty_views_and_lists_only_calls_a_policy_can_act_on() -> None:
    # A chain whose consumer starts with its producer's output: nothing of it can be filled early,
    # so while the producer waits or runs the consumer is in no snapshot (the policy could do
    # nothing with it); each call is listed once, when it can be dispatched. A step recomputes
    # the views of the calls marked dirty only: after the first (both new), the consumer's.
    calls = [
        Call(("Summarize: ", Input("alpha beta"), "\nSummary:"), "x", 4),
        Call((Ref("x"), "\nRefined:"), "y", 4),
    ]

    async def main() -> tuple[list[list[str]], list[list[str]], dict[str, str]]:
        async with Cluster(setup("a100-13b"), CONFIGS["parrot"], 1) as cluster:
            executor = cluster.manager.executor
            updated: list[list[str]] = []
            listed: list[list[str]] = []
            real_step, real_update, real_plan = executor.step, executor._views.update, executor.policy.plan

            def step() -> Any:
                updated.append([])
                return real_step()

            def update(key: Any, variables: Any, run: Any) -> None:
                updated[-1].append(key[1])
                real_update(key, variables, run)

            def plan(snapshot: Any) -> Any:
                listed.append([c.key[1] for c in snapshot.calls])
                return real_plan(snapshot)

            executor.step, executor._views.update, executor.policy.plan = step, update, plan  # type: ignore[method-assign]
            result = await run_app(cluster, calls, ["y"], RttModel((0.0,)).sampler("t"))
            return updated, listed, result.values

    updated, listed, values = run_virtual(main())
    assert values == {"y": " the" * 4}
    assert listed[0] == ["c0"]
    assert [ids for ids in listed if ids] == [["c0"], ["c1"]]
    assert updated[0] == ["c0", "c1"]
    later = [ids for ids in updated[1:] if ids]
    assert later and all(ids == ["c1"] for ids in later)
