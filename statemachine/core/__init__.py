"""The sans-IO core: the transition table, the engine, messages, events, invariants.

No asyncio and no I/O: events go in, actions come out. This layer is internal; the
public names are re-exported by ``statemachine`` and ``statemachine.engine``.
"""
