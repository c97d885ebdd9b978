"""The run layer: the asyncio driver around the engine.

``run`` (``AgentRun``, ``run_agent``, ``run_agent_sync``), and the parts an
``AgentRun`` holds: ``loop`` (``ActionLoop``: the engine decides, an executor
performs), ``executor`` (``AsyncioExecutor``, given a ``Backend`` that starts each
operation), ``hook_calls`` (``HookCaller``),
``stream`` (``EventStream``); then ``resume``, ``calls`` (calling code the library does
not own), ``hooks``, ``events`` (what a run reports), ``tools`` (``Tool``, ``@tool``),
``signature``, ``model``. This layer is internal; the public names are re-exported by
``statemachine``.
"""
