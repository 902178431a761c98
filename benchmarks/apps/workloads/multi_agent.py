"""Multi-agent programming (MetaGPT-style, the paper's Fig. 17): an architect writes a design,
then rounds of per-file branches (coder, reviewer, reviser) each read a long shared prefix built
from generated text (the design and the code so far) plus a short file-specific suffix. Each
round is a barrier: a reviewer reads every file's code.

Parrot submits every round at once: each branch's template names the variables of the shared
prefix, so the manager can see the prefix is shared (once prefix sharing lands) and runs a round
the moment its inputs exist. The request-level client renders each branch's full prompt after the
previous round came back. Metrics: completion time; peak KV memory is recorded by the runner.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from benchmarks.apps.baselines import render_prompt
from benchmarks.apps.scaling import Scale
from benchmarks.apps.workloads.common import Corpus, Metric, Outcome, Scenario, Stage, Target, now, semantic
from parrot.frontend import SemanticVariable

NAME = "multi_agent"
JCT = Metric("jct_s", "completion time", "s")

FILE_SPECS = (
    "the command-line entry point",
    "the configuration loader",
    "the data models",
    "the storage layer",
    "the HTTP handlers",
    "the scheduler",
    "the logging helpers",
    "the unit tests",
)
ROLES = {
    "coder": "Write the complete code of",
    "reviewer": "Review the code of",
    "reviser": "Revise, following the reviews, the code of",
}


@dataclass(frozen=True)
class Round:
    role: str  # "architect" | "coder" | "reviewer" | "reviser"
    output_tokens: tuple[int, ...]  # per file (one entry for the architect)


@dataclass(frozen=True)
class Params:
    num_files: int
    context_tokens: int  # constant project context at the start of every prompt (the architect's prompt)
    rounds: tuple[Round, ...]

    @property
    def num_calls(self) -> int:
        return sum(1 if r.role == "architect" else self.num_files for r in self.rounds)

    @property
    def num_output_tokens(self) -> int:
        return sum(r.output_tokens[0] if r.role == "architect" else sum(self.outs(r)) for r in self.rounds)

    def outs(self, r: Round) -> list[int]:
        return [r.output_tokens[i % len(r.output_tokens)] for i in range(self.num_files)]


def params_for(scale: Scale, paper: dict, num_files: int) -> Params:
    shape = paper[NAME]
    rounds = []
    for index in scale.agent_rounds:
        if index == 0:
            rounds.append(Round("architect", (scale.output_len(shape["round0"]["output_tokens"]),)))
        else:
            r = shape["rounds"][index - 1]
            rounds.append(Round(r["role"], tuple(scale.output_len(n) for n in r["output_tokens"])))
    design_tokens = rounds[0].output_tokens[0]
    context = max(1, scale.prompt_len(shape["rounds"][0]["shared_prefix_tokens"]) - design_tokens)
    return Params(num_files, context, tuple(rounds))


def scenarios(scale: Scale, paper: dict) -> list[Scenario]:
    shape = paper[NAME]
    out = []
    for n in scale.agent_files:
        params = params_for(scale, paper, n)
        scaling = (
            f"{n} files (paper: {shape['files']}), rounds {list(scale.agent_rounds)} (paper: 0,1,2,3 then 2,3 x3), "
            f"outputs {params.rounds[1].output_tokens[0]}-{max(max(r.output_tokens) for r in params.rounds)} tokens "
            f"(paper: 231-1100), shared prefix {params.context_tokens}+ tokens (paper: 3534-5352)"
        )
        plots = (("multi_agent", "number of files", float(n)),) if len(scale.agent_files) > 1 else ()
        out.append(
            Scenario(
                NAME,
                f"{NAME}/files{n}",
                f"multi-agent, {n} files",
                params,
                (JCT,),
                NAME,
                run,
                scaling,
                plots,
                ("prefix", "attention", "early_fill", "dag"),
            )
        )
    return out


class Templates:
    """The prompt of every branch: constant context, the shared generated prefix, a file suffix."""

    def __init__(self, params: Params, context: str) -> None:
        self.params = params
        self.context = context

    def architect(self) -> str:
        return (
            f"Project context:\n{self.context}\n\nYou are the architect. Write the design.\nDesign:{{{{output:out}}}}"
        )

    def branch(self, role: str, file_index: int, with_reviews: bool) -> tuple[str, list[str]]:
        """The template of `role` for one file, and its input names in order."""
        n = self.params.num_files
        inputs, body = ["design"], ""
        if role != "coder":  # reviewers and revisers read every file's latest code
            inputs += [f"code{j}" for j in range(n)]
            body += "".join(f"File {j + 1} code:\n{{{{input:code{j}}}}}\n\n" for j in range(n))
        if with_reviews:
            inputs += [f"review{j}" for j in range(n)]
            body += "".join(f"File {j + 1} review:\n{{{{input:review{j}}}}}\n\n" for j in range(n))
        spec = FILE_SPECS[file_index % len(FILE_SPECS)]
        suffix = f"You are the {role}. {ROLES[role]} file {file_index + 1}, {spec}.\n{role.capitalize()}:"
        template = (
            f"Project context:\n{self.context}\n\nDesign:\n{{{{input:design}}}}\n\n{body}{suffix}{{{{output:out}}}}"
        )
        return template, inputs


async def run(params: Params, target: Target, corpus: Corpus) -> Outcome:
    doc = corpus.documents(3, params.context_tokens)[2]
    templates = Templates(params, corpus.truncate(doc.text, params.context_tokens))
    app = _parrot_app if target.is_parrot else _baseline_app
    jct = await app(params, target, templates)
    return Outcome({"jct_s": jct}, params.num_calls, params.num_output_tokens)


async def _parrot_app(params: Params, target: Target, templates: Templates) -> float:
    start = now()
    async with target.session() as session:
        stage = Stage(target)
        await stage.start()
        state: dict[str, SemanticVariable] = {}
        last: list[SemanticVariable] = []
        for r in params.rounds:
            if last:
                await stage.barrier(last)
            if r.role == "architect":
                fn = semantic("architect", templates.architect(), [], "out", r.output_tokens[0])
                state["design"] = last_one = fn.invoke(session.core)
                last = [last_one]
                continue
            outputs = []
            for i in range(params.num_files):
                template, inputs = templates.branch(r.role, i, r.role == "reviser")
                fn = semantic(f"{r.role}{i}", template, inputs, "out", params.outs(r)[i])
                outputs.append(fn.invoke(session.core, *(state[name] for name in inputs)))
            prefix = "review" if r.role == "reviewer" else "code"
            state.update({f"{prefix}{i}": v for i, v in enumerate(outputs)})
            last = outputs
        await stage.finish(last)
        end = now()
    return end - start


async def _baseline_app(params: Params, target: Target, templates: Templates) -> float:
    client = target.request_client()
    start = now()
    state: dict[str, str] = {}
    for r in params.rounds:
        if r.role == "architect":
            state["design"] = (await client.complete(render_prompt(templates.architect(), {}), r.output_tokens[0])).text
            continue
        calls = []
        for i in range(params.num_files):
            template, inputs = templates.branch(r.role, i, r.role == "reviser")
            prompt = render_prompt(template, {name: state[name] for name in inputs})
            calls.append(client.complete(prompt, params.outs(r)[i]))
        answers = await asyncio.gather(*calls)
        prefix = "review" if r.role == "reviewer" else "code"
        state.update({f"{prefix}{i}": a.text for i, a in enumerate(answers)})
    return now() - start
