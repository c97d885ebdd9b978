"""What an MCP server asks of this client while a call runs: a model's answer
(``sampling/createMessage``), the user's answer (``elicitation/create``), and what it
tells: progress (``notifications/progress``) and log messages (``notifications/message``).

Sampling is answered only under an ``MCPSampling`` policy and elicitation only by a
handler the user gives, or through the run whose tool call the server asks in
(``elicitation="run"``: the question is pending on the run, and a person answers it
with ``AgentRun.answer``); without them the server is refused with an error that says
so. Everything a server sends here is bounded before it is used: the messages of a
sampling request (count, characters, image bytes), ``maxTokens``, the requests of a
connection, the text of a question, a log message and a progress message.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import mcp.types as mcp_types
from mcp.shared.dispatcher import ProgressFnT

from statemachine._log import library_logger
from statemachine.agent.events import ToolQuestion
from statemachine.agent.model import ModelClient, ModelSettings, takes_options
from statemachine.agent.run import run_agent
from statemachine.agent.running import ask_person, report_log, report_progress
from statemachine.core.abort import AbortSignal
from statemachine.core.messages import (
    AssistantMessage,
    Message,
    StopReason,
    TextContent,
    UserMessage,
)
from statemachine.core.tools import ToolDefinition
from statemachine.errors import InvalidInputError
from statemachine.mcp._results import IMAGE_MIME, describe, image

__all__ = [
    "CHARS_PER_TOKEN",
    "DEFAULT_MAX_INPUT_REQUESTS",
    "MAX_LOG_CHARS",
    "MAX_QUESTION_CHARS",
    "Asking",
    "ElicitationHandler",
    "Elicitor",
    "MCPElicitation",
    "MCPProgress",
    "MCPSampling",
    "MCPSamplingRequest",
    "RootsGiven",
    "missing_capability",
    "root_list",
    "url_required",
]

DEFAULT_MAX_INPUT_REQUESTS = 100
"""Sampling and elicitation requests one server may make in one connection."""
MAX_LOG_CHARS = 4_000
"""Characters of one log message (its data as JSON, when not text) kept in a ``ToolLog``."""
MAX_QUESTION_CHARS = 10_000
"""Characters of an elicitation's message and of its schema as JSON; longer: refused."""
_MAX_NAME_CHARS = 200
CHARS_PER_TOKEN = 4
"""Characters a token is counted as, to bound the answer of a sampling model that is
not told ``max_tokens`` (one that does not list it in ``supported_settings``)."""


@attrs.frozen
class MCPSamplingRequest:
    """A server's ``sampling/createMessage``, as ``MCPSampling.allow`` sees it (bounded)."""

    server: str
    messages: tuple[Message, ...]
    system_prompt: str | None
    max_tokens: int  # what the server asked for (the model gets at most the policy's)
    temperature: float | None = None


def _positive(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not (isinstance(value, int) and value > 0):
        raise InvalidInputError(f"{attribute.name} must be a positive integer, got {value!r}")


@attrs.frozen(kw_only=True)
class MCPSampling:
    """Lets a server sample ``model`` (``MCPServer(sampling=MCPSampling(model=...))``).

    Each request is one model call with no tools (``run_agent``, one turn): the
    server's ``systemPrompt`` becomes the instructions, its ``maxTokens`` (at most
    ``max_tokens``), ``temperature`` and ``stopSequences`` the settings the client
    supports (``supported_settings``). A model that does not take ``max_tokens`` is
    still bounded by it: its answer is cut to ``CHARS_PER_TOKEN`` (4) characters a
    token, and the server told it stopped at ``maxTokens``. Refused, with an error the
    server is given: more than ``max_requests`` requests in one connection, more than
    ``max_messages`` messages or ``max_chars`` characters of text in one, content other
    than text and images, and any request ``allow`` (given the ``MCPSamplingRequest``;
    may be async) does not return ``True`` for. ``model_name`` is what the server is
    told answered (default: the client's ``model`` attribute, or its type's name).
    """

    model: ModelClient
    max_tokens: int = attrs.field(default=1024, validator=_positive)
    max_requests: int = attrs.field(default=20, validator=_positive)
    max_messages: int = attrs.field(default=50, validator=_positive)
    max_chars: int = attrs.field(default=100_000, validator=_positive)
    allow: Callable[[MCPSamplingRequest], bool | Awaitable[bool]] | None = None
    model_name: str | None = None

    def answering_model(self) -> str:
        """What the server is told answered (``model_name``, or the client's own)."""
        if self.model_name is not None:
            return self.model_name
        named = getattr(self.model, "model", None)
        return named if isinstance(named, str) else type(self.model).__name__


@attrs.frozen
class MCPElicitation:
    """A server's ``elicitation/create``, as the ``elicitation`` handler sees it:
    the question, and the JSON schema of the answer (form mode), or the URL the user
    is asked to open (URL mode; ``schema`` is then empty)."""

    server: str
    message: str
    schema: Mapping[str, Any]
    url: str | None = None


ElicitationHandler = Callable[
    [MCPElicitation], Awaitable[Mapping[str, Any] | Literal["decline", "cancel"] | None]
]
"""``async handler(question) -> answer``: a mapping accepts (its values: text,
numbers, booleans or lists of text, as the schema says), ``None`` or ``"decline"``
declines (the user said no), ``"cancel"`` cancels (the user dismissed the question
without answering). What it raises refuses the request: the call fails with that
reason."""

Elicitor = ElicitationHandler | Literal["run"]
"""What answers a server's elicitation: a handler, or ``"run"``: the run whose tool
call the server asks in (``AgentRun.pending_questions``, ``AgentRun.answer``)."""

_PRIMITIVE = frozenset({"string", "number", "integer", "boolean"})
_NO_RUN = (
    "elicitation='run' answers only in a tool call of a run a person holds "
    "(an AgentRun, not a durable run)"
)

_calling: contextvars.ContextVar[object | None] = contextvars.ContextVar(
    "statemachine_mcp_call", default=None
)
"""The call of this client a request belongs to, in the call's own context (a server of
the 2026-07-28 protocol asks within the call's request; an older one does not say)."""

RootsGiven = Sequence[str | Path]
"""The roots a client offers: ``file://`` URIs, or paths (made absolute URIs, named by
their last part)."""

MAX_URL_ELICITATIONS = 3
"""URLs of a URL-mode elicitation error (-32042) that the call's error names."""


def root_list(roots: RootsGiven) -> tuple[mcp_types.Root, ...]:
    """The roots as the protocol's, checked: a URI must be ``file://``."""
    made = []
    for root in roots:
        if isinstance(root, Path):
            given = {"uri": root.resolve().as_uri(), "name": root.name or None}
        elif isinstance(root, str) and root.startswith("file://"):
            given = {"uri": root}
        else:
            raise InvalidInputError(f"a root must be a path or a file:// URI, got {root!r}")
        try:
            made.append(mcp_types.Root.model_validate(given))
        except ValueError as exc:  # pydantic's ValidationError
            raise InvalidInputError(f"a root must be a file:// URI: {describe(exc)}") from None
    return tuple(made)


def url_required(exc: BaseException) -> list[MCPElicitation] | None:
    """The URLs a server needs the user to open before it answers (its error -32042,
    ``URL_ELICITATION_REQUIRED``), or ``None`` for any other error."""
    if getattr(exc, "code", None) != mcp_types.URL_ELICITATION_REQUIRED:
        return None
    data = getattr(exc, "data", None)
    listed = data.get("elicitations") if isinstance(data, Mapping) else None
    questions = []
    for item in listed[:MAX_URL_ELICITATIONS] if isinstance(listed, list) else ():
        url = item.get("url") if isinstance(item, Mapping) else None
        message = item.get("message") if isinstance(item, Mapping) else None
        if isinstance(url, str):
            said = message if isinstance(message, str) else ""
            questions.append(MCPElicitation("", _cut(said, 500), {}, _cut(url, 2_000)))
    return questions


@attrs.frozen
class MCPProgress:
    """The ``data`` of a ``ToolProgress`` from an MCP server (``notifications/progress``)."""

    progress: float
    total: float | None = None
    message: str | None = None


def missing_capability(exc: BaseException) -> str:
    """What to add to the error of a call the server refused because this client
    did not declare sampling or elicitation (it declares each only when enabled)."""
    if getattr(exc, "code", None) != mcp_types.MISSING_REQUIRED_CLIENT_CAPABILITY:
        return ""
    return (
        " (this client answers sampling only with MCPServer(sampling=MCPSampling(...)), "
        "elicitation only with MCPServer(elicitation=handler))"
    )


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}[{len(text) - limit} more cut]"


def _refused(message: str) -> mcp_types.ErrorData:
    return mcp_types.ErrorData(code=mcp_types.INVALID_REQUEST, message=message)


def _not_enabled(what: str) -> mcp_types.ErrorData:
    # Not reached through the SDK, which is given a callback only for what is enabled.
    return _refused(f"{what} is not enabled on this client (statemachine: MCPServer({what}=...))")


class Asking:
    """The callbacks of one server's connection (``mcp.Client``'s), and its calls in
    flight, whose runs the server's progress and log messages are told to."""

    def __init__(
        self,
        server: str,
        sampling: MCPSampling | None,
        elicitation: Elicitor | None,
        max_requests: int,
        max_image_bytes: int,
        roots: RootsGiven | None = None,
    ) -> None:
        self.server = server
        self.roots = None if roots is None else root_list(roots)
        self.sampling = sampling
        self.elicitation = elicitation
        self._max_requests = max_requests
        self._max_image_bytes = max_image_bytes
        self._requests = 0
        self._samples = 0
        # call key -> its context, its signal (the call's timeout and the run's abort)
        self._in_flight: dict[object, tuple[contextvars.Context, AbortSignal]] = {}
        self._asking_run: dict[object, int] = {}  # call key -> its questions pending
        self._marks: dict[object, contextvars.Token[object | None]] = {}
        self._log = library_logger("statemachine.mcp")

    # -- the calls in flight ------------------------------------------------------------

    def call_started(self, key: object, signal: AbortSignal) -> ProgressFnT:
        """Note a call (in the context of the tool's run); its progress callback."""
        token = _calling.set(key)  # what the call's request, started next, runs with
        context = contextvars.copy_context()
        self._in_flight[key] = (context, signal)
        self._marks[key] = token

        async def progress(progress: float, total: float | None, message: str | None) -> None:
            said = None if message is None else _cut(message, MAX_LOG_CHARS)
            context.run(report_progress, MCPProgress(progress, total, said))

        return progress

    def call_ended(self, key: object) -> None:
        self._in_flight.pop(key, None)
        token = self._marks.pop(key, None)
        if token is not None:
            with contextlib.suppress(ValueError):  # ended in another context: nothing kept
                _calling.reset(token)

    def asks_the_run(self, key: object) -> bool:
        """Whether the call ``key`` waits on a question asked through its run."""
        return self._asking_run.get(key, 0) > 0

    async def on_log(self, params: mcp_types.LoggingMessageNotificationParams) -> None:
        """A log message: a ``ToolLog`` of the server's call in flight that started
        first (the protocol does not say which call a message belongs to), or, with
        none in flight, a debug line of the library's logger."""
        data = params.data
        if not isinstance(data, str):
            try:
                data = json.dumps(data, ensure_ascii=False, default=repr)
            except (TypeError, ValueError):
                data = repr(data)
        data = _cut(data, MAX_LOG_CHARS)
        logger = None if params.logger is None else _cut(params.logger, _MAX_NAME_CHARS)
        first = next(iter(self._in_flight.values()), None)
        if first is None:
            self._log.debug("mcp_log_outside_a_call", server=self.server, level=params.level)
        else:
            first[0].run(report_log, params.level, data, logger)

    # -- requests -----------------------------------------------------------------------

    async def tell_urls(self, questions: Sequence[MCPElicitation]) -> None:
        """Show the elicitation handler the URLs a server needs opened (error -32042):
        the user sees them as a URL-mode question; the answer changes nothing (the
        call has failed already), and a handler that fails is logged."""
        if self.elicitation is None or self.elicitation == "run":
            return  # the call's error names the URLs, which the run's model reads
        for question in questions:
            try:
                await self.elicitation(attrs.evolve(question, server=self.server))
            except Exception as exc:  # noqa: BLE001 - the user's code: logged
                self._log.warning(
                    "mcp_url_elicitation_failed", server=self.server, error=describe(exc)
                )

    async def on_list_roots(self, context: Any) -> mcp_types.ListRootsResult:
        """``roots/list``: the roots the client was given (``MCPServer(roots=...)``)."""
        return mcp_types.ListRootsResult(roots=list(self.roots or ()))

    def _counted(self) -> mcp_types.ErrorData | None:
        self._requests += 1
        if self._requests > self._max_requests:
            return _refused(
                f"this client answers at most {self._max_requests} sampling and elicitation "
                "requests per connection (max_input_requests)"
            )
        return None

    async def on_sampling(
        self, context: Any, params: mcp_types.CreateMessageRequestParams
    ) -> mcp_types.CreateMessageResult | mcp_types.ErrorData:
        """``sampling/createMessage`` (never raises: a refusal is an ``ErrorData``)."""
        policy = self.sampling
        if policy is None:
            return _not_enabled("sampling")
        refused = self._counted()
        if refused is not None:
            return refused
        self._samples += 1
        if self._samples > policy.max_requests:
            return _refused(
                f"this client answers at most {policy.max_requests} sampling requests "
                "per connection (MCPSampling.max_requests)"
            )
        try:
            request = self._request(policy, params)
            if policy.allow is not None:
                allowed = policy.allow(request)
                if inspect.isawaitable(allowed):
                    allowed = await allowed
                if allowed is not True:
                    return _refused("the client's sampling policy refused this request")
            return await self._sample(policy, request, params)
        except InvalidInputError as exc:
            return _refused(str(exc))
        except Exception as exc:  # noqa: BLE001 - the user's code: the server is told
            return mcp_types.ErrorData(
                code=mcp_types.INTERNAL_ERROR, message=f"sampling failed: {describe(exc)}"
            )

    def _request(
        self, policy: MCPSampling, params: mcp_types.CreateMessageRequestParams
    ) -> MCPSamplingRequest:
        if params.tools or params.tool_choice:
            raise InvalidInputError("this client does not sample with tools")
        if len(params.messages) > policy.max_messages:
            raise InvalidInputError(
                f"at most {policy.max_messages} messages per sampling request (max_messages)"
            )
        chars = len(params.system_prompt or "")
        messages: list[Message] = []
        for said in params.messages:
            blocks = said.content if isinstance(said.content, list) else [said.content]
            content: list[Any] = []
            for item in blocks:
                if isinstance(item, mcp_types.TextContent):
                    chars += len(item.text)
                    content.append(TextContent(item.text))
                elif isinstance(item, mcp_types.ImageContent) and said.role == "user":
                    content.append(self._image(item))
                else:
                    raise InvalidInputError(
                        f"sampling content of type {getattr(item, 'type', '?')!r} "
                        f"({said.role}) is not supported by this client"
                    )
            if chars > policy.max_chars:
                raise InvalidInputError(
                    f"at most {policy.max_chars} characters per sampling request (max_chars)"
                )
            role = UserMessage if said.role == "user" else AssistantMessage
            messages.append(role(tuple(content)))
        return MCPSamplingRequest(
            server=self.server,
            messages=tuple(messages),
            system_prompt=params.system_prompt,
            max_tokens=params.max_tokens,
            temperature=params.temperature,
        )

    def _image(self, item: mcp_types.ImageContent) -> Any:
        if not IMAGE_MIME.fullmatch(item.mime_type) or len(item.data) > self._max_image_bytes:
            raise InvalidInputError(
                f"a sampling image must be image/* and at most {self._max_image_bytes} "
                "bytes of base64 (max_output_bytes)"
            )
        made = image(item.data, item.mime_type)
        if isinstance(made, TextContent):
            raise InvalidInputError(made.text)
        return made

    async def _sample(
        self,
        policy: MCPSampling,
        request: MCPSamplingRequest,
        params: mcp_types.CreateMessageRequestParams,
    ) -> mcp_types.CreateMessageResult | mcp_types.ErrorData:
        supported: frozenset[str] = getattr(policy.model, "supported_settings", None) or frozenset()
        max_tokens = min(request.max_tokens, policy.max_tokens)
        wanted: dict[str, Any] = {
            "max_tokens": max_tokens,
            "temperature": params.temperature,
            "stop": tuple(params.stop_sequences or ()) or None,
        }
        settings = ModelSettings(
            **{k: v for k, v in wanted.items() if v is not None and k in supported}
        )
        messages = list(request.messages)
        instructions = request.system_prompt or None
        if instructions is not None and not takes_options(policy.model):
            messages.insert(0, UserMessage(instructions))
            instructions = None
        result = await run_agent(
            model=policy.model,
            messages=messages,
            max_turns=1,
            instructions=instructions,
            model_settings=settings if settings.set_fields() else None,
        )
        if not result.ok:
            return mcp_types.ErrorData(
                code=mcp_types.INTERNAL_ERROR,
                message=f"the client's model did not answer: {result.explanation[:300]}",
            )
        last = result.messages[-1]
        cut = isinstance(last, AssistantMessage) and last.stop_reason is StopReason.LENGTH
        text = result.final_text
        if "max_tokens" not in supported and len(text) > max_tokens * CHARS_PER_TOKEN:
            # The model was not told max_tokens: its answer is held to it here.
            text, cut = text[: max_tokens * CHARS_PER_TOKEN], True
        stop = "maxTokens" if cut else "endTurn"
        return mcp_types.CreateMessageResult(
            role="assistant",
            content=mcp_types.TextContent(type="text", text=text),
            model=policy.answering_model(),
            stop_reason=stop,
        )

    async def on_elicitation(
        self, context: Any, params: mcp_types.ElicitRequestParams
    ) -> mcp_types.ElicitResult | mcp_types.ErrorData:
        """``elicitation/create`` (never raises: a refusal is an ``ErrorData``)."""
        handler = self.elicitation
        if handler is None:
            return _not_enabled("elicitation")
        refused = self._counted()
        if refused is not None:
            return refused
        if isinstance(params, mcp_types.ElicitRequestURLParams):
            question = MCPElicitation(self.server, params.message, {}, params.url)
        else:
            question = MCPElicitation(self.server, params.message, params.requested_schema)
        asked = len(question.message) + len(json.dumps(question.schema, default=repr))
        if asked + len(question.url or "") > MAX_QUESTION_CHARS:
            return _refused(
                f"an elicitation may hold at most {MAX_QUESTION_CHARS} characters "
                "(message and schema)"
            )
        if handler == "run":
            return await self._ask_the_run(question)
        try:
            answer = await handler(question)
        except Exception as exc:  # noqa: BLE001 - the user's code: the server is told
            return mcp_types.ErrorData(
                code=mcp_types.INTERNAL_ERROR,
                message=f"the client's elicitation handler failed: {describe(exc)}",
            )
        return _result(answer)

    async def _ask_the_run(
        self, question: MCPElicitation
    ) -> mcp_types.ElicitResult | mcp_types.ErrorData:
        """Ask the question through the run of the call it belongs to: pending there
        until a person answers it (``AgentRun.answer``), or "cancel" when the call's
        signal fires (its timeout, the run's abort)."""
        key = _calling.get()
        held = self._in_flight.get(key) if key is not None else None
        if held is None:  # an older server does not say which call asks: the first one
            key, held = next(iter(self._in_flight.items()), (None, None))
        if held is None:
            return _refused(_NO_RUN)
        wrong = schema_problem(question)
        if wrong is not None:
            return _refused(f"the elicitation's requested schema is refused: {wrong}")
        context, signal = held

        def make(question_id: str, call: Any) -> ToolQuestion:
            return ToolQuestion(
                question_id,
                call.id,
                call.name,
                question.message,
                question.schema,
                question.url,
                self.server,
            )

        # The question waits in the run of its call: in the call's own context.
        asked = asyncio.get_running_loop().create_task(
            ask_person(make, signal), context=context.copy()
        )
        self._asking_run[key] = self._asking_run.get(key, 0) + 1
        try:
            answer = await asked
        except InvalidInputError as exc:  # too many questions pending on the run
            return _refused(str(exc))
        except Exception as exc:  # noqa: BLE001 - the server is told; the run goes on
            return mcp_types.ErrorData(
                code=mcp_types.INTERNAL_ERROR, message=f"asking the run failed: {describe(exc)}"
            )
        finally:
            left = self._asking_run.pop(key) - 1
            if left:
                self._asking_run[key] = left
        if answer is None:
            return _refused(_NO_RUN)
        return _result(answer)


def schema_problem(question: MCPElicitation) -> str | None:
    """What makes a form-mode question's schema one the run cannot ask a person (the
    protocol's: an object of text, number, integer, boolean or list properties), or
    ``None``."""
    schema = question.schema
    if question.url is not None:
        return None
    properties = schema.get("properties")
    if schema.get("type") != "object" or not isinstance(properties, Mapping):
        return "it is not an object schema with properties"
    for name, field in properties.items():
        kind = field.get("type") if isinstance(field, Mapping) else None
        if kind not in _PRIMITIVE and kind != "array":
            return f"property {name!r} is not text, a number, a boolean or a list"
    try:
        ToolDefinition("answer", "", schema)
    except InvalidInputError as exc:
        return str(exc).removeprefix("tool 'answer': ")
    return None


def _result(answer: Any) -> mcp_types.ElicitResult | mcp_types.ErrorData:
    """The protocol's answer for a handler's (or a person's) answer."""
    if answer is None or answer == "decline":
        return mcp_types.ElicitResult(action="decline")
    if answer == "cancel":
        return mcp_types.ElicitResult(action="cancel")
    try:
        return mcp_types.ElicitResult(action="accept", content=dict(answer))
    except (TypeError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        return mcp_types.ErrorData(
            code=mcp_types.INTERNAL_ERROR,
            message=f"the client's elicitation answer is not valid: {describe(exc)}",
        )
