"""The run layer: the asyncio action loop that drives the engine, tools, the model.

This layer is internal; the public names are re-exported by ``statemachine``.
"""
