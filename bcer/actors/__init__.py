"""Ray actors and agents: Brain planners, the Reflector, LLM backends, R4 agents, memory actor.

Importing this package is cheap and never imports ray; each module imports ray only where it
starts an actor.
"""
