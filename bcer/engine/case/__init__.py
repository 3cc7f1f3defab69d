"""A running case: its state machine (``run``), node submission (``submit``), failure handling
and local repair (``repair``) and closing (``finish``: validation, plausibility, provenance,
``_DONE``). The driver (``engine.driver``) feeds it the results of its Ray tasks."""
