"""Task-contract benchmark: SR/TCR per task with quality against ground truth beside it."""
from .bench import resolve_tasks, run_bench, task_summary

__all__ = ["resolve_tasks", "run_bench", "task_summary"]
