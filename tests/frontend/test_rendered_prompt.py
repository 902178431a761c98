"""An SDK app's greedy output equals the same rendered prompt sent to /v1/completions (float32
tiny model: batch-invariant), because the manager fills the rendered prompt's own token ids."""

from __future__ import annotations

import httpx
from live_server import LiveServer

from parrot.frontend import Input, Output, SamplingParams, Session, semantic_function
from parrot.text import Tokenizer

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@semantic_function(sampling=GREEDY)
def solve(problem: Input, style: Input, answer: Output):
    """Problem: {{input:problem}}
    Style:{{input:style}} Answer:{{output:answer}}"""


def completion(server: LiveServer, prompt: str) -> str:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0.0, "ignore_eos": True}
    resp = httpx.post(server.url + "/v1/completions", json=body, headers={"Authorization": "Bearer k"}, timeout=60)
    assert resp.status_code == 200, resp.text
    return str(resp.json()["choices"][0]["text"])


def test_an_apps_output_equals_the_rendered_prompts_completion(server: LiveServer) -> None:
    tok = Tokenizer(server.engine.model_folder)
    cases = [("Plan a trip to Lisbon", " terse "), ("  indented, naïve café\n", "\nbullet points")]
    with Session(server.url, api_key="k"):
        outs = [solve(p, style) for p, style in cases]
        values = [o.get() for o in outs]
    num_changed = 0
    for (problem, style), value in zip(cases, values, strict=True):
        rendered = f"Problem: {problem}\nStyle:{style} Answer:"
        assert value == completion(server, rendered)
        # The boundaries do merge here: piece-by-piece ids are other ids, and lead elsewhere.
        pieces = ["Problem: ", problem, "\nStyle:", style, " Answer:"]
        piecewise = [t for piece in pieces for t in tok.encode(piece)]
        assert tok.encode(rendered) != piecewise
        num_changed += server.direct_generate(piecewise, GREEDY) != value
    assert num_changed >= 1
