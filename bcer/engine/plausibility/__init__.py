"""Plausibility: named domain checks over a case's written deliverables; part of SR.

A contract lists the checks that apply to its deliverables (``plausibility:`` in its YAML,
``bcer.contracts.task.PlausibilityCheck``). After the contract's validators, the executor
runs them (``bcer.engine.case.finish``): a delivered case that fails one ends ``implausible``
with SR 0, error code ``value_range`` and a message naming the check and the value; each
check is a ``plausibility`` event; the cohort row lists every result.

The table of checks (name -> function, params model with default limits and the source of
each limit in its docstring) is ``CHECKS``.
"""
from __future__ import annotations

from . import brain, cardiac, image, prostate, registration  # noqa: F401  (register the checks)
from .core import (CHECKS, CheckDef, CheckResult, FileCache, Inputs, Verdict, check, failed, resolve, run_check,
                   run_checks, summary_message)

__all__ = ["CHECKS", "CheckDef", "CheckResult", "FileCache", "Inputs", "Verdict", "check", "failed",
           "resolve", "run_check", "run_checks", "summary_message"]
