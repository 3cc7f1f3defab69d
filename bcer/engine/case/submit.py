"""Submitting a case's nodes: which are ready, where each runs, the spec its worker gets, and
the ObjectRefs it is chained to.

``CaseSubmit`` is the submission half of ``case.run.CaseRun`` (which mixes it in, as it mixes in
``CaseRepair``): it reads the run's dependencies, node states and refs, places each node
(``engine.placement``), builds the worker's spec (tool, resolved params, ports and where each
comes from, the metas it waits on, the deliverables it writes) and hands it to Ray or to the
model actor that serves the tool. Segments and fusion (``engine.segments``/``engine.fusion``)
reuse ``_node_spec``, ``_prefix``, ``_args`` and ``_record_submission``.
"""
from __future__ import annotations

import sys
import time
from typing import Any

from ...contracts.errors import ErrorCode, ToolError
from ...contracts.workflow import Node
from ...tools.registry import get_tool, validate_params
from ..binder import resolve_params, runtime_values, sequence_key
from ..models import serving
from ..placement import Placement, place, task_name, task_options
from ..segments import submit_segment
from ..tokens import parse_token


class CaseSubmit:
    """Node submission of a ``CaseRun`` (attributes and the helpers it uses are CaseRun's)."""
    def _submittable(self, node_id: str) -> bool:
        if self.status[node_id] != "pending" or node_id not in self.deps:
            return False
        nodes, seqs = self.deps[node_id]
        return (all(self.status.get(u) in ("running", "succeeded") for u in nodes)
                and all(k in self.seq_refs and self.seq_meta.get(k, {}).get("ok", True) for k in seqs))

    def _submit_ready(self) -> None:
        # repeat: a node that fails at submission and is patched may become submittable again
        progressed = True
        while progressed and not self.finished:
            progressed = False
            for n in list(self.wf.nodes):
                if self._submittable(n.id):
                    if not (self.segment_chains and submit_segment(self, n)):
                        self._submit(n)
                    progressed = True

    def _inputs_ready(self, node_id: str) -> bool:
        nodes, seqs = self.deps.get(node_id, (set(), set()))
        return (all(self.status.get(u) == "succeeded" for u in nodes)
                and all(self.seq_meta.get(k, {}).get("ok") for k in seqs))

    def _timeout_of(self, node: Node) -> float | None:
        return self.ctx.node_timeout_s or getattr(node.resources, "timeout_s", None)

    def _submit(self, node: Node) -> None:
        from ..remote import remote_node, submit

        attempt = self.runs.get(node.id, 0) + 1
        server = self.ctx.model_server
        served = serving(server, node.tool, node.params) and self.device_override.get(node.id) != "cpu"
        try:
            # served: the actor's own resources hold the GPU; it runs the node on its device
            where = (Placement(0.0, 0.0, None, "cuda") if served else
                     place(node, self.cluster, self.ctx.device_policy, self.device_override.get(node.id),
                           self.ctx.gpu_concurrency, float(getattr(server, "reserved_gpus", 0.0) or 0.0)))
        except ToolError as e:  # no GPU for a GPU-only tool: fail now, never pend forever
            self.runs[node.id] = attempt
            self._on_failure(node, e.to_dict(), attempt, repairable=False)
            return
        try:
            spec = self._node_spec(node, where.device)
        except ToolError as e:
            self.runs[node.id] = attempt
            self._on_failure(node, e.with_context(node=node.id, tool=node.tool).to_dict(), attempt)
            return
        if where.fallback:
            self.trace.emit("fallback", node=node.id, tool=node.tool, attempt=attempt,
                            message=f"{node.tool} runs its CPU path: {where.fallback}")
        gen = self.gen[node.id] = self.gen.get(node.id, 0) + 1
        opts = task_options(task_name(self.case.id, node.id, node.tool), where, len(node.outputs) + 1,
                            self.ctx.task_max_retries)
        spec["ports"] = [(port, (*self._prefix(src), *path)) for (port, path), src in zip(spec["ports"], spec["sources"])]
        spec.update(self.clock_fields(node.id, gen))
        if served:  # the model actor runs the same entry point as the task (engine.models)
            self.served.add(node.id)
            refs = server.submit(spec, self._args(spec), len(node.outputs) + 1)
        else:
            self.served.discard(node.id)
            refs = submit(remote_node(), opts, spec, *self._args(spec))
        self.status[node.id] = "running"
        self.refs[node.id] = {f: (r, ()) for f, r in zip(node.outputs, refs[:-1])}
        self.meta_refs[node.id] = refs[-1]
        self._watch(("node", node.id, gen), refs[-1])
        self._record_submission(node, spec, where.device, attempt)
        if where.num_gpus or served:  # the GPU share asked of Ray (or the actor that serves it)
            self.records[node.id]["gpu_request"] = "actor" if served else where.num_gpus

    def _record_submission(self, node: Node, spec: dict[str, Any], device: str, attempt: int) -> None:
        self.records[node.id] = {"tool": node.tool, "version": node.version, "params": spec["params"],
                                 "inputs": dict(node.inputs), "device": device, "attempt": attempt}
        if self._inputs_ready(node.id):
            self.ready_at[node.id] = time.time()

    def _node_spec(self, node: Node, device: str) -> dict[str, Any]:
        """What the worker needs to run one node: tool, params, ports and where each input comes
        from, the metas it depends on, the deliverables it writes. Raises ToolError."""
        runtime = runtime_values(self.ctx.output_dir, device, self.ctx.seed, self.ctx.run_id)
        params = resolve_params(node.params, self.case, runtime)
        validate_params(node.tool, params)
        reg = get_tool(node.tool)
        params = self.sandbox.check_args(params, reg.params_model)  # path params come back resolved
        ports, sources = self._sources(node)
        ups, seqs = self.deps[node.id]
        deps = [("node", u) for u in sorted(ups)] + [("seq", k) for k in sorted(seqs)]
        index = {d: i for i, d in enumerate(deps)}
        port_deps = [(index[src[:2]], src[2] if src[0] == "node" else None) for src in sources]
        for w in self.targets.get(node.id, ()):
            self.sandbox.check_write(self.ctx.output_dir / w["file"])  # checked here and by the writer
        fn = reg.fn
        return {"tool": node.tool, "version": node.version, "module": fn.__module__,
                "module_file": getattr(sys.modules.get(fn.__module__), "__file__", "") or "",
                "node": node.id, "case": self.case.id, "run": self.ctx.run_id, "ports": ports,
                "inputs": dict(node.inputs),
                "sources": sources, "port_deps": port_deps, "deps": [f"{k}.{u}" for k, u in deps],
                "params": params, "device": device, "outputs": list(node.outputs),
                "timeout_s": self._timeout_of(node), "writes": self._worker_writes(node),
                "intermediates": self.ctx.write_intermediates,
                "cache_dir": str(self.ctx.cache_dir) if self.ctx.cache_dir else None,
                "output_dir": str(self.ctx.output_dir), "input_root": str(self.case.root),
                "read_roots": self.read_roots}

    def _sources(self, node: Node) -> tuple[list, list]:
        """(port, subfield path) pairs and where each port's value comes from: ``("seq", key)``
        or ``("node", id, field)``."""
        ports, sources = [], []
        for port, raw in node.inputs.items():
            tok = parse_token(raw)
            if tok.scope == "seq":
                ports.append((port, ()))
                sources.append(("seq", sequence_key(self.case, tok.name)))
                continue
            outputs = next((n.outputs for n in self.wf.nodes if n.id == tok.name), [])
            if tok.field not in outputs:
                raise ToolError(ErrorCode.bad_reference, f"node {tok.name} has no output {tok.field!r}",
                                hint=f"valid: {sorted(outputs)}", arg=port)
            ports.append((port, tuple(tok.path[1:])))
            sources.append(("node", tok.name, tok.field))
        return ports, sources

    def _prefix(self, src: tuple) -> tuple:
        return (self.seq_refs[src[1]] if src[0] == "seq" else self.refs[src[1]][src[2]])[1]

    def _args(self, spec: dict[str, Any]) -> list[Any]:
        """The ObjectRefs (or kept values) a node task receives: its inputs, then its deps' metas
        (Ray resolves refs before the task runs, so the DAG is chained without the driver)."""
        values = [(self.seq_refs[src[1]] if src[0] == "seq" else self.refs[src[1]][src[2]])[0]
                  for src in spec["sources"]]
        metas = [self.meta_refs[d.partition(".")[2]] if d.startswith("node.") else
                 self.seq_meta_refs[d.partition(".")[2]] for d in spec["deps"]]
        return [*values, *metas]
