"""Cerebellum: tokens, compiler, sandbox, Ray executor and cohort runner.

Importing this package is cheap and never imports ray: the pure modules (``tokens``,
``compiler``, ``sandbox``) are usable without a Ray session; Ray-backed modules import ray
themselves when loaded.
"""
