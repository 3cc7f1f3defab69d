"""Agents by role: planners (``planners/``), node repair (``repair/``: the Reflector and its LLM
tier), LLM backends (``llm/``), the R4 report loop (``r4/``), the model server and the memory actor.

Importing this package is cheap and never imports ray; each module imports ray only where it
starts an actor.
"""
