"""Task-contract benchmark (SR/TCR, quality beside it) and the controller ablation under
injected faults (``ablation``, ``arms``, ``faults``, ``react``, ``compare``)."""
from .bench import resolve_tasks, run_bench, task_summary

__all__ = ["resolve_tasks", "run_ablation", "run_bench", "task_summary"]


def __getattr__(name: str):
    if name == "run_ablation":  # imported lazily: the ablation pulls in the actors
        from .ablation import run_ablation

        return run_ablation
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
