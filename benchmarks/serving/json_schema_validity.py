"""JSON-schema constrained output on the real model: does every output parse and validate?

    python -m benchmarks.serving.json_schema_validity [--model smollm2-135m] [--seeds 10] [--max-tokens 384]

Ten schemas (pydantic models: nested objects, arrays, enums, numbers with bounds, optional
fields) x `--seeds` sampled requests (temperature 0.7, each its own seed), all submitted at once
to the builtin engine as chat prompts asking for the object. Prints, per schema, how many outputs
parse as JSON and validate against the schema (pydantic's `model_validate_json`), and the finish
reasons; an output cut by max_tokens counts as a failure.
"""

from __future__ import annotations

import argparse
import collections
import time
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from parrot.engine import sync_client
from parrot.engine.config import EngineConfig
from parrot.engine.llm_engine import LLMEngine
from parrot.protocol import ExtendRequest, SamplingParams


class Person(BaseModel):
    name: str = Field(max_length=40)
    age: int = Field(ge=0, le=130)


class Address(BaseModel):
    street: str = Field(max_length=60)
    city: str = Field(max_length=40)
    zip_code: str = Field(pattern=r"^[0-9]{5}$")


class Customer(BaseModel):
    person: Person
    address: Address
    vip: bool


class Product(BaseModel):
    sku: str = Field(pattern=r"^[A-Z]{3}-[0-9]{4}$")
    price: float = Field(ge=0, le=10000)
    tags: list[str] = Field(max_length=4)


class Weather(BaseModel):
    city: str = Field(max_length=40)
    unit: Literal["celsius", "fahrenheit"]
    temperature: float = Field(ge=-80, le=60)


class Review(BaseModel):
    stars: int = Field(ge=1, le=5)
    summary: str = Field(max_length=80)
    recommend: bool


class Event(BaseModel):
    title: str = Field(max_length=50)
    day: Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
    attendees: list[Person] = Field(max_length=3)


class Step(BaseModel):
    n: int = Field(ge=1, le=20)
    action: str = Field(max_length=60)


class Recipe(BaseModel):
    dish: str = Field(max_length=40)
    servings: int = Field(ge=1, le=12)
    steps: list[Step] = Field(min_length=1, max_length=4)


class Ticket(BaseModel):
    priority: Literal["low", "medium", "high"]
    component: str = Field(max_length=30)
    estimate_hours: int | None = Field(default=None, ge=0, le=100)


class Answer(BaseModel):
    answer: Literal["yes", "no", "unsure"]
    confidence: float = Field(ge=0, le=1)


SCHEMAS: list[type[BaseModel]] = [Person, Address, Customer, Product, Weather, Review, Event, Recipe, Ticket, Answer]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=384)
    ap.add_argument("--temperature", type=float, default=0.7)
    args = ap.parse_args()
    engine = LLMEngine(EngineConfig(model=args.model))
    engine.start()
    tok = engine.tokenizer
    jobs = []
    t0 = time.perf_counter()
    for model in SCHEMAS:
        schema = model.model_json_schema()
        messages = [{"role": "user", "content": f"Give me an example {model.__name__} as a JSON object."}]
        prompt = tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True))
        for seed in range(args.seeds):
            sampling = SamplingParams(
                max_tokens=args.max_tokens, temperature=args.temperature, seed=seed, json_schema=schema
            )
            req = ExtendRequest(context_id=f"{model.__name__}-{seed}", token_ids=prompt, sampling=sampling)
            jobs.append((model, sync_client.submit(engine, req)))
    results: dict[str, list[bool]] = collections.defaultdict(list)
    finishes: collections.Counter[str] = collections.Counter()
    num_tokens = 0
    example: dict[str, str] = {}
    for model, handle in jobs:
        events = sync_client.wait(handle)
        text = "".join(e.text for e in events)
        finishes[str(events[-1].finish_reason)] += 1
        num_tokens += len(events)
        try:
            model.model_validate_json(text)
            ok = True
        except ValidationError:
            ok = False
        results[model.__name__].append(ok)
        example.setdefault(model.__name__, text)
    elapsed = time.perf_counter() - t0
    engine.stop()
    total = sum(sum(v) for v in results.values())
    print(f"model {args.model}, {len(jobs)} requests, temperature {args.temperature}, max_tokens {args.max_tokens}")
    for name, oks in results.items():
        print(f"  {name:9s} {sum(oks)}/{len(oks)} valid   e.g. {example[name][:90]}")
    print(f"valid: {total}/{len(jobs)}; finish reasons {dict(finishes)}; {num_tokens} tokens in {elapsed:.1f} s")


if __name__ == "__main__":
    main()
