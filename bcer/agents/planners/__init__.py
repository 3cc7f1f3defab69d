"""Planners: the offline planner (``offline``, deterministic, no model), the LLM planner (``llm``)
and ``bundles`` (binds chosen model bundles into any planner's steps). They implement the engine's
planner protocol (``bcer.engine.planning``)."""
