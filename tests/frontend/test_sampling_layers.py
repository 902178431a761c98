"""Sampling settings merge in layers: function, Output(...), the call's overrides (every output,
then per output); each level overrides only the fields it sets. Checked on the CallSpec the SDK
queues for the server."""

from __future__ import annotations

import pytest
from test_function import QueueOnlyCore

from parrot.frontend import Output, ParrotError, SamplingParams, semantic_function
from parrot.protocol.public_api import CallSpec


@semantic_function(sampling=SamplingParams(temperature=0.8, max_tokens=30, seed=1))
def qa(q: str, a: Output = Output(max_tokens=5), b: Output = Output(stop=["\n"], seed=2)):  # noqa: B008
    """Q: {{input:q}} A:{{output:a}} B:{{output:b}}"""


def sent(fn: object, *args: object) -> CallSpec:
    core = QueueOnlyCore()
    fn.invoke(core, *args)  # type: ignore[attr-defined]
    call = core._queue[-1][0]
    assert isinstance(call, CallSpec)
    return call


def test_an_output_overrides_only_what_it_sets() -> None:
    # Output(max_tokens=5) sets max_tokens only: the function's temperature stays.
    assert qa.sampling == {
        "a": SamplingParams(temperature=0.8, max_tokens=5, seed=1),
        "b": SamplingParams(temperature=0.8, max_tokens=30, seed=2, stop=["\n"]),
    }
    assert qa.default_sampling == SamplingParams(temperature=0.8, max_tokens=30, seed=1)
    # A SamplingParams given to Output layers the same way: only its explicit fields count.
    explicit = Output(SamplingParams(max_tokens=3))
    assert explicit.settings == {"max_tokens": 3}


def test_the_calls_overrides_sit_on_top_and_reach_the_callspec() -> None:
    hot = qa.with_sampling(temperature=0.3, outputs={"b": {"max_tokens": 9, "seed": 7}})
    call = sent(hot, "why?")
    assert call.sampling == {
        "a": SamplingParams(temperature=0.3, max_tokens=5, seed=1),
        "b": SamplingParams(temperature=0.3, max_tokens=9, seed=7, stop=["\n"]),
    }
    assert call.default_sampling == SamplingParams(temperature=0.3, max_tokens=30, seed=1)
    # Chained overrides layer again; the function itself is unchanged.
    colder = hot.with_sampling(temperature=0.0, outputs={"b": {"seed": 8}})
    assert colder.sampling["b"] == SamplingParams(temperature=0.0, max_tokens=9, seed=8, stop=["\n"])
    assert sent(qa, "why?").sampling == qa.sampling
    assert qa.sampling["a"].temperature == 0.8


def test_function_defaults_may_be_a_mapping() -> None:
    @semantic_function(sampling={"temperature": 0.5, "max_tokens": 8})
    def one(q: str, a: Output = Output(max_tokens=2)):  # noqa: B008
        """{{input:q}}{{output:a}}"""

    assert one.sampling == {"a": SamplingParams(temperature=0.5, max_tokens=2)}
    assert sent(one.with_sampling(top_k=4), "x").sampling == {
        "a": SamplingParams(temperature=0.5, max_tokens=2, top_k=4)
    }


def test_unknown_or_invalid_settings_name_the_field() -> None:
    with pytest.raises(ParrotError, match="unknown sampling setting 'temprature'") as e:
        qa.with_sampling(temprature=0.7)
    assert e.value.field == "qa.with_sampling.temprature"
    with pytest.raises(ParrotError, match="sampling setting 'temperature': Input should be greater") as e:
        qa.with_sampling(outputs={"a": {"temperature": -1}})
    assert e.value.field == "qa.with_sampling.outputs.a.temperature"
    with pytest.raises(ParrotError, match="no output 'c'") as e:
        qa.with_sampling(outputs={"c": {"max_tokens": 1}})
    assert e.value.field == "outputs.c"
    with pytest.raises(ParrotError, match="unknown sampling setting 'max_token'") as e:
        Output(max_token=5)
    assert e.value.field == "Output.max_token"
    with pytest.raises(ParrotError, match="'top_p'") as e:

        @semantic_function(sampling={"top_p": 0})
        def bad(q: str, a: Output):
            """{{input:q}}{{output:a}}"""

    assert e.value.field == "bad.sampling.top_p"
