"""LangChain models backed by Parrot: each model call is a semantic call, its reply a Semantic Variable.

    from parrot.frontend import Session
    from parrot.integrations.langchain import ChatParrot, resolver

    with Session(url) as s:
        llm = ChatParrot(session=s, lazy=True, max_tokens=64)
        summarize = ChatPromptTemplate.from_template("Summarize: {chunk}") | llm | StrOutputParser()
        combine = ChatPromptTemplate.from_template("Combine:\\n{summaries}") | llm | StrOutputParser()
        chain = summarize.map() | (lambda ss: {"summaries": "\\n".join(ss)}) | combine | resolver(s)
        print(chain.invoke([{"chunk": c} for c in chunks]))

With `lazy=True` a model call returns at once: its message's content is the marker of the reply's
variable (`str(var)`, parrot.frontend.markers), not its text. LangChain passes it along as text;
the next prompt template formats it into the next call's prompt, and the SDK turns it back into the
variable. So a chain of prompt templates becomes one DAG on the server: every call is submitted
before its producers finish, and the manager runs each as soon as its inputs are set, with no
client round trip. `resolve` / `aresolve` / `resolver(session)` (a runnable for the chain's end)
replace markers by the values: the only waits. Without `lazy` (the default) a call waits for its
reply, as any LangChain model does; `stream` always streams the reply's text.

Tool calling (`bind_tools`) renders the tools into the prompt and constrains the reply to a JSON
schema of tool calls (langchain_format.py); a tool-bound call always waits, since the client runs
the tools. `with_structured_output` constrains the reply to the schema (`json_schema` sampling)
and parses it (a lazy reply is resolved first). Models take a `Session` (sync and async LangChain
methods both work) or an `AsyncSession` (async methods only).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, Literal

from langchain_core.caches import BaseCache
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, BaseLLM
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, SystemMessage
from langchain_core.outputs import (
    ChatGeneration,
    ChatGenerationChunk,
    ChatResult,
    Generation,
    GenerationChunk,
    LLMResult,
)
from langchain_core.runnables import Runnable, RunnableLambda
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from pydantic import BaseModel, ConfigDict, Field

from parrot.frontend.core import SessionCore
from parrot.frontend.function import SemanticFunction
from parrot.frontend.markers import VarRef, split_markers
from parrot.frontend.outputs import schema_parser
from parrot.frontend.variable import SemanticVariable
from parrot.integrations.langchain_format import (
    ChatFormat,
    chatml,
    message_text,
    tool_call_schema,
    tool_reply,
    tools_prompt,
)
from parrot.protocol.errors import ParrotError

_SAMPLING_KWARGS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "json_schema", "regex", "choices")


@functools.lru_cache(maxsize=64)
def _completion(model: str | None) -> SemanticFunction:
    """The one template of every LangChain call: the prompt (text with markers), then the reply."""
    return SemanticFunction("langchain", "{{input:prompt}}{{output:text}}", ["prompt"], {"text": None}, model=model)


class _ParrotModel(BaseModel):
    """What both models share: the session, lazy replies, sampling settings, submitting a call."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    session: Any = Field(exclude=True, description="a parrot.frontend Session or AsyncSession")
    lazy: bool = False
    parrot_model: str | None = None  # an engine's model (default: the manager's first)
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: list[str] | None = None
    sampling: dict[str, Any] = Field(default_factory=dict)  # any other SamplingParams settings
    # No LangChain response cache: a lazy reply names one call's variable in one session.
    cache: BaseCache | bool | None = Field(default=False, exclude=True)

    @property
    def core(self) -> SessionCore:
        core = getattr(self.session, "core", None)
        if not isinstance(core, SessionCore):
            raise ParrotError("the model's session is not open", status=410, field="session")
        return core

    def _settings(self, stop: list[str] | None, kwargs: dict[str, Any]) -> dict[str, Any]:
        settings = dict(self.sampling)
        for name in ("max_tokens", "temperature", "top_p", "seed"):
            if getattr(self, name) is not None:
                settings[name] = getattr(self, name)
        if stop or self.stop:
            settings["stop"] = list(stop or self.stop or [])
        for key, value in kwargs.items():
            if key in _SAMPLING_KWARGS:
                if value is not None:
                    settings[key] = value
            elif key not in ("tools", "tool_choice") and not key.startswith("ls_"):
                raise ParrotError(f"a Parrot model takes no argument {key!r}", field=key)
        return settings

    def _submit(self, prompt: str, settings: dict[str, Any]) -> SemanticVariable:
        """Submit one call (its prompt's markers become inputs); its reply's variable at once."""
        var: SemanticVariable = _completion(self.parrot_model).with_sampling(**settings).invoke(self.core, prompt)
        return var

    def resolve(self, value: Any) -> Any:
        return resolve(value, self.session)

    async def aresolve(self, value: Any) -> Any:
        return await aresolve(value, self.session)


class ChatParrot(_ParrotModel, BaseChatModel):
    """A LangChain chat model on a Parrot session (module docstring)."""

    chat_format: ChatFormat = chatml  # messages -> prompt text
    disable_streaming: bool | Literal["tool_calling"] = "tool_calling"  # a tool call is parsed whole

    @property
    def _llm_type(self) -> str:
        return "parrot-chat"

    def _start(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]) -> tuple[Any, bool]:
        settings = self._settings(stop, kwargs)
        tools, tool_choice = kwargs.get("tools"), kwargs.get("tool_choice")
        if tools and tool_choice != "none":
            settings["json_schema"] = tool_call_schema(tools, tool_choice)
            messages = [SystemMessage(tools_prompt(tools, tool_choice)), *messages]
        return self._submit(self.chat_format(messages), settings), bool(tools and tool_choice != "none")

    def _message(self, var: SemanticVariable, text: str | None, with_tools: bool) -> ChatResult:
        if with_tools:
            assert text is not None
            message = tool_reply(text, f"call_{self.core.key}_{var.var_id}")
        else:
            message = AIMessage(content=str(var) if text is None else text)
        message.response_metadata = {"parrot_var_id": var.var_id, "parrot_session_key": self.core.key}
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        var, with_tools = self._start(messages, stop, kwargs)
        return self._message(var, None if self.lazy and not with_tools else var.get(), with_tools)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        var, with_tools = self._start(messages, stop, kwargs)
        return self._message(var, None if self.lazy and not with_tools else await var.aget(), with_tools)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        var, _ = self._start(messages, stop, kwargs)
        for text in var.stream():
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=text))
            if run_manager is not None:
                run_manager.on_llm_new_token(text, chunk=chunk)
            yield chunk

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        var, _ = self._start(messages, stop, kwargs)
        async for text in var.astream():
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=text))
            if run_manager is not None:
                await run_manager.on_llm_new_token(text, chunk=chunk)
            yield chunk

    def bind_tools(
        self, tools: Sequence[dict[str, Any] | type | Any], *, tool_choice: str | bool | None = None, **kwargs: Any
    ) -> Runnable[Any, AIMessage]:
        """This model with `tools` (functions, pydantic classes, BaseTools or OpenAI tool dicts):
        replies are tool calls or answers, constrained to their JSON schema. `tool_choice`: None or
        "auto" (call or answer), "any"/"required"/True (call some tool), a tool's name, "none"."""
        formatted = [convert_to_openai_tool(t) for t in tools]
        choice = "any" if tool_choice is True else tool_choice or None
        tool_call_schema(formatted, choice if isinstance(choice, str) else None)  # a bad choice fails here
        return self.bind(tools=formatted, tool_choice=choice, **kwargs)

    def with_structured_output(
        self, schema: dict[str, Any] | type, *, include_raw: bool = False, **kwargs: Any
    ) -> Runnable[Any, Any]:
        """Replies constrained to `schema` (a pydantic class, a JSON schema, a TypedDict or an
        OpenAI function schema) and parsed: the model instance, or the JSON value. With
        `include_raw`: {"raw": message, "parsed": value or None, "parsing_error": error or None}."""
        if kwargs:
            raise ParrotError(f"with_structured_output takes no argument {next(iter(kwargs))!r}", field="kwargs")
        is_model = isinstance(schema, type) and issubclass(schema, BaseModel)
        is_json_schema = isinstance(schema, dict) and ("type" in schema or "anyOf" in schema)
        json_schema = schema if is_model or is_json_schema else convert_to_json_schema(schema)
        js, parse = schema_parser(json_schema)  # type: ignore[arg-type]
        session = self.session

        def finish(message: BaseMessage, text: str) -> Any:
            try:
                parsed = parse(text)
            except ParrotError as e:
                if not include_raw:
                    raise
                return {"raw": message, "parsed": None, "parsing_error": e}
            return {"raw": message, "parsed": parsed, "parsing_error": None} if include_raw else parsed

        def run(message: BaseMessage) -> Any:
            return finish(message, resolve(message_text(message), session))

        async def arun(message: BaseMessage) -> Any:
            return finish(message, await aresolve(message_text(message), session))

        parser = RunnableLambda(run, afunc=arun, name="parrot_structured_output")
        return self.bind(json_schema=js) | parser


class ParrotLLM(_ParrotModel, BaseLLM):
    """A LangChain text-completion model on a Parrot session: the prompt as it is, then the reply.
    A batch of prompts is submitted together before any reply is awaited."""

    @property
    def _llm_type(self) -> str:
        return "parrot"

    def _generate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        settings = self._settings(stop, kwargs)
        variables = [self._submit(p, settings) for p in prompts]
        texts = [str(v) if self.lazy else v.get() for v in variables]
        return LLMResult(generations=[[Generation(text=t)] for t in texts])

    async def _agenerate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        settings = self._settings(stop, kwargs)
        variables = [self._submit(p, settings) for p in prompts]
        texts = [str(v) for v in variables] if self.lazy else await asyncio.gather(*(v.aget() for v in variables))
        return LLMResult(generations=[[Generation(text=t)] for t in texts])

    def _stream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[GenerationChunk]:
        for text in self._submit(prompt, self._settings(stop, kwargs)).stream():
            if run_manager is not None:
                run_manager.on_llm_new_token(text)
            yield GenerationChunk(text=text)

    async def _astream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[GenerationChunk]:
        async for text in self._submit(prompt, self._settings(stop, kwargs)).astream():
            if run_manager is not None:
                await run_manager.on_llm_new_token(text)
            yield GenerationChunk(text=text)


# --- resolving markers into values ----------------------------------------------------------------


def _variable(session: Any, ref: VarRef) -> SemanticVariable:
    core: SessionCore = session.core
    if ref.session_key != core.key:
        raise ParrotError(f"variable {ref.var_id!r} belongs to another session", field="session_id")
    return core.lookup(ref.var_id)


def resolve(value: Any, session: Any) -> Any:
    """`value` with every variable marker replaced by the variable's text (waiting for it): in
    text, messages' content, lists, tuples and dicts; a SemanticVariable becomes its value."""
    if isinstance(value, str):
        parts = split_markers(value)
        if not any(isinstance(p, VarRef) for p in parts):
            return value
        return "".join(p if isinstance(p, str) else str(_variable(session, p).get()) for p in parts)
    if isinstance(value, SemanticVariable):
        return value.get()
    if isinstance(value, BaseMessage):
        return value.model_copy(update={"content": resolve(value.content, session)})
    if isinstance(value, list | tuple):
        return type(value)(resolve(v, session) for v in value)
    if isinstance(value, dict):
        return {k: resolve(v, session) for k, v in value.items()}
    return value


async def aresolve(value: Any, session: Any) -> Any:
    """`resolve` for async code (the variables are awaited together)."""
    if isinstance(value, str):
        parts = split_markers(value)
        texts = await asyncio.gather(*(_variable(session, p).aget() for p in parts if isinstance(p, VarRef)))
        values = iter(texts)
        return "".join(p if isinstance(p, str) else str(next(values)) for p in parts)
    if isinstance(value, SemanticVariable):
        return await value.aget()
    if isinstance(value, BaseMessage):
        return value.model_copy(update={"content": await aresolve(value.content, session)})
    if isinstance(value, list | tuple):
        return type(value)(await asyncio.gather(*(aresolve(v, session) for v in value)))
    if isinstance(value, dict):
        return dict(zip(value, await asyncio.gather(*(aresolve(v, session) for v in value.values())), strict=True))
    return value


def resolver(session: Any) -> Runnable[Any, Any]:
    """A runnable that resolves its input (`resolve`; `aresolve` when run async): a chain's end."""

    async def aresolved(value: Any) -> Any:
        return await aresolve(value, session)

    return RunnableLambda(lambda value: resolve(value, session), afunc=aresolved, name="parrot_resolve")
