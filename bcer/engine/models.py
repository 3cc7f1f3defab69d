"""The protocol of long-lived model servers the engine hands some nodes to instead of tasks.

Heavy models (a MONAI bundle's network) should load once per GPU, not once per call: a
server (``bcer.agents.model_server.BundleActorPool``: one Ray actor per GPU) runs the very
same node entry point as a task (``engine.noderun.run_node``) inside an actor that keeps the
model loaded. The engine only asks whether a node is served and submits it there; it never
imports ``actors``. A served node returns exactly what a node task returns (one ObjectRef per
output field, then the meta), so binding, repair, cache and deliverables work unchanged.
"""
from __future__ import annotations

import logging
from typing import Any, Protocol, runtime_checkable

log = logging.getLogger(__name__)


@runtime_checkable
class ModelServer(Protocol):
    """Serves the nodes of some tools from model actors.

    Attributes:
        reserved_gpus: GPUs the server's actors hold for the whole run; placement never
            offers them to tasks (a task would otherwise wait for them forever).
    """

    reserved_gpus: float

    def serves(self, tool: str, params: dict[str, Any]) -> bool:
        """True when the node of ``tool`` with (resolved) ``params`` runs on this server."""
        ...

    def submit(self, spec: dict[str, Any], args: list[Any], num_returns: int) -> list[Any]:
        """Submit one node (``spec`` and the argument refs of ``engine.noderun.run_node``).

        Returns:
            ``num_returns`` ObjectRefs: one per output field, then the node's meta.
        """
        ...


def serving(server: Any, tool: str, params: dict[str, Any]) -> bool:
    """Whether ``server`` (a ModelServer or None) takes this node; a server that fails to
    answer never takes it (the node then runs as a task)."""
    if server is None:
        return False
    try:
        return bool(server.serves(tool, params))
    except Exception as e:  # a broken server must not fail the node: the task path still works
        log.warning("model server cannot say whether it serves %s (%s): running it as a task", tool, e)
        return False


def resolve_server(server: Any) -> Any:
    """A ModelServer, or the one a zero-argument factory builds (called once Ray is up)."""
    if server is None or isinstance(server, ModelServer):
        return server
    return server() if callable(server) else server


def release_server(server: Any) -> None:
    """Close a server the cohort built (its actors and the GPUs they hold); errors are logged."""
    close = getattr(server, "close", None)
    if callable(close):
        try:
            close()
        except Exception:  # best-effort cleanup: a server may raise anything
            log.exception("closing the model server failed")


__all__ = ["ModelServer", "release_server", "resolve_server", "serving"]
