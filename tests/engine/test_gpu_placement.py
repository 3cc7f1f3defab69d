"""GPU sharing settings, the model-server seam and the CPU fallback where no GPU exists
(no GPU cluster needed: see test_gpu_cluster for the simulated one)."""
from __future__ import annotations

import importlib
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

from bcer.contracts import Case, Image, PlanSketch, Resources, SequenceRef, ToolError
from bcer.contracts.errors import ErrorCode
from bcer.contracts.workflow import Node
from bcer.engine.gpu_usage import gpu_runs, peak_per_gpu, usage_summary
from bcer.engine.models import ModelServer, resolve_server, serving
from bcer.engine.placement import gpu_share, place

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
importlib.import_module("tests.engine._gpu_tools")

pytestmark = pytest.mark.timeout(120)
GPU4 = {"CPU": 8.0, "GPU": 4.0}


def _node(gpu: str, **res) -> Node:
    return Node(id="n", tool="t", gpu=gpu, resources=Resources(**res))


@pytest.mark.parametrize("want,k,share", [(1.0, 2, 0.5), (1.0, 3, 0.3333), (1.0, 4, 0.25), (0.25, 2, 0.5),
                                          (0.25, None, 0.25), (0.75, 2, 0.75), (2.0, 2, 2.0), (1.0, 1, 1.0)])
def test_gpu_share(want, k, share):
    assert gpu_share(want, k) == share
    if k and want <= 1:  # K shares fit one GPU, a (K+1)-th never does
        assert k * gpu_share(1.0, k) <= 1.0 < (k + 1) * gpu_share(1.0, k)


def test_gpu_concurrency_below_one_is_a_schema_error():
    with pytest.raises(ToolError) as e:
        gpu_share(1.0, 0.5)  # type: ignore[arg-type]
    assert e.value.code == ErrorCode.schema


def test_place_applies_k_on_gpus_and_falls_back_to_cpu_without_them():
    assert place(_node("optional"), GPU4, gpu_concurrency=4).num_gpus == 0.25
    assert place(_node("required", num_gpus=0.25), GPU4, gpu_concurrency=2).num_gpus == 0.5
    assert place(_node("none"), GPU4, gpu_concurrency=2).num_gpus == 0.0  # CPU tools never ask for GPUs
    cpu = place(_node("optional"), {"CPU": 2.0}, gpu_concurrency=2)  # the new setting on a CPU cluster
    assert (cpu.num_gpus, cpu.device, cpu.fallback) == (0.0, "cpu", None)  # a CPU cluster's ordinary run
    with pytest.raises(ToolError) as e:
        place(_node("required"), {"CPU": 2.0}, gpu_concurrency=2)
    assert e.value.code == ErrorCode.resource


def test_gpus_held_by_model_actors_are_not_offered_to_tasks():
    held = place(_node("optional"), {"CPU": 4.0, "GPU": 2.0}, reserved_gpus=2.0)
    assert (held.device, held.num_gpus) == ("cpu", 0.0) and "model actors" in held.fallback
    assert place(_node("optional"), {"CPU": 4.0, "GPU": 2.0}, reserved_gpus=1.0).device == "cuda"
    with pytest.raises(ToolError) as e:
        place(_node("required"), {"CPU": 4.0, "GPU": 2.0}, reserved_gpus=2.0)
    assert e.value.code == ErrorCode.resource and "model actors" in e.value.message


def _ev(kind, node, t, gpu=None, actor=None):
    data = {"node_id": gpu[0], "gpu_ids": [gpu[1]], **({"actor": actor} if actor else {})} if gpu else None
    return {"kind": kind, "case": "c", "node": node, "attempt": 1, "time": t, "data": data}


def test_peak_per_gpu_from_the_trace():
    ev = [_ev("started", "a", 0.0), _ev("succeeded", "a", 2.0, ("N1", "0")),
          _ev("started", "b", 1.0), _ev("succeeded", "b", 3.0, ("N1", "0")),
          _ev("started", "c", 2.0), _ev("succeeded", "c", 4.0, ("N1", "0")),  # starts as a ends: no overlap
          _ev("started", "d", 0.5), _ev("succeeded", "d", 0.9, ("N2", "1"), actor="x"),
          _ev("started", "e", 0.0), _ev("succeeded", "e", 1.0)]  # a CPU node: not a GPU run
    runs = gpu_runs(ev)
    assert len(runs) == 4
    assert peak_per_gpu(runs) == {("N1", "0"): 2, ("N2", "1"): 1}
    s = usage_summary(ev)
    assert (s["distinct_gpus"], s["max_peak"], s["actors"]) == (2, 2, ["x"])


class _Broken:
    reserved_gpus = 0.0

    def serves(self, tool, params):
        raise RuntimeError("gone")

    def submit(self, spec, args, num_returns):
        raise AssertionError("never called")


def test_model_server_seam():
    broken = _Broken()
    assert isinstance(broken, ModelServer)
    assert serving(None, "t", {}) is False
    assert serving(broken, "t", {}) is False  # a broken server never takes a node: it runs as a task
    assert resolve_server(broken) is broken and resolve_server(lambda: None) is None


def test_cpu_only_cluster_runs_gpu_tools_on_cpu_with_k_and_no_actor_pool(ray_local, tmp_path):
    from bcer.agents.model_server import BundleActorPool, bundle_server_factory
    from bcer.engine.cohort import CohortConfig, run_cohort
    from bcer.engine.planning import StaticPlanner
    from bcer.io import read_nifti, write_nifti
    from bcer.tools.seg.bundle import shipped_bundle

    bundles = {"seg.cardiac": str(shipped_bundle())}
    assert bundle_server_factory(bundles)() is None  # no GPU: bundle tools stay tasks on their CPU path
    with pytest.raises(ToolError) as e:
        BundleActorPool(bundles)
    assert e.value.code == ErrorCode.resource
    cases = []
    for i in range(2):
        d = tmp_path / "in" / f"c{i}"
        d.mkdir(parents=True)
        p = write_nifti(Image(np.full((4, 4, 2), float(i), np.float32), np.eye(4)), d / "t1.nii.gz")
        cases.append(Case(id=f"c{i}", root=str(d), sequences={"T1": SequenceRef(path=str(p))}))
    plan = PlanSketch(goal="g", steps=[{"id": "q", "tool": "xgpu.quarter", "args": {"img": "@seq.T1",
                                                                                    "sleep_s": 0.0}}])
    out = tmp_path / "out"
    res = run_cohort(cases, CohortConfig(out=out, planner=StaticPlanner(plan), gpu_concurrency=2, fuse="never",
                                         run_id="cpu-" + uuid.uuid4().hex[:6],
                                         model_server=bundle_server_factory(bundles, 2)))
    assert [r["status"] for r in res.rows] == ["succeeded", "succeeded"]
    events = res.events.to_pylist()
    assert sum(e["kind"] == "fallback" for e in events) == 0  # no GPU anywhere: the CPU path is no fallback
    assert {e["message"] for e in events if e["kind"] == "succeeded"} == {"device=cpu"}
    assert usage_summary(events)["gpu_runs"] == 0  # nothing claims a GPU
    np.testing.assert_allclose(read_nifti(out / "c1" / "q.nii.gz").data, 2.0)  # input 1 + 1


def test_study_and_cli_carry_the_gpu_settings(ray_local, tmp_path):
    from typer.testing import CliRunner

    from bcer.api import Study
    from bcer.cli.main import app
    from bcer.tools.seg.bundle import shipped_bundle

    case = Case(id="c", root=str(tmp_path), sequences={})
    plan = PlanSketch(goal="g", steps=[{"id": "s", "tool": "seg.cardiac", "args": {"cine": "@seq.CINE"}}])
    study = Study([case], plan=plan, out=tmp_path / "o", bundles={"seg.cardiac": str(shipped_bundle())},
                  model_actors=True, gpu_concurrency=2)
    cfg = study.config()
    assert cfg.gpu_concurrency == 2 and callable(cfg.model_server)
    assert cfg.model_server() is None  # the 2-CPU test cluster has no GPU: no pool, tasks on CPU
    assert Study([case], plan=plan, out=tmp_path / "o", model_actors=True).config().model_server is None
    text = CliRunner().invoke(app, ["cohort", "--help"], env={"COLUMNS": "200"}).output
    assert "--gpu-concurrency" in text and "--model-actors" in text
