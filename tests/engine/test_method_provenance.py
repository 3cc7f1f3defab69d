"""Provenance names each node's method, and each output carries the lineage a report opens with."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bcer.contracts import Case, Image, PlanSketch, SequenceRef
from bcer.engine.compiler import compile_plan
from bcer.engine.executor import RunContext, run_case_workflows
from bcer.io import write_nifti

pytestmark = pytest.mark.timeout(120)


def test_provenance_names_methods_and_outputs_carry_lineage(ray_local, tmp_path: Path) -> None:
    path = write_nifti(Image(np.full((6, 6, 4), 2.0, np.float32), np.eye(4)), tmp_path / "in" / "m1.nii.gz")
    case = Case(id="m1", root=str(path.parent), sequences={"T1": SequenceRef(path=str(path))})
    plan = PlanSketch(goal="t", steps=[
        {"id": "s", "tool": "xtoy.step", "args": {"img": "@seq.T1", "add": 3}},
        {"id": "m", "tool": "xtoy.measure", "args": {"img": "@node.s.image"}},
        {"id": "g", "tool": "xtoy.grade", "args": {"table": "@node.m.table"}}])
    ctx = RunContext(run_id="p", output_dir=tmp_path / "out" / case.id)
    (out,) = run_case_workflows([(compile_plan(plan, case), case, ctx)])
    assert out.status == "succeeded", out.error
    prov = json.loads((ctx.output_dir / "provenance.json").read_text())["deliverables"]["g"]
    chain = {r["node"]: r for r in prov["chain"]}
    assert set(chain) == {"s", "m", "g"}
    for node, tool in (("s", "xtoy.step"), ("m", "xtoy.measure"), ("g", "xtoy.grade")):
        card = chain[node]["method"]
        assert (card["name"], card["version"]) == (tool, chain[node]["version"]) and card.get("kind", "computation") == "computation"
    assert chain["m"]["method"]["summary"] == "Mean and voxel count of an image."
    written = json.loads((ctx.output_dir / next(iter(prov["files"]))).read_text())  # the xtoy tools come from conftest
    lineage = written["meta"]["lineage"]
    assert lineage["case"] == "m1" and list(lineage["nodes"]) == ["s", "m", "g"]
    assert lineage["nodes"]["s"]["reads"] == {"img": "series T1"} and lineage["nodes"]["g"]["reads"] == {"table": "node m"}
