"""The bridge: run the kit against an agent loop in another process and language.

``bridge_loop(command)`` returns an ``AgentLoop`` (the shape ``run_scenario`` and
``run_conformance`` drive) that starts ``command`` once per run and speaks the JSON
Lines protocol of ``specs/bridge-protocol.md`` with it over stdin/stdout. The peer
runs its own loop; the kit plays its model and its tools: each ``modelRequest`` the
peer sends is answered by the scenario's scripted model, each ``toolExecute`` by the
scenario's scripted tool, the scenario's abort is forwarded as ``abort``, and the
peer's final ``result`` (the transcript in our wire format) is what the loop returns.

Why the kit, not the peer, executes the tools: the properties judge what the tools
themselves observed (which calls ran, whether their cleanup finished before the loop
returned), so the tools must live where the observer lives.

Why an abort reaches every running model request and tool execution at once: the
scenario fires its abort from inside a scripted call, and a round trip through the
peer takes thousands of event-loop ticks, so whether a tool "saw" the abort would
depend on pipe latency and two runs of one scenario would differ (a false I5). A
loop in-process passes its signal down to its tools; the bridge treats the peer as
doing the same. A peer that cancels one operation on its own sends ``cancel``.

A peer that writes something unreadable, a line longer than ``max_line_bytes``
(default 16 MiB), exits early, or stays silent longer than ``silence_timeout``
(default 5 s) makes the loop raise ``BridgeError`` with what went wrong, the last line
it sent and the tail of its stderr; ``run_scenario`` records that as the loop's error
(I8). The peer is always killed: never a hang.

Closing, whatever the peer does
-------------------------------
The peer starts in a process group of its own (POSIX). When the run ends the kit
closes the peer's stdin, gives it 0.5 s to exit, then kills the whole group with
SIGKILL, so nothing the peer started outlives the run, waits at most 2 s for the peer
to be reaped, and closes its ends of the pipes. A grandchild that keeps stdout open, a peer
that ignores SIGTERM or writes forever without a newline: ``close()`` returns within
those bounds all the same. Only a process that leaves the group on purpose (``setsid``)
escapes the kill; the kit still stops reading from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import attrs

from statemachine.agent.tools import Tool
from statemachine.core.abort import AbortController, AbortSignal
from statemachine.core.checks import positive_int
from statemachine.core.messages import AssistantMessage, Message
from statemachine.core.tools import ToolOutput
from statemachine.core.wire import (
    message_from_dict,
    message_to_dict,
    messages_to_dicts,
    tool_definition_to_dict,
    tool_output_to_dict,
)
from statemachine.errors import (
    BridgeError,
    BridgeProtocolError,
    BridgeTimeoutError,
    InvalidInputError,
)

__all__ = [
    "DEFAULT_MAX_LINE_BYTES",
    "PROTOCOL_VERSION",
    "BridgeError",
    "BridgeLoop",
    "BridgeProtocolError",
    "BridgeTimeoutError",
    "bridge_loop",
]

PROTOCOL_VERSION = 1
"""The version of ``specs/bridge-protocol.md`` this kit speaks."""

DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024
"""The longest line (without its newline) the kit reads from a peer: a transcript is
one line and may be large, but a peer that never ends its line must not fill memory."""

_STDERR_TAIL = 2000
# How long a peer whose stdin was closed may take to exit by itself, and how long the
# kit then waits for the killed peer to be reaped.
_EXIT_GRACE = 0.5
_REAP_LIMIT = 2.0


class _StderrTail:
    """Drains the peer's stderr (so it can never block on a full pipe), keeping the end."""

    def __init__(self, stream: asyncio.StreamReader | None) -> None:
        self.text = ""
        self._task = asyncio.ensure_future(self._drain(stream)) if stream else None

    async def _drain(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(4096):
            self.text = (self.text + chunk.decode("utf-8", "replace"))[-_STDERR_TAIL:]

    async def close(self) -> None:
        if self._task is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._task, 0.5)


def _field(message: Mapping[str, Any], key: str, kind: type, what: str) -> Any:
    value = message.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) is not (kind is bool):
        raise BridgeProtocolError(
            f"{what}: field {key!r} must be a {kind.__name__}, got {value!r:.80}"
        )
    return value


def _messages(items: Any, what: str) -> list[Message]:
    if not isinstance(items, list):
        raise BridgeProtocolError(f"{what}: 'messages' must be a list of wire messages")
    out: list[Message] = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise BridgeProtocolError(f"{what}: messages[{i}] is not a JSON object")
        try:
            out.append(message_from_dict(item, path=f"messages[{i}]"))
        except (ValueError, TypeError) as exc:
            raise BridgeProtocolError(f"{what}: unreadable message: {exc}") from exc
    return out


def _tool_answer(value: Any) -> tuple[list[dict[str, Any]], bool]:
    """A tool's return value as wire content blocks and its error flag."""
    wire = tool_output_to_dict(value if isinstance(value, ToolOutput) else ToolOutput(value))
    return wire["content"], bool(wire["isError"])


class _Session:
    """One run of one peer process."""

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        *,
        model: Any,
        tools: Sequence[Tool],
        signal: AbortSignal,
        silence_timeout: float,
        max_line_bytes: int,
        command: str,
    ) -> None:
        self.process = process
        self.max_line_bytes = max_line_bytes
        self.loop = asyncio.get_running_loop()
        self.model = model
        self.tools = {tool.definition.name: tool for tool in tools}
        self.definitions = tuple(tool.definition for tool in tools)
        self.signal = signal
        self.silence_timeout = silence_timeout
        self.command = command
        self.stderr = _StderrTail(process.stderr)
        self.operations: dict[str, AbortController] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.op_tasks: dict[str, asyncio.Task[None]] = {}
        self.cancelled_by_peer: set[str] = set()
        self.closed = False
        self.last_line = "(nothing yet)"
        self.lines = 0

    # -- writing ---------------------------------------------------------------------

    def send(self, message: Mapping[str, Any]) -> None:
        if self.closed or self.process.stdin is None:
            return
        data = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        # A peer that has gone away shows up as end of file on the reading side,
        # with its exit code; a failed write here would only hide that.
        with contextlib.suppress(OSError, RuntimeError):
            self.process.stdin.write(data)

    def on_abort(self, reason: object) -> None:
        # AbortSignal listeners run in the aborting thread. On the loop's own thread the
        # abort is forwarded at once, so that the peer reads it before the answer of the
        # call that fired it; from any other thread it is handed to the loop.
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            self.forward_abort(reason)
        else:
            self.loop.call_soon_threadsafe(self.forward_abort, reason)

    def forward_abort(self, reason: object) -> None:
        self.send({"type": "abort", "reason": str(reason)})
        for controller in list(self.operations.values()):
            controller.abort(reason)

    # -- errors ------------------------------------------------------------------------

    def fail(self, kind: type[BridgeError], text: str) -> BridgeError:
        tail = self.stderr.text.strip()
        return kind(
            f"bridge peer {self.command}: {text} (line {self.lines}: {self.last_line[:200]})"
            + (f"; its stderr ends with: {tail[-500:]}" if tail else "")
        )

    # -- the conversation --------------------------------------------------------------

    async def read(self) -> dict[str, Any] | None:
        stdout = self.process.stdout
        assert stdout is not None
        try:
            raw = await asyncio.wait_for(stdout.readline(), self.silence_timeout)
        except TimeoutError:
            raise self.fail(
                BridgeTimeoutError,
                f"the peer sent nothing for {self.silence_timeout:g} s "
                f"({len(self.operations)} request(s) answered by the kit and unfinished)",
            ) from None
        except ValueError:  # the stream's limit: the line so far is already dropped
            raise self.fail(
                BridgeProtocolError,
                f"a line longer than {self.max_line_bytes} bytes (max_line_bytes)",
            ) from None
        if not raw:
            return None
        self.lines += 1
        self.last_line = raw.decode("utf-8", "replace").rstrip("\n")
        try:
            message = json.loads(raw)
        except ValueError:
            raise self.fail(BridgeProtocolError, "a line that is not JSON") from None
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            raise self.fail(BridgeProtocolError, "a line that is not an object with a 'type'")
        return message

    async def run(self, messages: Sequence[Message], max_turns: int) -> list[Message]:
        hello = await self.read()
        if hello is None:
            raise await self.exited("before its hello")
        if hello.get("type") != "hello":
            raise self.fail(BridgeProtocolError, "the first line must be a 'hello'")
        if hello.get("protocol") != PROTOCOL_VERSION:
            raise self.fail(
                BridgeProtocolError,
                f"the peer speaks protocol {hello.get('protocol')!r}; "
                f"this kit speaks {PROTOCOL_VERSION}",
            )
        self.send(
            {
                "type": "start",
                "protocol": PROTOCOL_VERSION,
                "messages": messages_to_dicts(messages),
                "tools": [tool_definition_to_dict(d) for d in self.definitions],
                "maxTurns": max_turns,
                "aborted": self.signal.aborted,
            }
        )
        # After 'start', so the peer always hears of its run before of its abort (an
        # already aborted signal calls the listener at once).
        remove = self.signal.add_listener(self.on_abort)
        try:
            while True:
                message = await self.read()
                if message is None:
                    raise await self.exited("without sending its result")
                if message["type"] == "result":
                    return _messages(message.get("messages"), "result")
                self.dispatch(message)
        finally:
            remove()

    def dispatch(self, message: dict[str, Any]) -> None:
        """Act on one line of the peer's other than its result."""
        kind = message["type"]
        if kind == "modelRequest":
            self.model_request(message)
        elif kind == "toolExecute":
            self.tool_execute(message)
        elif kind == "cancel":
            self.cancel(_field(message, "id", str, "cancel"))
        elif kind == "error":
            raise self.fail(BridgeError, f"the peer reported an error: {message.get('message')!r}")
        else:
            raise self.fail(BridgeProtocolError, f"unknown message type {kind!r}")

    def cancel(self, op: str) -> None:
        if op in self.operations:
            # What an in-process loop does when it gives up a call: abort its signal and
            # cancel its task. The call is answered with an error unless it answered first.
            self.operations[op].abort("cancelled by the peer")
            task = self.op_tasks.get(op)
            if task is not None and not task.done():
                self.cancelled_by_peer.add(op)
                task.cancel()

    async def exited(self, when: str) -> BridgeError:
        # Its exit code; not process.wait(), which also waits for pipes a child may hold.
        await self.exit_within(1.0)
        await self.stderr.close()
        return self.fail(BridgeError, f"the peer exited (code {self.process.returncode}) {when}")

    def operation(self, message: Mapping[str, Any], what: str) -> tuple[str, AbortController]:
        op = _field(message, "id", str, what)
        if op in self.operations:
            raise self.fail(BridgeProtocolError, f"{what}: id {op!r} was used before")
        controller = AbortController()
        if self.signal.aborted:
            controller.abort(self.signal.reason)
        self.operations[op] = controller
        return op, controller

    def spawn(self, op: str, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        self.op_tasks[op] = task
        task.add_done_callback(self.tasks.discard)

    def peer_cancelled(self, op: str) -> bool:
        """True when the peer's ``cancel`` alone cancelled ``op``: the cancellation is
        then taken back (the call is answered), while one of the run itself goes on."""
        task = asyncio.current_task()
        if op not in self.cancelled_by_peer or task is None or task.cancelling() > 1:
            return False
        task.uncancel()
        return True

    def model_request(self, message: Mapping[str, Any]) -> None:
        op, controller = self.operation(message, "modelRequest")
        context = _messages(message.get("messages"), "modelRequest")

        async def answer() -> None:
            try:
                try:
                    response = await self.model.complete(
                        context, self.definitions, controller.signal
                    )
                except asyncio.CancelledError:
                    if not self.peer_cancelled(op):
                        raise
                    self.send({"type": "modelError", "id": op, "error": _CANCELLED})
                    return
                if not isinstance(response, AssistantMessage):
                    raise TypeError(f"the model returned a {type(response).__name__}")
                reply: dict[str, Any] = {
                    "type": "modelResponse",
                    "id": op,
                    "message": message_to_dict(response),
                }
            except Exception as exc:  # noqa: BLE001 - a provider failure is the peer's to handle
                reply = {"type": "modelError", "id": op, "error": f"{type(exc).__name__}: {exc}"}
            self.send(reply)

        self.spawn(op, answer())

    def tool_execute(self, message: Mapping[str, Any]) -> None:
        op, controller = self.operation(message, "toolExecute")
        name = _field(message, "name", str, "toolExecute")
        arguments = message.get("arguments")
        if not isinstance(arguments, dict):
            raise self.fail(BridgeProtocolError, "toolExecute: 'arguments' must be an object")
        tool = self.tools.get(name)

        async def answer() -> None:
            content: list[dict[str, Any]]
            if tool is None:
                content, is_error = [{"type": "text", "text": f"Tool {name} not found"}], True
            else:
                try:
                    value = await tool.execute(dict(arguments), controller.signal)
                    content, is_error = _tool_answer(value)
                except asyncio.CancelledError:
                    if not self.peer_cancelled(op):
                        raise
                    content, is_error = [{"type": "text", "text": _CANCELLED}], True
                except Exception as exc:  # noqa: BLE001 - a tool failure is the peer's to report
                    content = [{"type": "text", "text": str(exc) or type(exc).__name__}]
                    is_error = True
            self.send({"type": "toolResult", "id": op, "content": content, "isError": is_error})

        self.spawn(op, answer())

    async def close(self) -> None:
        """Stop talking to the peer and make sure its process is gone.

        Kit-side operations still running are left alone: a tool the peer abandoned is
        still running when the loop returns, which is exactly what I6 must see.
        """
        self.closed = True
        stdin = self.process.stdin
        if stdin is not None:
            with contextlib.suppress(OSError, RuntimeError):
                stdin.close()
        await self.exit_within(_EXIT_GRACE)
        # Even a peer that exited may have left children holding the pipes.
        _kill_group(self.process)
        await self.exit_within(_REAP_LIMIT)
        # process.wait() would also wait for every pipe to close (Python 3.11), which a
        # process outside the group, or a pipe the kit stopped reading, can put off
        # forever: the kit lets go of the pipes itself.
        transport = getattr(self.process, "_transport", None)
        if transport is not None:
            transport.close()
        await self.stderr.close()

    async def exit_within(self, seconds: float) -> None:
        """Wait up to ``seconds`` for the peer process itself to exit."""
        deadline = self.loop.time() + seconds
        while self.process.returncode is None and self.loop.time() < deadline:
            await asyncio.sleep(0.01)


_CANCELLED = "Operation cancelled: the peer sent 'cancel'"


def _kill_group(process: asyncio.subprocess.Process) -> None:
    """SIGKILL the peer's process group (its id is the peer's pid, see ``_spawn``).

    The group outlives its leader while a member lives, and Linux gives no new process
    a pid that is still a group's id, so the signal reaches only what the peer started.
    """
    killpg = getattr(os, "killpg", None)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if killpg is not None:
            killpg(process.pid, signal.SIGKILL)
        elif process.returncode is None:
            process.kill()


@attrs.frozen(repr=False)
class BridgeLoop:
    """An ``AgentLoop`` whose loop runs in a peer process: the options ``bridge_loop``
    checked, which it made this from."""

    # Waiting for the peer process to exit is reported by a watcher thread, which an
    # idle-skipping event loop cannot see coming (statemachine/testing/clock.py).
    needs_real_time: ClassVar[bool] = True

    command: tuple[str, ...]
    silence_timeout: float
    cwd: str | os.PathLike[str] | None
    env: Mapping[str, str] | None
    max_line_bytes: int

    def __repr__(self) -> str:
        return f"bridge_loop({list(self.command)!r})"

    async def __call__(
        self,
        *,
        model: Any,
        tools: Sequence[Tool],
        messages: Sequence[Message],
        max_turns: int,
        signal: AbortSignal,
    ) -> list[Message]:
        shown = " ".join(self.command)
        process = await self._spawn(shown)
        session = _Session(
            process,
            model=model,
            tools=tools,
            signal=signal,
            silence_timeout=self.silence_timeout,
            max_line_bytes=self.max_line_bytes,
            command=shown,
        )
        try:
            return await session.run(messages, max_turns)
        finally:
            # Shielded: a whole-run timeout cancels this call, and the peer must still
            # be reaped rather than left running.
            await asyncio.shield(session.close())

    async def _spawn(self, shown: str) -> asyncio.subprocess.Process:
        # A group of its own, so that close() can kill whatever the peer started.
        group: dict[str, Any] = {"process_group": 0} if os.name == "posix" else {}
        try:
            return await asyncio.create_subprocess_exec(
                *self.command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=self.cwd,
                env=self.env,
                limit=self.max_line_bytes,
                **group,
            )
        except OSError as exc:
            raise BridgeError(f"bridge peer {shown}: cannot start it: {exc}") from exc


def bridge_loop(
    command: Sequence[str],
    *,
    silence_timeout: float = 5.0,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
) -> BridgeLoop:
    """An ``AgentLoop`` that runs ``command`` (one process per run) over the bridge.

    ``silence_timeout`` is how long the peer may stay silent before the run fails
    with ``BridgeTimeoutError``; keep it above the ``hang_limit`` of the scenarios
    (a peer legitimately waits that long on a scripted call that hangs).
    ``max_line_bytes`` (default 16 MiB) caps one line the peer writes; a longer one
    fails the run with ``BridgeProtocolError``.
    """
    if isinstance(command, str) or not command:
        raise InvalidInputError("command must be a non-empty sequence of arguments, not a string")
    if not silence_timeout > 0:
        raise InvalidInputError(f"silence_timeout must be positive, got {silence_timeout!r}")
    positive_int("max_line_bytes", max_line_bytes)
    return BridgeLoop(
        tuple(str(part) for part in command),
        silence_timeout,
        cwd,
        dict(env) if env is not None else None,
        max_line_bytes,
    )
