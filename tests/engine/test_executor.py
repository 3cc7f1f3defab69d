"""Executor "Must show" tests of issue 2, on the shared 2-CPU local Ray session.

Toy tools live in ``_exec_tools`` (imported by module name in Ray workers too); workflows are
compiled from small sketches with the real compiler.
"""
from __future__ import annotations

import gzip
import json
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from bcer.contracts import (Case, DeliverableSpec, Image, PlanSketch, SequenceRef, TaskContract, Validator)
from bcer.engine.compiler import compile_plan
from bcer.engine.executor import RunContext, run_case_workflow
from bcer.engine.trace import events_table, read_case_trace
from bcer.io import write_nifti


pytestmark = pytest.mark.timeout(90)
AFFINE = np.diag([1.5, 1.5, 3.0, 1.0])


@pytest.fixture(scope="module")
def reflector(ray_local, tmp_path_factory):
    """An in-process Reflector; also warms two workers (tool modules imported) so timing
    assertions measure the tools, not worker start-up."""
    from bcer.agents.repair.reflector import Reflector

    refl = Reflector()
    tmp = tmp_path_factory.mktemp("warm")
    plan = sketch(*({"id": f"w{i}", "tool": "xtoy.step", "args": {"img": "@seq.T1", "sleep_s": 0.6}}
                    for i in range(4)))
    assert run(tmp, make_case(tmp / "in", "warm"), plan, refl).status == "succeeded"
    return refl


def make_case(root: Path, case_id: str = "c1", value: float = 5.0, **meta) -> Case:
    root.mkdir(parents=True, exist_ok=True)
    data = (np.arange(8 * 8 * 4, dtype=np.float32).reshape(8, 8, 4) % 7) + value
    path = write_nifti(Image(data, AFFINE), root / f"{case_id}_t1.nii.gz")
    return Case(id=case_id, root=str(root), sequences={"T1": SequenceRef(path=str(path))}, metadata=meta)


def sketch(*steps: dict) -> PlanSketch:
    return PlanSketch(goal="test", steps=list(steps))


def run(tmp: Path, case: Case, plan: PlanSketch, reflector=None, contract=None, **ctx):
    wf = compile_plan(plan, case, contract)
    rc = RunContext(run_id="t-" + uuid.uuid4().hex[:6], output_dir=tmp / "out" / case.id, **ctx)
    return run_case_workflow(wf, case, rc, contract=contract, reflector=reflector)


def events(outcome_dir: Path):
    return read_case_trace(outcome_dir)


def intervals(evs, node=None):
    """Worker run intervals of succeeded nodes: [end - duration, end]."""
    return {(e.case, e.node): (e.time - e.duration_s, e.time) for e in evs
            if e.kind == "succeeded" and (node is None or e.node == node)}


class Recorder:
    """A lifecycle hook that records what it saw (keyword-only args + **future_kwargs)."""

    def __init__(self):
        self.starts, self.ends, self.cases = [], [], []

    def on_case_start(self, *, case, **kw):
        self.cases.append(("start", case))

    def on_node_start(self, *, case, node, attempt, **kw):
        self.starts.append(node)

    def on_node_end(self, *, case, node, status, duration_s, error, **kw):
        self.ends.append((node, status))

    def on_case_end(self, *, case, outcome, **kw):
        self.cases.append(("end", outcome.status))


class BrokenHook:
    """A hook that raises: it must be logged and ignored, never fail the case."""

    def on_node_end(self, **kw):
        raise RuntimeError("progress bar crashed")


def test_independent_branches_overlap(ray_local, tmp_path, reflector):
    case = make_case(tmp_path / "in")
    plan = sketch({"id": "a", "tool": "xtoy.step", "args": {"img": "@seq.T1", "add": 1}},
                  {"id": "left", "tool": "xtoy.step", "args": {"img": "@node.a.image", "sleep_s": 1.5}},
                  {"id": "right", "tool": "xtoy.step", "args": {"img": "@node.a.image", "sleep_s": 1.5, "add": 2}},
                  {"id": "j", "tool": "xtoy.join", "args": {"a": "@node.left.image", "b": "@node.right.image"}})
    outcome = run(tmp_path, case, plan, reflector)
    assert outcome.status == "succeeded", outcome.error
    iv = intervals(events(tmp_path / "out" / "c1"))
    (l0, l1), (r0, r1) = iv[("c1", "left")], iv[("c1", "right")]
    assert min(l1, r1) - max(l0, r0) > 0.75  # the two 1.5-s branches ran at the same time
    assert iv[("c1", "j")][0] >= max(l1, r1) - 1e-3  # the join waited for both
    out = tmp_path / "out" / "c1"
    got = np.asarray(__import__("nibabel").load(str(out / "j.nii.gz")).dataobj)
    src = np.asarray(case_data(case))
    np.testing.assert_allclose(got, 2 * src + 5, rtol=1e-6)  # (x+1+1) + (x+1+2)


def case_data(case: Case) -> np.ndarray:
    import nibabel as nib

    return np.asarray(nib.load(case.sequences["T1"].path).dataobj)


def test_eight_cases_run_as_parallel_ray_tasks(ray_local, tmp_path, reflector):
    plan = sketch({"id": "a", "tool": "xtoy.step", "args": {"img": "@seq.T1", "sleep_s": 0.5}},
                  {"id": "b", "tool": "xtoy.step", "args": {"img": "@node.a.image", "sleep_s": 0.5}},
                  {"id": "c", "tool": "xtoy.step", "args": {"img": "@node.b.image", "sleep_s": 0.5}},
                  {"id": "d", "tool": "xtoy.measure", "args": {"img": "@node.c.image"}})
    cases = [make_case(tmp_path / "in", f"p{i}", value=float(i)) for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda c: run(tmp_path, c, plan, reflector), cases))
    assert [o.status for o in outs] == ["succeeded"] * 8
    iv = {}
    for c in cases:
        iv.update(intervals(events(tmp_path / "out" / c.id)))
    busy = sum(e - s for s, e in iv.values())
    assert busy > 24 * 0.5  # 24 sleeping nodes of 0.5 s really ran
    starts = [s + 1e-3 for s, _ in iv.values()]
    running = [{c for (c, _n), (s, e) in iv.items() if s <= t < e} for t in starts]
    assert max(len(r) for r in running) >= 2  # nodes of different cases really ran at the same moment
    spans = []
    for c in cases:
        evs = events(tmp_path / "out" / c.id)
        spans.append((evs[0].time, evs[-1].time))  # case_started .. case_finished
    assert max(s for s, _ in spans) < min(e for _, e in spans)  # all 8 cases were in flight together
    for i, o in enumerate(outs):  # each case measured its own data: mean = mean(x) + 3
        want = float(np.mean(case_data(cases[i]))) + 3.0
        assert o.measurements["d.all.mean"] == pytest.approx(want, rel=1e-6)


def test_consumer_receives_only_its_field(ray_local, tmp_path, reflector):
    case = make_case(tmp_path / "in")
    plan = sketch({"id": "s", "tool": "xtoy.split", "args": {"img": "@seq.T1"}},
                  {"id": "p", "tool": "xtoy.probe", "args": {"mask": "@node.s.small"}})
    outcome = run(tmp_path, case, plan, reflector, write_intermediates=True)
    assert outcome.status == "succeeded", outcome.error
    inter = tmp_path / "out" / "c1" / "intermediates"
    assert sorted(p.name for p in inter.iterdir()) == ["p_table.csv", "p_table.json", "s_big.nii.gz",
                                                      "s_small.nii.gz"]
    row = json.loads((tmp_path / "out" / "c1" / "p.json").read_text())["rows"][0]
    assert row["type"] == "Mask" and row["field"] == "small" and row["shape"] == [8, 8, 4]
    data = case_data(case)
    assert row["voxels"] == int(np.count_nonzero(data > np.median(data)))
    prov = json.loads((tmp_path / "out" / "c1" / "provenance.json").read_text())["deliverables"]["p"]
    s_rec = prov["chain"][0]
    assert set(s_rec["output_digests"]) == {"big", "small"}  # one return (and digest) per field
    assert prov["chain"][1]["input_digests"]["mask"] == s_rec["output_digests"]["small"]


def test_middle_node_failure_repaired_by_tier1_only_it_reruns(ray_local, tmp_path, reflector):
    case = make_case(tmp_path / "in")
    plan = sketch({"id": "n1", "tool": "xtoy.step", "args": {"img": "@seq.T1"}},
                  {"id": "n2", "tool": "xtoy.step", "args": {"img": "@node.n1.image"}},
                  {"id": "n3", "tool": "xtoy.window", "args": {"img": "@node.n2.image", "window": 40}},
                  {"id": "n4", "tool": "xtoy.step", "args": {"img": "@node.n3.image"}},
                  {"id": "n5", "tool": "xtoy.measure", "args": {"img": "@node.n4.image"}})
    calls = Recorder()
    wf = compile_plan(plan, case)
    rc = RunContext(run_id="repair-" + uuid.uuid4().hex[:6], output_dir=tmp_path / "out" / case.id)
    # reflector=None: the executor gets-or-creates the run's named Reflector actor
    outcome = run_case_workflow(wf, case, rc, reflector=None, hooks=[calls, BrokenHook()])
    assert outcome.status == "succeeded", outcome.error
    assert ray_local.get_actor(f"bcer-reflector-{rc.run_id}-{zlib.crc32(b'c1') % 2}") is not None
    assert calls.ends.count(("n3", "failed")) == 2 and calls.ends.count(("n3", "succeeded")) == 1
    assert calls.starts.count("n3") == 3 and calls.cases == [("start", "c1"), ("end", "succeeded")]
    evs = events(tmp_path / "out" / "c1")
    ok = {n: sum(e.kind == "succeeded" and e.node == n for e in evs) for n in ("n1", "n2", "n3", "n4", "n5")}
    assert ok == {"n1": 1, "n2": 1, "n3": 1, "n4": 1, "n5": 1}
    started = [e.node for e in evs if e.kind == "started"]
    assert started.count("n3") == 3 and all(started.count(n) == 1 for n in ("n1", "n2", "n4", "n5"))
    repaired = [e for e in evs if e.kind == "repaired"]
    assert [e.patch["params"]["window"] for e in repaired] == [20, 10]  # halved twice: 40 -> 20 -> 10
    assert all(e.patch["tier"] == 1 for e in repaired) and outcome.repairs == 2
    assert outcome.workflow.node("n3").params["window"] == 10
    want = float(np.mean((case_data(case) + 2) * 2 + 1))  # n1,n2 +1 each; n3 x2; n4 +1
    assert outcome.measurements["n5.all.mean"] == pytest.approx(want, rel=1e-6)


def test_misspelt_field_token_is_repaired_before_submission(ray_local, tmp_path, reflector):
    from bcer.agents.repair.reflector import Reflector

    case = make_case(tmp_path / "in")
    plan = sketch({"id": "a", "tool": "xtoy.step", "args": {"img": "@seq.T1"}},
                  {"id": "m", "tool": "xtoy.measure", "args": {"img": "@node.a.image"}})
    wf = compile_plan(plan, case)
    wf.node("m").inputs["img"] = "@node.a.imag"  # as a sloppy plan edit would leave it
    rc = RunContext(run_id="typo", output_dir=tmp_path / "out" / case.id)
    outcome = run_case_workflow(wf, case, rc, reflector=Reflector())
    assert outcome.status == "succeeded", outcome.error
    evs = events(rc.output_dir)
    first = next(e for e in evs if e.kind == "failed")
    assert (first.node, first.error_code) == ("m", "bad_reference")
    assert next(e for e in evs if e.kind == "repaired").patch["inputs"] == {"img": "@node.a.image"}
    assert outcome.measurements["m.all.mean"] == pytest.approx(float(np.mean(case_data(case))) + 1)


def test_sigkilled_worker_is_retried_with_same_deliverables(ray_local, tmp_path, reflector):
    case = make_case(tmp_path / "in")
    plan = sketch({"id": "a", "tool": "xtoy.step", "args": {"img": "@seq.T1"}},
                  {"id": "k", "tool": "xtoy.suicide", "args": {"img": "@node.a.image",
                                                                "scratch_dir": "@runtime.output_dir"}},
                  {"id": "m", "tool": "xtoy.measure", "args": {"img": "@node.k.image"}})
    (tmp_path / "c/out/c1").mkdir(parents=True)
    (tmp_path / "c/out/c1/killed_once").write_text("pre-made: no kill in the clean run")
    killed = run(tmp_path / "k", case, plan, reflector)
    clean = run(tmp_path / "c", case, plan, reflector)
    assert killed.status == clean.status == "succeeded", (killed.error, clean.error)
    assert (tmp_path / "k/out/c1/killed_once").read_text().isdigit()  # the first attempt really died
    pk = json.loads((tmp_path / "k/out/c1/provenance.json").read_text())["deliverables"]
    pc = json.loads((tmp_path / "c/out/c1/provenance.json").read_text())["deliverables"]
    assert pk["m"]["artifact_digest"] == pc["m"]["artifact_digest"]
    assert pk["m"]["files"] == pc["m"]["files"]  # file sha256 identical
    kevs = events(tmp_path / "k/out/c1")
    assert sum(e.kind == "succeeded" and e.node == "k" for e in kevs) == 1
    assert not any(e.kind == "repaired" for e in kevs)  # Ray retried it, not the Reflector


def test_worker_lost_when_ray_gives_up_and_timeout(ray_local, tmp_path, reflector):
    case = make_case(tmp_path / "in")
    plan = sketch({"id": "a", "tool": "xtoy.step", "args": {"img": "@seq.T1"}},
                  {"id": "k", "tool": "xtoy.suicide", "args": {"img": "@node.a.image", "always": True,
                                                                "scratch_dir": "@runtime.output_dir"}})
    lost = run(tmp_path / "l", case, plan, reflector, task_max_retries=1)
    assert lost.status == "failed" and lost.error["code"] == "worker_lost" and lost.error["node"] == "k"
    assert lost.node_status == {"a": "succeeded", "k": "failed"}
    assert (tmp_path / "l/out/c1/a.nii.gz").exists() is False  # a is not a sink: nothing to keep
    slow = sketch({"id": "s", "tool": "xtoy.step", "args": {"img": "@seq.T1", "sleep_s": 5.0}})
    timed = run(tmp_path / "t", case, slow, reflector, node_timeout_s=1.0)
    assert timed.status == "failed" and timed.error["code"] == "timeout"
    # cancelled twice (one unchanged re-submission): without the limit the 5-s step would succeed
    retried = [e for e in events(tmp_path / "t/out/c1") if e.kind == "retried"]
    assert len(retried) == 1 and "timed out" in retried[0].message


def test_cpu_only_cluster_gpu_fallback_and_gpu_only_fails_fast(ray_local, tmp_path, reflector):
    assert ray_local.cluster_resources().get("GPU", 0) == 0
    case = make_case(tmp_path / "in")
    opt = run(tmp_path / "o", case, sketch({"id": "g", "tool": "xtoy.gpu_opt", "args": {"img": "@seq.T1"}}),
              reflector)
    assert opt.status == "succeeded", opt.error
    row = json.loads((tmp_path / "o/out/c1/g.json").read_text())["rows"][0]
    assert row["device"] == "cpu"
    assert not [e for e in events(tmp_path / "o/out/c1") if e.kind == "fallback"]  # ordinary CPU run, no fallback
    only = run(tmp_path / "r", case, sketch({"id": "a", "tool": "xtoy.step", "args": {"img": "@seq.T1"}},
                                            {"id": "g", "tool": "xtoy.gpu_only", "args": {"img": "@node.a.image"}}),
               reflector)
    assert only.status == "failed" and only.error["code"] == "resource" and only.error["node"] == "g"
    evs = events(tmp_path / "r/out/c1")
    assert not any(e.kind == "started" and e.node == "g" for e in evs)  # never submitted
    assert not (tmp_path / "r/out/c1/_DONE").exists()


@pytest.mark.parametrize("hostile", ["../../etc/passwd", "/etc/passwd", "file:///etc/shadow", "~/x",
                                     "@seq.T1", "a\x00b", "esc/passwd"])
def test_hostile_path_params_rejected_with_sandbox(ray_local, tmp_path, reflector, hostile):
    case = make_case(tmp_path / "in")
    (tmp_path / "out" / case.id).mkdir(parents=True)
    (tmp_path / "out" / case.id / "esc").symlink_to("/etc")  # a symlink escaping the output folder
    plan = sketch({"id": "w", "tool": "xtoy.writer", "args": {"img": "@seq.T1", "out_path": "ok.txt"}})
    wf = compile_plan(plan, case)
    wf.node("w").params["out_path"] = hostile  # as if a patch or plan slipped it past the compiler
    rc = RunContext(run_id="hostile", output_dir=tmp_path / "out" / case.id)
    outcome = run_case_workflow(wf, case, rc, reflector=reflector)
    assert outcome.status in ("failed", "halted")
    assert outcome.error["code"] in ("sandbox", "bad_reference") if hostile.startswith("@") else \
        outcome.error["code"] == "sandbox"
    assert not any(e.kind == "started" for e in events(rc.output_dir))


def brain_contract(size: int = 8) -> TaskContract:
    return TaskContract(
        id="toy", domain="unknown", goal="step, measure, grade", inputs=["T1"],
        milestones=["stepped", "measured", "graded"],
        deliverables=[
            DeliverableSpec(name="stepped_image", kind="image", milestone="stepped", file="stepped.nii.gz",
                            validators=[Validator(type="exists"), Validator(type="nifti_nonempty"),
                                        Validator(type="affine_matches_input", arg="T1")]),
            DeliverableSpec(name="volumes", kind="table", milestone="measured", file="volumes.json",
                            validators=[Validator(type="table_rows", arg=1), Validator(type="json_field", arg="rows")]),
            DeliverableSpec(name="grade", kind="classification", milestone="graded", file="grade.json",
                            validators=[Validator(type="json_field", arg="label")]),
        ])


def test_deliverables_provenance_trace_and_done(ray_local, tmp_path, reflector):
    case = make_case(tmp_path / "in", value=20.0)
    plan = sketch({"id": "s", "tool": "xtoy.step", "args": {"img": "@seq.T1", "add": 2}},
                  {"id": "m", "tool": "xtoy.measure", "args": {"img": "@node.s.image"}},
                  {"id": "g", "tool": "xtoy.grade", "args": {"table": "@node.m.table"}})
    outcome = run(tmp_path, case, plan, reflector, contract=brain_contract())
    out = tmp_path / "out" / "c1"
    assert outcome.status == "succeeded", outcome.error
    assert (outcome.sr, outcome.tcr) == (1, 1.0)
    assert sorted(outcome.deliverables) == ["grade", "stepped_image", "volumes"]
    assert {p.name for p in out.iterdir()} >= {"stepped.nii.gz", "volumes.json", "volumes.csv", "grade.json",
                                                "workflow.json", "provenance.json", "events.jsonl", "_DONE"}
    assert outcome.measurements["grade.label"] == "high"
    assert outcome.measurements["volumes.all.mean"] == pytest.approx(float(np.mean(case_data(case))) + 2)
    prov = json.loads((out / "provenance.json").read_text())["deliverables"]
    from bcer.engine.digest import file_digest

    assert prov["grade"]["inputs"]["T1"]["sha256"] == file_digest(case.sequences["T1"].path)
    assert [c["node"] for c in prov["grade"]["chain"]] == ["s", "m", "g"]
    assert prov["grade"]["chain"][0]["params"]["add"] == 2 and prov["grade"]["chain"][0]["tool"] == "xtoy.step"
    assert prov["stepped_image"]["files"]["stepped.nii.gz"] == file_digest(out / "stepped.nii.gz")
    evs = read_case_trace(out)
    assert evs[0].kind == "case_started" and evs[-1].kind == "case_finished"
    assert sum(e.kind == "validated" for e in evs) == 3
    assert (out / "_DONE").stat().st_mtime >= (out / "provenance.json").stat().st_mtime
    table = events_table([out / "events.jsonl"])
    assert table.num_rows == len(evs) and set(table.column("kind").to_pylist()) >= {"started", "succeeded"}


def test_failed_validation_scores_and_no_done(ray_local, tmp_path, reflector):
    case = make_case(tmp_path / "in", value=20.0)
    contract = brain_contract()
    contract.deliverables[2].validators = [Validator(type="json_field", arg="no_such_field")]
    plan = sketch({"id": "s", "tool": "xtoy.step", "args": {"img": "@seq.T1"}},
                  {"id": "m", "tool": "xtoy.measure", "args": {"img": "@node.s.image"}},
                  {"id": "g", "tool": "xtoy.grade", "args": {"table": "@node.m.table"}})
    outcome = run(tmp_path, case, plan, reflector, contract=contract)
    assert outcome.status == "failed" and outcome.error["code"] == "schema"
    assert outcome.sr == 0 and outcome.tcr == pytest.approx(5 / 6)
    assert "no_such_field" in outcome.error["message"]
    assert not (tmp_path / "out" / "c1" / "_DONE").exists()


def test_corrupt_input_fails_with_schema_naming_the_file(ray_local, tmp_path, reflector):
    case = make_case(tmp_path / "in")
    path = Path(case.sequences["T1"].path)
    blob = path.read_bytes()
    path.write_bytes(blob[: len(blob) // 2])  # truncated .nii.gz
    with pytest.raises((EOFError, OSError)):
        gzip.decompress(path.read_bytes())
    plan = sketch({"id": "a", "tool": "xtoy.step", "args": {"img": "@seq.T1"}},
                  {"id": "m", "tool": "xtoy.measure", "args": {"img": "@node.a.image"}})
    outcome = run(tmp_path, case, plan, reflector)
    assert outcome.status == "failed"
    assert outcome.error["code"] == "schema" and path.name in outcome.error["message"]
    assert outcome.error["file"] == str(path)
    assert outcome.node_status == {"a": "failed", "m": "blocked"}
    assert not (tmp_path / "out" / "c1" / "_DONE").exists()


class _InsertPadTier:
    """A toy repair tier: on a ``shape`` error of xtoy.needs_even, insert xtoy.pad_even before it."""

    tier = 2

    def propose(self, failure, workflow, case):
        from bcer.agents.repair.reflector import Patch
        from bcer.contracts import Node

        if failure.node.tool != "xtoy.needs_even" or failure.code.value != "shape":
            return None
        new = Node(id=f"{failure.node.id}_pad", tool="xtoy.pad_even", inputs={"img": failure.node.inputs["img"]})
        return Patch(node_id=failure.node.id, action="insert", insert=new, tier=2, reason="pad to even",
                     inputs={"img": f"@node.{new.id}.image"}, params=dict(failure.node.params))


class _SkipTier:
    tier = 2

    def propose(self, failure, workflow, case):
        from bcer.agents.repair.reflector import Patch

        return Patch(node_id=failure.node.id, action="skip", tier=2, reason="optional side measurement",
                     inputs=dict(failure.node.inputs), params=dict(failure.node.params))


def _odd_case(root: Path, case_id: str = "odd") -> Case:
    root.mkdir(parents=True, exist_ok=True)
    path = write_nifti(Image(np.ones((7, 8, 4), np.float32), AFFINE), root / f"{case_id}_t1.nii.gz")
    return Case(id=case_id, root=str(root), sequences={"T1": SequenceRef(path=str(path))})


def test_insert_patch_adds_a_node_and_only_the_failed_node_reruns(ray_local, tmp_path, reflector):
    from bcer.agents.repair.reflector import Reflector, Tier1

    case = _odd_case(tmp_path / "in")
    plan = sketch({"id": "a", "tool": "xtoy.step", "args": {"img": "@seq.T1", "add": 1}},
                  {"id": "even", "tool": "xtoy.needs_even", "args": {"img": "@node.a.image"}},
                  {"id": "m", "tool": "xtoy.measure", "args": {"img": "@node.even.image"}})
    outcome = run(tmp_path, case, plan, Reflector([Tier1(), _InsertPadTier()]))
    assert outcome.status == "succeeded", outcome.error
    evs = events(tmp_path / "out" / case.id)
    ok = [e.node for e in evs if e.kind == "succeeded"]
    assert ok.count("a") == 1 and ok.count("even_pad") == 1 and ok.count("even") == 1 and ok.count("m") == 1
    assert [e.node for e in evs if e.kind == "planned" and e.node == "even_pad"]
    wf = json.loads((tmp_path / "out" / case.id / "workflow.json").read_text())
    ids = [n["id"] for n in wf["nodes"]]
    assert ids.index("even_pad") < ids.index("even")  # topological order kept
    assert ["a", "even_pad"] in wf["edges"] and ["even_pad", "even"] in wf["edges"]
    assert ["a", "even"] not in wf["edges"]  # the failed node's old binding is gone
    got = json.loads((tmp_path / "out" / case.id / "m.json").read_text())
    assert got["rows"][0]["n"] == 8 * 8 * 4 and got["rows"][0]["mean"] == pytest.approx(6.0)  # (1+1)*3


def test_reflector_rejects_insert_that_binds_downstream_or_is_unused(ray_local, tmp_path):
    from bcer.agents.repair.reflector import Failure, Halt, Patch, Reflector
    from bcer.contracts import Node

    case = _odd_case(tmp_path / "in")
    plan = sketch({"id": "a", "tool": "xtoy.step", "args": {"img": "@seq.T1"}},
                  {"id": "even", "tool": "xtoy.needs_even", "args": {"img": "@node.a.image"}},
                  {"id": "m", "tool": "xtoy.measure", "args": {"img": "@node.even.image"}})
    wf = compile_plan(plan, case)
    node = wf.node("even")
    failure = Failure(case_id=case.id, node=node, error={"code": "shape", "message": "odd"},
                      available={"@seq.T1": "image", "@node.a.image": "image"})

    class Tier:
        def __init__(self, patch):
            self.patch = patch

        def propose(self, *a):
            return self.patch

    cyclic = Patch(node_id="even", action="insert", tier=2, reason="x", params={},
                   insert=Node(id="p", tool="xtoy.pad_even", inputs={"img": "@node.even.image"}),
                   inputs={"img": "@node.p.image"})
    unused = Patch(node_id="even", action="insert", tier=2, reason="x", params={},
                   insert=Node(id="p", tool="xtoy.pad_even", inputs={"img": "@node.a.image"}),
                   inputs={"img": "@node.a.image"})
    dup = Patch(node_id="even", action="insert", tier=2, reason="x", params={},
                insert=Node(id="m", tool="xtoy.pad_even", inputs={"img": "@node.a.image"}),
                inputs={"img": "@node.m.image"})
    for bad in (cyclic, unused, dup):
        assert isinstance(Reflector([Tier(bad)]).repair(failure, wf, case), Halt)
    skip_required = Patch(node_id="even", action="skip", tier=2, reason="x", inputs=dict(node.inputs), params={})
    assert isinstance(Reflector([Tier(skip_required)]).repair(failure, wf, case), Halt)


def test_skip_patch_for_an_optional_node_keeps_the_case(ray_local, tmp_path, reflector):
    from bcer.agents.repair.reflector import Reflector, Tier1

    case = make_case(tmp_path / "in", "sk")
    contract = TaskContract(id="toy_skip", domain="any", goal="measure", milestones=["measured"],
                            deliverables=[DeliverableSpec(name="table", kind="table", milestone="measured",
                                                          file="table.json")])
    plan = sketch({"id": "m", "tool": "xtoy.measure", "args": {"img": "@seq.T1"}},
                  {"id": "extra", "tool": "xtoy.flaky_extra", "args": {"img": "@seq.T1"}})
    outcome = run(tmp_path, case, plan, Reflector([Tier1(), _SkipTier()]), contract=contract)
    assert outcome.status == "succeeded", outcome.error
    assert outcome.node_status["extra"] == "skipped" and outcome.sr == 1
    evs = events(tmp_path / "out" / case.id)
    assert [e.kind for e in evs if e.node == "extra"][-1] == "skipped"
