"""Submitting a case's nodes: which are ready, where each runs, the spec its worker gets, the
ObjectRefs it is chained to, and the deliverables it writes.

``Submitter`` is given the ``CaseRun`` (its state, trace and watched refs): it places each node
(``engine.placement``), builds the worker's spec (tool, resolved params, ports and where each
comes from, the metas it waits on, the deliverables it writes) and hands it to Ray or to the
model actor that serves the tool. Segments and fusion (``engine.segments``/``engine.fusion``)
reuse ``node_spec``, ``prefix`` and ``record_submission``.
"""
from __future__ import annotations

import sys
import time
from typing import Any

from ...contracts.artifacts import ArtifactKind
from ...contracts.errors import ErrorCode, ToolError
from ...contracts.workflow import Deliverable, Node
from ...tools.registry import get_tool, validate_params
from ..binder import resolve_params, runtime_values, sequence_key
from ..models import serving
from ..placement import Placement, place, task_name, task_options
from ..segments import submit_segment
from ..tokens import parse_token


class Submitter:
    """Node submission of one running case (``run``: its ``case.run.CaseRun``; never imported here,
    so the run and its collaborators form no import circle)."""

    def __init__(self, run: Any):
        self.run = run
        self.state = run.state

    def submit_ready(self) -> None:
        # repeat: a node that fails at submission and is patched may become submittable again
        st = self.state
        progressed = True
        while progressed and not st.finished:
            progressed = False
            for n in list(st.wf.nodes):
                if st.submittable(n.id):
                    if not (st.segment_chains and submit_segment(self.run, n)):
                        self.submit(n)
                    progressed = True

    def submit(self, node: Node) -> None:
        from ..remote import remote_node, submit

        run, st, s = self.run, self.state, self.state.nodes[node.id]
        attempt = s.attempts + 1
        server = st.ctx.model_server
        served = serving(server, node.tool, node.params) and s.device != "cpu"
        try:
            # served: the actor's own resources hold the GPU; it runs the node on its device
            where = (Placement(0.0, 0.0, None, "cuda") if served else
                     place(node, st.cluster, st.ctx.device_policy, s.device, st.ctx.gpu_concurrency,
                           float(getattr(server, "reserved_gpus", 0.0) or 0.0)))
        except ToolError as e:  # no GPU for a GPU-only tool: fail now, never pend forever
            s.attempts = attempt
            run.repair.on_failure(node, e.to_dict(), attempt, repairable=False)
            return
        try:
            spec = self.node_spec(node, where.device)
        except ToolError as e:
            s.attempts = attempt
            run.repair.on_failure(node, e.with_context(node=node.id, tool=node.tool).to_dict(), attempt)
            return
        if where.fallback:
            run.trace.emit("fallback", node=node.id, tool=node.tool, attempt=attempt,
                           message=f"{node.tool} runs its CPU path: {where.fallback}")
        s.gen += 1
        gen = s.gen
        opts = task_options(task_name(st.case.id, node.id, node.tool), where, len(node.outputs) + 1,
                            st.ctx.task_max_retries)
        spec["ports"] = [(port, (*self.prefix(src), *path)) for (port, path), src in zip(spec["ports"], spec["sources"])]
        spec.update(run.clock_fields(node.id, gen))
        s.served = bool(served)
        if served:  # the model actor runs the same entry point as the task (engine.models)
            refs = server.submit(spec, self._args(spec), len(node.outputs) + 1)
        else:
            refs = submit(remote_node(), opts, spec, *self._args(spec))
        s.status = "running"
        s.refs = {f: (r, ()) for f, r in zip(node.outputs, refs[:-1])}
        s.meta_ref = refs[-1]
        run.watch(("node", node.id, gen), refs[-1])
        self.record_submission(node, spec, where.device, attempt)
        if where.num_gpus or served:  # the GPU share asked of Ray (or the actor that serves it)
            s.record["gpu_request"] = "actor" if served else where.num_gpus

    def record_submission(self, node: Node, spec: dict[str, Any], device: str, attempt: int) -> None:
        s = self.state.nodes[node.id]
        s.record = {"tool": node.tool, "version": node.version, "params": spec["params"],
                    "inputs": dict(node.inputs), "device": device, "attempt": attempt}
        if self.state.inputs_ready(node.id):
            s.ready_at = time.time()

    def node_spec(self, node: Node, device: str) -> dict[str, Any]:
        """What the worker needs to run one node: tool, params, ports and where each input comes
        from, the metas it depends on, the deliverables it writes. Raises ToolError."""
        st, sandbox = self.state, self.run.sandbox
        runtime = runtime_values(st.ctx.output_dir, device, st.ctx.seed, st.ctx.run_id)
        params = resolve_params(node.params, st.case, runtime)
        validate_params(node.tool, params)
        reg = get_tool(node.tool)
        params = sandbox.check_args(params, reg.params_model)  # path params come back resolved
        ports, sources = self._sources(node)
        ups, seqs = st.nodes[node.id].deps
        deps = [("node", u) for u in sorted(ups)] + [("seq", k) for k in sorted(seqs)]
        index = {d: i for i, d in enumerate(deps)}
        port_deps = [(index[src[:2]], src[2] if src[0] == "node" else None) for src in sources]
        for w in st.nodes[node.id].targets:
            sandbox.check_write(st.ctx.output_dir / w["file"])  # checked here and by the writer
        fn = reg.fn
        return {"tool": node.tool, "version": node.version, "module": fn.__module__,
                "module_file": getattr(sys.modules.get(fn.__module__), "__file__", "") or "",
                "node": node.id, "case": st.case.id, "run": st.ctx.run_id, "ports": ports,
                "inputs": dict(node.inputs),
                "sources": sources, "port_deps": port_deps, "deps": [f"{k}.{u}" for k, u in deps],
                "params": params, "device": device, "outputs": list(node.outputs),
                "timeout_s": st.timeout_of(node), "writes": self.worker_writes(node),
                "intermediates": st.ctx.write_intermediates, "companions": st.ctx.audit,
                "cache_dir": str(st.ctx.cache_dir) if st.ctx.cache_dir else None,
                "output_dir": str(st.ctx.output_dir), "input_root": str(st.case.root),
                "read_roots": self.run.read_roots}

    def _sources(self, node: Node) -> tuple[list, list]:
        """(port, subfield path) pairs and where each port's value comes from: ``("seq", key)``
        or ``("node", id, field)``."""
        ports, sources = [], []
        for port, raw in node.inputs.items():
            tok = parse_token(raw)
            if tok.scope == "seq":
                ports.append((port, ()))
                sources.append(("seq", sequence_key(self.state.case, tok.name)))
                continue
            outputs = next((n.outputs for n in self.state.wf.nodes if n.id == tok.name), [])
            if tok.field not in outputs:
                raise ToolError(ErrorCode.bad_reference, f"node {tok.name} has no output {tok.field!r}",
                                hint=f"valid: {sorted(outputs)}", arg=port)
            ports.append((port, tuple(tok.path[1:])))
            sources.append(("node", tok.name, tok.field))
        return ports, sources

    def source(self, src: tuple) -> tuple[Any, tuple]:
        """Where a ``("seq", key)`` or ``("node", id, field)`` source's value is: (ref, sub-path)."""
        return self.state.seqs[src[1]].ref if src[0] == "seq" else self.state.nodes[src[1]].refs[src[2]]

    def prefix(self, src: tuple) -> tuple:
        return self.source(src)[1]

    def meta_ref(self, dep: str) -> Any:
        """The meta ObjectRef of a ``node.<id>`` or ``seq.<key>`` dependency."""
        kind, _, name = dep.partition(".")
        return self.state.nodes[name].meta_ref if kind == "node" else self.state.seqs[name].meta_ref

    def _args(self, spec: dict[str, Any]) -> list[Any]:
        """The ObjectRefs (or kept values) a node task receives: its inputs, then its deps' metas
        (Ray resolves refs before the task runs, so the DAG is chained without the driver)."""
        values = [self.source(src)[0] for src in spec["sources"]]
        return [*values, *(self.meta_ref(d) for d in spec["deps"])]

    # ---- deliverables -------------------------------------------------------------------------
    def plan_targets(self) -> None:
        """Deliverables of the workflow (without any, the outputs of its sink nodes), per node."""
        for s in self.state.nodes.values():
            s.targets = []
        for d in self._deliverables():
            if d.node in self.state.nodes:
                self.state.nodes[d.node].targets.append({"name": d.name, "field": d.field, "file": d.file})

    def _deliverables(self) -> list[Deliverable]:
        wf = self.state.wf
        if wf.deliverables or self.state.contract is not None:
            return list(wf.deliverables)
        sinks = {n.id for n in wf.nodes} - {u for ups, _ in self.state.bound().values() for u in ups}
        return [Deliverable(name=f"{n.id}.{f}" if len(n.outputs) > 1 else n.id, node=n.id, field=f,
                            file=f"{n.id}_{f}" if len(n.outputs) > 1 else n.id)
                for n in wf.nodes if n.id in sinks for f in n.outputs]

    def reviewed_writes(self, node: Node) -> list[dict[str, str]]:
        """The node's report deliverables when a reviewer is set: the driver reviews (R4) and
        writes them (``engine.review``); the worker writes the others."""
        targets = self.state.nodes[node.id].targets
        if getattr(self.state.ctx, "reviewer", None) is None or not targets:
            return []
        spec = get_tool(node.tool).spec
        return [w for w in targets
                if (port := spec.output(w["field"])) is not None and port.kind == ArtifactKind.report]

    def worker_writes(self, node: Node) -> list[dict[str, str]]:
        reviewed = self.reviewed_writes(node)
        return [w for w in self.state.nodes[node.id].targets if w not in reviewed]


__all__ = ["Submitter"]
