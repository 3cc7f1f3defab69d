"""Node repair: the Reflector (``reflector``: tier 1, deterministic) and its LLM tier
(``llm_tier``: tier 2, a patch constrained by a JSON schema). It implements the engine's repairer
protocol (``bcer.engine.repair``); the R4 loop's report critic (``agents.r4.critic``) is another thing."""
