"""The search: breadth-first over engine states, checking each state and transition.

One ``_Search`` explores one engine configuration. From each reachable engine it
offers every candidate event (``_space.EVENT_SOURCES``) for every input trigger; an
accepted event gives a child state, checked at once (``_check_transition``,
``_check_state`` and the rule checks of ``_coverage``), and a refused one must raise
``ProtocolError`` and change nothing. Engines are copied and compared only through
their public API: ``Engine.fork()`` keeps a copy of every state still to expand, and
``Engine.control_key()`` merges states that will behave alike (see ``Engine``
and the ``checker`` module docstring).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from statemachine.core import table as _table
from statemachine.core.engine import Engine
from statemachine.core.events import (
    CallModel,
    Event,
    ReturnToCaller,
    StartTool,
    StepDecided,
    ToolFinished,
)
from statemachine.core.invariants import history_violations
from statemachine.core.messages import AssistantMessage, Message, ToolResultMessage, UserMessage
from statemachine.core.steps import Retry
from statemachine.core.table import (
    BASE_TABLE,
    INPUT_TRIGGERS,
    RETURNS_TO_CALLER,
    TERMINAL,
    State,
    Table,
    Trigger,
    TurnState,
)
from statemachine.errors import ProtocolError
from statemachine.testing import _oracle as _rules
from statemachine.testing._coverage import (
    RuleChecks,
    _Firing,
    _row_groups,
    _rules_never,
    both,
    observing,
)
from statemachine.testing._space import (
    _UNIFORM,
    EVENT_SOURCES,
    FIRST_MESSAGE,
    TOOL,
    Bounds,
    CheckViolation,
    Config,
    _SilentLogger,
)

S = TurnState
T = Trigger


def _fingerprint(engine: Engine, key: tuple[Any, ...] | None = None) -> tuple[Any, ...]:
    """Everything a refused event must leave as it was (I8); ``key``: if known."""
    return (
        key if key is not None else engine.control_key(),
        tuple(engine.messages),
        tuple(engine.trace),
        engine.turns,
        engine.explanation,
    )


@attrs.frozen
class _Node:
    key: Any
    snap: Engine  # an engine in this state, never handled again: forked to expand
    path: tuple[Event, ...]
    counts: tuple[tuple[Trigger, int], ...]  # occurrences of limited triggers
    model_calls: int
    started: frozenset[str]


class _Search(RuleChecks):
    def __init__(
        self,
        bounds: Bounds,
        config: Config,
        engine_class: type[Engine],
        strategy: str,
    ) -> None:
        if config.max_calls is not None and config.max_calls < bounds.calls:
            bounds = attrs.evolve(bounds, calls=config.max_calls)
        if config.usages is not None:
            bounds = attrs.evolve(bounds, usages=config.usages)
        if config.call_kinds is not None:
            bounds = attrs.evolve(bounds, call_kinds=config.call_kinds)
        if config.texts is not None:
            bounds = attrs.evolve(bounds, texts=config.texts)
        self.bounds = bounds
        self.config = config.options
        self.check_continue = bool(config.options.get("check_continue"))
        self.engine_class = engine_class
        # The run's table: a team's, with its steps (the option ``table``), or the base
        # table as it stands now (read through the module, so that a test may install
        # another table and check it).
        run_table: Table = config.options.get("table", BASE_TABLE)
        self.steps = run_table.steps
        if run_table is BASE_TABLE:
            self.table = _table.TRANSITIONS
            self.rows_from = _table.rows_from
            self.terminal: frozenset[State] = TERMINAL
            self.returns: frozenset[State] = RETURNS_TO_CALLER
        else:
            self.table = run_table.rows
            self.rows_from = run_table.rows_from
            self.terminal, self.returns = run_table.terminal, run_table.returns_to_caller
        self.row_set = frozenset((r.source, r.trigger, r.dest) for r in self.table)
        self.firings: list[_Firing] = []
        self.hook = observing(self.firings, _row_groups(self.table), self.steps)
        self.strategy = strategy
        # The checker runs hundreds of thousands of transitions: their debug events would
        # cost more than the engine, so the engines it makes log nowhere.
        self.logger = _SilentLogger()
        self.engine = self._fresh()
        self.current = self.engine  # the engine in the state of the latest child
        self.leaves = 0
        self.states = 0
        self.transitions = 0
        self.refusals = 0
        self.rows: set[int] = set()
        self.violations: list[CheckViolation] = []
        self.dead_ends: list[CheckViolation] = []
        self.missing_sources = [t for t in INPUT_TRIGGERS if t not in EVENT_SOURCES]
        self.acceptance_checked: set[tuple[State, Trigger]] = set()
        self.seen: set[Any] = set()
        self.verified: collections.Counter[tuple[State, Trigger]] = collections.Counter()

    def _fresh(self) -> Engine:
        """A new engine of the configuration, watched by the search's hook (after any
        hook the engine class gave it). Forks keep the hook."""
        engine = self.engine_class(
            tools=[TOOL],
            messages=[FIRST_MESSAGE],
            max_turns=self.bounds.turns,
            run_id="check",
            logger=self.logger,
            **self.config,
        )
        engine.transition_hook = both(engine.transition_hook, self.hook)
        return engine

    def _load(self, node: _Node) -> Engine:
        if self.strategy == "snapshot":
            return node.snap.fork()
        engine = self._fresh()
        for event in node.path:
            engine.handle(event)
        self.firings.clear()  # checked when the path was first taken
        return engine

    def _violate(self, invariant: str, message: str, path: tuple[Event, ...]) -> None:
        self.violations.append(CheckViolation(invariant, message, dict(self.config), path))

    def run(self) -> None:
        for trigger in self.missing_sources:
            self._violate(
                "checker",
                f"no event source for input trigger {trigger.value!r}: add one to "
                "statemachine.testing.checker.EVENT_SOURCES",
                (),
            )
        if self.bounds.rules and TERMINAL != _rules.ENDS:
            self._violate(
                "rules",
                "rule 11: the terminal states are "
                f"{sorted(s.value for s in _rules.ENDS)}, the table says "
                f"{sorted(s.value for s in TERMINAL)}",
                (),
            )
        root = _Node((self.engine.control_key(), ()), self.engine.fork(), (), (), 0, frozenset())
        self.seen.add(root.key)
        self._check_state(self.engine, root.path, None)
        queue = collections.deque([root])
        self.states = 1
        while queue and len(self.violations) < self.bounds.max_violations:
            node = queue.popleft()
            # Children are checked and keyed as they are made, one at a time, so a child
            # already seen is recognised before it is snapshotted.
            for child in self._expand(node):
                if child.key in self.seen:
                    continue
                self.seen.add(child.key)
                self.states += 1
                if child.key[0][0] in self.terminal:
                    # A leaf: checked now, while the engine that just reached it is at
                    # hand, instead of being snapshotted, queued and restored.
                    self._absorb(self.current, child)
                else:
                    queue.append(child)

    def _expand(self, node: _Node) -> Iterable[_Node]:
        """Offer every candidate event to a live state; yield each accepted child."""
        engine = self._load(node)
        state = engine.state
        base = _fingerprint(engine, node.key[0])
        dirty = False
        accepted_any = False
        limits = dict(node.counts)
        for trigger in INPUT_TRIGGERS:
            source = EVENT_SOURCES.get(trigger)
            if source is None:
                continue
            if dirty:
                engine = self._load(node)
                dirty = False
            candidates = source(engine, self.bounds)
            if not candidates:
                continue
            accepted = self._accepted(state, trigger, node.path)
            if not accepted:
                # Not accepted here: one sample must be refused, changing nothing.
                dirty = self._check_refused(engine, candidates[0], base, node, absorbed=False)
                continue
            limit = self.bounds.limits.get(trigger)
            if limit is not None and limits.get(trigger, 0) >= limit:
                continue
            for event in candidates:
                if dirty:
                    engine = self._load(node)
                    dirty = False
                child = self._step(engine, event, node, base)
                if child is None:
                    if trigger in _UNIFORM:
                        break
                    continue
                accepted_any = True
                dirty = True
                yield child
        if not accepted_any:
            self.dead_ends.append(
                CheckViolation(
                    "dead end",
                    f"{state.value} is not terminal but accepts no event",
                    dict(self.config),
                    node.path,
                )
            )

    def _accepted(self, state: State, trigger: Trigger, path: tuple[Event, ...]) -> bool:
        """Whether ``trigger`` is accepted in ``state`` (by the rules, unless they are
        off); a table that disagrees is reported once per (state, trigger)."""
        by_table = bool(self.rows_from(state, trigger))
        if not self.bounds.rules:
            return by_table
        by_rules = _rules.accepts(state, trigger, self.steps)
        if by_rules != by_table and (state, trigger) not in self.acceptance_checked:
            self.acceptance_checked.add((state, trigger))
            expected = _rules.destination(state, trigger, _rules_never, self.steps)
            self._violate(
                "rules",
                f"{expected.rule}: {trigger.value} is accepted in {state.value}, but the table "
                "has no row for it"
                if expected is not None
                else f"rule 12: no rule accepts {trigger.value} in {state.value}, but the table "
                "has a row for it",
                path,
            )
        return by_rules

    def _absorb(self, engine: Engine, node: _Node) -> None:
        """In a terminal state (``engine`` is in it): every event is absorbed (I4), and
        on a sample of runs, the same events give the same run again (I5)."""
        self.leaves += 1
        if self.leaves % self.bounds.determinism_stride == 1:
            self._check_determinism(engine, node.path)
        base = _fingerprint(engine, node.key[0])
        for trigger in INPUT_TRIGGERS:
            source = EVENT_SOURCES.get(trigger)
            candidates = source(engine, self.bounds) if source is not None else ()
            if candidates and self._check_refused(engine, candidates[0], base, node, absorbed=True):
                return  # the engine changed: the violation is recorded, stop here

    def _check_determinism(self, engine: Engine, path: tuple[Event, ...]) -> None:
        # A fresh engine, the same events: the same states, history, log and explanation.
        again = self._fresh()
        try:
            for event in path:
                again.handle(event)
        except Exception as exc:  # noqa: BLE001 - a crash on a replay is the finding
            self._violate("I5", f"replaying the run raised {type(exc).__name__}: {exc}", path)
            return
        finally:
            self.firings.clear()  # checked when the path was first taken
        same = (
            again.state is engine.state
            and tuple(again.messages) == tuple(engine.messages)
            and again.trace == engine.trace
            and again.explanation == engine.explanation
        )
        if not same:
            self._violate(
                "I5", "the same events, replayed on a fresh engine, gave another run", path
            )

    def _check_refused(
        self, engine: Engine, event: Event, base: tuple[Any, ...], node: _Node, *, absorbed: bool
    ) -> bool:
        self.refusals += 1
        path = (*node.path, event)
        state = engine.state
        try:
            actions = engine.handle(event)
        except ProtocolError:
            if absorbed:
                self._violate("I4", f"{engine.state.value} refused instead of absorbing", path)
        except Exception as exc:  # noqa: BLE001 - an engine crash is the I8 violation sought
            self._violate("I8", f"handling the event raised {type(exc).__name__}: {exc}", path)
            return True
        else:
            if not absorbed:
                self._violate(
                    "I8",
                    f"{event.trigger.value} is not accepted in {state.value} "
                    "(rule 12) but the engine took it",
                    path,
                )
            elif actions:
                self._violate("I4", f"a terminal state answered with actions {actions}", path)
        finally:
            self.firings.clear()  # an event that should not be taken: reported above
        if self._verify(state, event) and _fingerprint(engine) != base:
            self._violate(
                "I8" if not absorbed else "I4", "a refused event changed the engine", path
            )
            return True
        return False

    def _verify(self, state: State, event: Event) -> bool:
        """Whether to verify that this refusal changed nothing (see ``Bounds``)."""
        pair = (state, event.trigger)
        self.verified[pair] += 1
        stride = self.bounds.refusal_stride
        return self.verified[pair] <= self.bounds.refusals_per_pair or self.refusals % stride == 0

    def _step(
        self, engine: Engine, event: Event, node: _Node, base: tuple[Any, ...]
    ) -> _Node | None:
        """Offer ``event`` to ``engine`` (in ``node``'s state); the child, if accepted."""
        path = (*node.path, event)
        before_history = list(engine.messages)
        before_trace = len(engine.trace)
        before_state = engine.state
        before_turns = engine.turns
        retry = self._retry_message(engine, event)
        self.firings.clear()
        try:
            actions = engine.handle(event)
        except ProtocolError:
            self.refusals += 1
            # A refusal from inside the dispatch (no row applied) is a transition the
            # rules may have expected.
            self._check_firings(path)
            if self._verify(before_state, event) and _fingerprint(engine) != base:
                self._violate("I8", "a refused event changed the engine", path)
            return None
        except Exception as exc:  # noqa: BLE001 - an engine crash is the I8 violation sought
            # A crash after a wrong step is the step's fault: name the step first.
            self._check_firings(path)
            self._violate("I8", f"handling the event raised {type(exc).__name__}: {exc}", path)
            return None
        self.transitions += 1
        self._check_rows(engine, before_trace, path)
        entered = self._check_firings(path)
        if entered is not None and self.bounds.rules:
            self._check_effects(engine, actions, entered, before_turns, path)
        child = self._child(engine, event, actions, node)
        self._check_transition(engine, event, actions, before_history, before_state, path)
        if retry is not None:
            self._check_retry(engine, retry, before_history, path)
        if any(isinstance(a, CallModel) for a in actions):
            self._check_budget(engine, before_history, before_turns, path)
        self._check_state(engine, path, child)
        self.current = engine
        return child

    def _retry_message(self, engine: Engine, event: Event) -> str | None:
        """The message a step's decision must send back to the model: the declaration
        says the outcome is a retry and its budget is not spent (``None`` otherwise)."""
        if not isinstance(event, StepDecided):
            return None
        step = engine.pending_step()
        dest = None if step is None else step.destination(event.outcome)
        if step is None or not isinstance(dest, Retry) or not event.message:
            return None
        return event.message if engine.step_retries(step.name) < dest.budget else None

    def _check_retry(
        self, engine: Engine, message: str, before: list[Message], path: tuple[Event, ...]
    ) -> None:
        """A retry goes back to the model with its message: the message enters the
        history, after the answer it rejects (the turn boundary may still end the run
        at a limit: the message is then the last word, as queued input is)."""
        added = list(engine.messages)[len(before) :]
        if UserMessage(message) not in added:
            self._violate(
                "I2",
                f"a retry of step {_step_of(path)} did not send its message back to the "
                f"model (the run is in {engine.state.value})",
                path,
            )

    def _check_budget(
        self, engine: Engine, before: list[Message], calls_before: int, path: tuple[Event, ...]
    ) -> None:
        """I7 for usage limits: a model call is made only while the usage so far (the
        usage the run's responses reported, summed here from the history) has reached
        none of the run's limits."""
        limits = engine.usage_limits
        if limits is None:
            return
        reported = [m.usage for m in before if isinstance(m, AssistantMessage) and m.usage]
        used = {
            "requests": calls_before,
            "input_tokens": sum(u.input + u.cache_read + u.cache_write for u in reported),
            "output_tokens": sum(u.output for u in reported),
            "total_tokens": sum(u.total_tokens for u in reported),
        }
        for name, value in used.items():
            limit = getattr(limits, name)
            if limit is not None and value >= limit:
                self._violate(
                    "I7", f"a model call was made with {name}={value} at the limit {limit}", path
                )

    def _check_rows(self, engine: Engine, before_trace: int, path: tuple[Event, ...]) -> None:
        """Every transition the event caused is a row of the table."""
        for record in engine.trace[before_trace:]:
            if (record.source, record.trigger, record.dest) not in self.row_set:
                self._violate(
                    "table",
                    f"the engine took {record.source.value} --{record.trigger.value}--> "
                    f"{record.dest.value}, which is not a row of the table",
                    path,
                )

    def _child(self, engine: Engine, event: Event, actions: Sequence[Any], node: _Node) -> _Node:
        """The node of the state ``engine`` reached from ``node`` by ``event``.

        A new state still to expand keeps ``engine`` itself: with the snapshot
        strategy it is a fork made for this one event and is never handled again
        (expanding the node forks it anew). One seen already, or a terminal one
        (checked at once, see ``run``), keeps nothing of its own."""
        path = (*node.path, event)
        model_calls = node.model_calls + sum(isinstance(a, CallModel) for a in actions)
        started = set(node.started)
        for action in actions:
            if isinstance(action, StartTool):
                if action.call.id in started:
                    self._violate("I1", f"call {action.call.id!r} was started twice", path)
                started.add(action.call.id)
        counts = dict(node.counts)
        if event.trigger in self.bounds.limits:
            counts[event.trigger] = counts.get(event.trigger, 0) + 1
        frozen_counts = tuple(sorted(counts.items()))
        key = (engine.control_key(), frozen_counts)
        keep = self.strategy == "snapshot" and key not in self.seen
        return _Node(
            key,
            engine if keep and engine.state not in self.terminal else node.snap,
            path,
            frozen_counts,
            model_calls,
            frozenset(started),
        )

    def _check_transition(
        self,
        engine: Engine,
        event: Event,
        actions: Sequence[Any],
        before: list[Message],
        before_state: State,
        path: tuple[Event, ...],
    ) -> None:
        history = engine.messages
        if len(history) < len(before) or any(
            a is not b and a != b for a, b in zip(before, history, strict=False)
        ):
            self._violate("I2", "the history was not only appended to", path)
            return
        state = engine.state
        ended = [a for a in actions if isinstance(a, ReturnToCaller)]
        entered = state != before_state and state in self.returns
        if entered and (len(ended) != 1 or ended[0].state is not state):
            self._violate("I4", f"entering {state.value} did not announce ReturnToCaller", path)
        # I6: a tool's own result, once delivered, is kept as it is.
        if isinstance(event, ToolFinished):
            for message in history[len(before) :]:
                if (
                    isinstance(message, ToolResultMessage)
                    and message.tool_call_id == event.call_id
                    and (
                        message.content != event.output.content
                        or message.is_error != event.output.is_error
                    )
                ):
                    self._violate("I6", f"the result of {event.call_id!r} was rewritten", path)

    def _check_state(self, engine: Engine, path: tuple[Event, ...], node: _Node | None) -> None:
        state = engine.state
        history = list(engine.messages)
        pending = engine.pending_calls()
        for v in history_violations(history, allow_open_tail=bool(pending)):
            self._violate(v.invariant, str(v), path)
        if state in self.terminal and pending:
            self._violate(
                "I6" if state is S.ABORTED else "I1",
                f"{state.value} with calls still unanswered: {[c.id for c in pending]}",
                path,
            )
        if engine.turns > engine.max_turns:
            self._violate(
                "I7", f"{engine.turns} model calls with max_turns={engine.max_turns}", path
            )
        if node is not None and node.model_calls != engine.turns:
            self._violate(
                "I7", f"{node.model_calls} model calls asked but turns={engine.turns}", path
            )
        if state in self.returns and not (engine.explanation or "").strip():
            self._violate("I4", f"{state.value} carries no explanation", path)
        # I3: the model's own final answer ends the run only with nothing queued and no
        # tool call (a should_continue stop may also end it Done, after tool results).
        if state is S.DONE and engine.trace and engine.trace[-1].trigger is T.MODEL_RESPONDED:
            last = next((m for m in reversed(history) if isinstance(m, AssistantMessage)), None)
            if last is None or last.tool_calls:
                self._violate("I3", "Done, but the last assistant message has tool calls", path)
            if engine.queued_input():
                self._violate("I3", "Done with input still queued", path)
        if state is S.TURN_LIMIT_EXCEEDED and str(engine.max_turns) not in (
            engine.explanation or ""
        ):
            self._violate("I7", "the turn-limit explanation does not name the limit", path)
        if state is S.OUTPUT_INVALID and "Last error: " not in (engine.explanation or ""):
            self._violate("I4", "the OutputInvalid explanation does not name the error", path)
        if state is S.USAGE_LIMIT_EXCEEDED:
            limits = engine.usage_limits.to_dict() if engine.usage_limits else {}
            named = any(str(v) in (engine.explanation or "") for v in limits.values())
            if not limits or not named:
                self._violate("I7", "the usage-limit explanation does not name the limit", path)


def _step_of(path: tuple[Event, ...]) -> str:
    last = path[-1]
    return repr(last.step) if isinstance(last, StepDecided) else "?"
