"""Cerebellum: tokens, compiler, sandbox, the driver loop (``driver``), a running case (``case/``)
and the cohort runner (``cohort``).

Importing this package is cheap and never imports ray: the pure modules (``tokens``,
``compiler``, ``sandbox``) are usable without a Ray session; Ray-backed modules import ray
themselves when loaded.
"""
