"""The configurations the application benchmarks compare, derived from what the code base offers.

Parrot and the request-level baselines (a)-(c) run the same builtin engine and model; they differ
in the client (SDK vs one request per call), the engine's latency cap, and the manager's
optimizations. What the manager can switch off is read from `ManagerConfig` (boolean fields that
default to on, e.g. `scheduling.early_fill`, `sharing.prefix_sharing`, `scheduling.objective_deduction`)
and its policy registry, so the benchmark picks up optimizations as they land, and names the ones
that are missing.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from benchmarks.apps.deploy import ServerSpec
from parrot.engine.config import EngineConfig
from parrot.serve import ManagerConfig
from parrot.serve.config import SECTIONS
from parrot.serve.policy.registry import POLICIES

LATENCY_CAP_TOKENS = 128  # (a) and Parrot: batched tokens per step while latency-critical work decodes
KV_CACHE_BYTES = 512 << 20
APP_CENTRIC_POLICY = "app_centric"
SHARED_PREFIX_ATTENTION = "shared_prefix"


@dataclass(frozen=True)
class Config:
    key: str
    label: str
    server: str  # a ServerSpec name, or "vllm"
    parrot: bool  # runs the SDK version of the apps
    server_dag: bool = True
    optimization: str | None = None  # an ablation: the optimization it switches off (Scenario.ablations)
    about: str = ""

    @property
    def ablation(self) -> bool:
        return self.optimization is not None


@dataclass
class Plan:
    specs: list[ServerSpec]
    configs: list[Config]
    unavailable: list[str]
    prefix_field: str | None  # the path of the prefix-sharing switch ("sharing.prefix_sharing"), if any


# ManagerConfig switches (by field name) -> the optimization tags scenarios name (see Scenario.ablations).
SWITCH_TAGS = {"early_fill": "early_fill", "prefix_sharing": "prefix", "objective_deduction": "objective"}


def manager_switches() -> list[str]:
    """ManagerConfig's on/off optimizations: the paths of boolean fields that default to on, the mapped
    ones in SWITCH_TAGS's order (the order the ablations run and are reported in)."""
    paths = [f"{name}.{f.name}" for name, cls in SECTIONS.items() for f in fields(cls) if f.default is True]
    order = list(SWITCH_TAGS)
    return sorted(paths, key=lambda p: order.index(_leaf(p)) if _leaf(p) in order else len(order))


def _leaf(path: str) -> str:
    return path.rpartition(".")[2]


def _first(switches: list[str], *hints: str) -> str | None:
    return next((name for name in switches if any(h in name for h in hints)), None)


def plan_configs(
    model: str, dtype: str, threads: int, kv_cache_bytes: int = KV_CACHE_BYTES, tpot_target_ms: float | None = None
) -> Plan:
    """Every configuration and the servers they need. `tpot_target_ms` is Parrot's latency target
    (the app-centric policy's); the runner passes the time per output token that baseline (a)'s
    batch cap gives on this machine, so Parrot and (a) aim at the same latency."""
    default_attention = EngineConfig().attention

    def engine(cap: int | None, attention: str = default_attention) -> EngineConfig:
        return EngineConfig(
            model=model,
            dtype=dtype,
            latency_max_batched_tokens=cap,
            attention=attention,
            kv_cache_bytes=kv_cache_bytes,
            num_threads=threads,
        )

    unavailable: list[str] = []
    switches = manager_switches()
    prefix_field = _first(switches, "prefix")
    objective_field = _first(switches, "objective", "deduc")
    defaults = ManagerConfig()
    policy = APP_CENTRIC_POLICY if APP_CENTRIC_POLICY in POLICIES else defaults.scheduling.policy
    target_path = "scheduling.tpot_target_ms"
    target = {target_path: tpot_target_ms} if tpot_target_ms and _has_field(target_path) else {}
    parrot_manager = defaults.replace({"scheduling.policy": policy, **target})
    # Request-level serving knows nothing of applications: FIFO, no objectives, no prefix reuse ((c) adds it).
    plain = {path: False for path in (prefix_field, objective_field) if path}
    request_manager = defaults.replace({"scheduling.policy": "fifo", **plain})
    # Shared-prefix attention engages only on forked contexts, i.e. once the manager shares prefixes.
    attention = default_attention
    if prefix_field and SHARED_PREFIX_ATTENTION in _registered_backends():
        attention = SHARED_PREFIX_ATTENTION
    prefill = EngineConfig().latency_prefill_tokens
    cap = (
        f"engine caps a step at {LATENCY_CAP_TOKENS} tokens while latency-critical work decodes "
        f"({prefill} while it only prefills)"
    )
    goal = f"tpot_target_ms={tpot_target_ms:.0f}; " if target else ""
    specs = [
        ServerSpec("parrot", engine(LATENCY_CAP_TOKENS, attention), parrot_manager),
        ServerSpec("lat", engine(LATENCY_CAP_TOKENS), request_manager),
        ServerSpec("tput", engine(None), request_manager),
    ]
    configs = [
        Config(
            "parrot",
            "Parrot",
            "parrot",
            True,
            about=f"SDK, whole DAG per submission; policy {policy!r}; {goal}{cap}; {attention} attention",
        ),
        Config("a", "(a) latency", "lat", False, about=f"request-level client; FIFO; {cap}"),
        Config("b", "(b) throughput", "tput", False, about="request-level client; FIFO; no cap"),
    ]
    if prefix_field:
        apc = defaults.replace({"scheduling.policy": "fifo", **plain, prefix_field: True})
        specs.append(ServerSpec("apc", engine(None), apc))
        configs.append(Config("c", "(c) prefix reuse", "apc", False, about=f"as (b) with {_leaf(prefix_field)}=True"))

    def ablation(
        key: str, tag: str, label: str, engine_config: EngineConfig, manager: ManagerConfig, about: str
    ) -> None:
        specs.append(ServerSpec(key, engine_config, manager))
        configs.append(Config(key, label, key, True, optimization=tag, about=about))

    for path in switches:
        name = _leaf(path)
        if name not in SWITCH_TAGS:
            unavailable.append(
                f"ablation of ManagerConfig.{path}: no scenario is mapped to it (benchmarks/apps/configs.py)"
            )
            continue
        manager = defaults.replace({"scheduling.policy": policy, **target, path: False})
        label = f"Parrot w/o {name}"
        ablation(
            f"no_{name}", SWITCH_TAGS[name], label, engine(LATENCY_CAP_TOKENS, attention), manager, f"{name}=False"
        )
    if policy != "fifo":
        manager = defaults.replace({"scheduling.policy": "fifo", **target})
        label, about = "Parrot w/ FIFO policy", "policy='fifo' (no app-centric placement or capacity)"
        ablation("fifo", "policy", label, engine(LATENCY_CAP_TOKENS, attention), manager, about)
    else:
        unavailable.append(f"ablation: app-centric/affinity scheduling (the manager's policies: {sorted(POLICIES)})")
    if prefix_field and attention == SHARED_PREFIX_ATTENTION:
        paged = engine(LATENCY_CAP_TOKENS, "paged")
        ablation("paged", "attention", "Parrot w/ paged attention", paged, parrot_manager, "attention='paged'")
    else:
        unavailable.append(
            "ablation: shared-prefix attention (the manager does not share prefixes, so no context is forked and "
            f"the cascade never engages; every engine runs the default {default_attention!r} backend)"
        )
    configs.append(
        Config(
            "no_server_dag",
            "Parrot w/o server-side DAG",
            "parrot",
            True,
            server_dag=False,
            optimization="dag",
            about="the client gets each stage's outputs before submitting the next (a round trip per stage)",
        )
    )
    if objective_field is None:
        unavailable.append("ablation: objective deduction (no ManagerConfig switch: the manager does not deduce yet)")
    if prefix_field is None:
        unavailable.append(
            "ablation: prefix sharing (no ManagerConfig switch: the manager does not share prefixes yet)"
        )
    return Plan(specs, configs, unavailable, prefix_field)


def _has_field(path: str) -> bool:
    section, _, name = path.partition(".")
    return section in SECTIONS and any(f.name == name for f in fields(SECTIONS[section]))


def step_ms_at(profile: dict[int, float], num_tokens: int) -> float | None:
    """Step time at `num_tokens` batched tokens from an engine's step profile (power-of-two
    buckets), interpolated linearly between the measured buckets around it; None if not bracketed."""
    points = sorted((int(k), float(v)) for k, v in profile.items() if v > 0)
    below = [p for p in points if p[0] <= num_tokens]
    above = [p for p in points if p[0] >= num_tokens]
    if not below or not above:
        return None
    (b0, m0), (b1, m1) = below[-1], above[0]
    return m0 if b1 == b0 else m0 + (m1 - m0) * (num_tokens - b0) / (b1 - b0)


def _registered_backends() -> set[str]:
    """Attention backends the engine knows."""
    from parrot.engine.attention.registry import backend_names

    return set(backend_names())
