"""The run layer: the asyncio action loop that drives the engine, tools, the model.

``loop`` (the action loop and its executor seam), ``executor`` (the asyncio one),
``hook_calls`` (asking the hooks, for the executor), ``run`` (``AgentRun``,
``run_agent``), ``resume``, ``hooks``, ``events`` (what a run reports), ``tools``
(``Tool``, ``@tool``), ``signature``, ``model``. This layer is internal; the public
names are re-exported by ``statemachine``.
"""
