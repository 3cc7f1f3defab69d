"""Deliverable writers, contract validators, SR/TCR, trace files and node placement (no Ray)."""
from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from bcer.contracts import (Case, Classification, DeliverableSpec, ErrorCode, Image, Mask, Node, Report,
                            Resources, SequenceRef, Table, TaskContract, ToolError, Transform, Validator)
from bcer.engine.binder import place, resolve_params, sequence_key
from bcer.engine.digest import artifact_digest, file_digest
from bcer.engine.outputs import measurements_of, write_artifact
from bcer.engine.trace import TraceWriter, call_hooks, events_table, read_events
from bcer.engine.validate import score, validate_deliverable, validate_deliverables
from bcer.io import artifact_from_dict, write_nifti

AFF = np.array([[0, -1.5, 0, 10], [2.0, 0, 0, -5], [0, 0, 3.0, 1], [0, 0, 0, 1]])


def _case(tmp: Path) -> Case:
    img = Image(np.random.default_rng(0).random((6, 5, 4)).astype(np.float32), AFF)
    p = write_nifti(img, tmp / "t1.nii.gz")
    return Case(id="c", root=str(tmp), sequences={"t1ce": SequenceRef(path=str(p))}, metadata={"weight": 70})


def test_writers_round_trip_every_kind(tmp_path):
    mask = Mask(np.eye(4, dtype=np.int16)[:, :, None].repeat(3, 2), AFF, labels={1: "x"})
    files = write_artifact(mask, tmp_path / "seg.nii.gz")
    back = nib.load(str(files[0]))
    np.testing.assert_array_equal(np.asarray(back.dataobj), mask.data)
    np.testing.assert_allclose(back.affine, AFF)
    t = Table([{"label": "LV", "ml": 120.5}, {"label": "RV", "ml": 99.0}], {"ml": "mL"})
    js, csv = write_artifact(t, tmp_path / "vol.json")
    assert (js.name, csv.name) == ("vol.json", "vol.csv")
    assert artifact_from_dict(json.loads(js.read_text())).rows == t.rows
    assert csv.read_text().splitlines() == ["label,ml", "LV,120.5", "RV,99.0"]
    md, rj = write_artifact(Report("# Findings\nLV dilated.", {"ef": 35.0}), tmp_path / "report.md")
    assert md.read_text().startswith("# Findings") and json.loads(rj.read_text())["structured"]["ef"] == 35.0
    (c,) = write_artifact(Classification("HGG", [{"rule": "enhancing > 0"}]), tmp_path / "grade.json")
    assert json.loads(c.read_text())["label"] == "HGG"
    (tr,) = write_artifact(Transform(np.diag([1.0, 1, 1, 1])), tmp_path / "xfm.json")
    np.testing.assert_allclose(json.loads(tr.read_text())["matrix"], np.eye(4))
    assert not list(tmp_path.glob(".*tmp*"))  # atomic writes leave no temp files


def test_digests_follow_content_not_identity():
    a = Image(np.ones((2, 2, 2), np.float32), AFF)
    b = Image(np.ones((2, 2, 2), np.float32), AFF.copy(), {"other": "meta"})
    assert artifact_digest(a) == artifact_digest(b)
    assert artifact_digest(a) != artifact_digest(Image(np.ones((2, 2, 2), np.float32), np.eye(4)))
    assert artifact_digest(Table([{"a": 1}], meta={"t": 1})) == artifact_digest(Table([{"a": 1}], meta={"t": 2}))


def test_measurements_for_cohort_row():
    one = measurements_of("ef", Table([{"ef": 55.2, "units_note": "x"}]))
    assert one == {"ef.ef": 55.2, "ef.units_note": "x"}
    many = measurements_of("vol", Table([{"label": "LV", "ml": 1.5}, {"label": "RV", "ml": 2.5}]))
    assert many == {"vol.LV.ml": 1.5, "vol.RV.ml": 2.5}
    assert measurements_of("g", Classification("DCM", scores={"DCM": 0.9})) == {"g.label": "DCM", "g.score.DCM": 0.9}


def test_validators_pass_and_fail_with_reasons(tmp_path):
    case = _case(tmp_path / "in")
    out = tmp_path / "out"
    write_nifti(Mask(np.pad(np.ones((2, 2, 2), np.int16), 1)[:6, :5, :4], AFF), out / "seg.nii.gz")
    write_nifti(Mask(np.zeros((6, 5, 4), np.int16), np.eye(4)), out / "empty.nii.gz")
    write_artifact(Table([{"ml": 3.0}]), out / "vol.json")
    write_artifact(Report("", {}), out / "rep.md")
    V = Validator
    spec = lambda f, *vs: DeliverableSpec(name=f, kind="mask", milestone="m", file=f, validators=list(vs))  # noqa: E731
    assert validate_deliverable(spec("seg.nii.gz", V(type="nifti_nonempty"),
                                     V(type="affine_matches_input", arg="T1c")), out, case)[0]
    ok, why = validate_deliverable(spec("empty.nii.gz", V(type="nifti_nonempty")), out, case)
    assert not ok and "no non-zero" in why
    ok, why = validate_deliverable(spec("empty.nii.gz", V(type="affine_matches_input", arg="t1ce")), out, case)
    assert not ok and "differs" in why
    assert validate_deliverable(spec("vol.json", V(type="table_rows", arg=1), V(type="json_field", arg="rows.0.ml")),
                                out, case)[0]
    ok, why = validate_deliverable(spec("vol.csv", V(type="table_rows", arg=2)), out, case)
    assert not ok and "1 rows" in why
    assert not validate_deliverable(spec("rep.md", V(type="report_nonempty")), out, case)[0]
    assert validate_deliverable(spec("missing.json", V(type="exists")), out, case) == (False, "missing.json not written")
    (out / "bad.nii.gz").write_bytes(b"\x1f\x8b garbage")
    ok, why = validate_deliverable(spec("bad.nii.gz", V(type="nifti_nonempty")), out, case)
    assert not ok and "could not read" in why  # a corrupt file is a failed check, not a crash


def test_score_sr_and_tcr(tmp_path):
    c = TaskContract(id="t", domain="x", goal="g", milestones=["a", "b"],
                     deliverables=[DeliverableSpec(name="d1", kind="table", milestone="a", file="d1.json"),
                                   DeliverableSpec(name="d2", kind="table", milestone="b", file="d2.json")])
    assert score(c, ["a", "b"], {"d1": (True, ""), "d2": (True, "")}) == (1, 1.0)
    assert score(c, ["a"], {"d1": (True, ""), "d2": (False, "x")}) == (0, 0.5)
    assert score(c, [], {}) == (0, 0.0)
    write_artifact(Table([{"x": 1}]), tmp_path / "d1.json")
    checks = validate_deliverables(c, tmp_path, _case(tmp_path / "in"))
    assert checks["d1"][0] and not checks["d2"][0]


def test_trace_lines_flushed_torn_line_skipped_and_table(tmp_path):
    seen = []

    class Hook:
        def on_event(self, *, event, **kw):
            seen.append(event.kind)

    tw = TraceWriter(tmp_path, "r1", "c1", hooks=[Hook()])
    tw.emit("case_started")
    tw.emit("failed", node="n", error_code="schema", message="bad", patch=None)
    assert len((tmp_path / "events.jsonl").read_text().splitlines()) == 2  # visible before close
    tw.emit("repaired", node="n", patch={"params": {"w": 2}})
    tw.close()
    with open(tmp_path / "events.jsonl", "a") as fh:
        fh.write('{"kind": "succ')  # a crash mid-line
    evs = read_events(tmp_path / "events.jsonl")
    assert [e.kind for e in evs] == seen == ["case_started", "failed", "repaired"]
    t = events_table([tmp_path / "events.jsonl"])
    assert t.num_rows == 3 and json.loads(t.column("patch")[2].as_py()) == {"params": {"w": 2}}
    call_hooks([object(), Hook()], "on_event", event=evs[0])  # hooks without the method are skipped
    assert seen[-1] == "case_started"


def _node(gpu: str, **res) -> Node:
    return Node(id="n", tool="t", gpu=gpu, resources=Resources(**res))


def test_placement_gpu_fallback_required_and_caps():
    cpu_only = {"CPU": 2.0, "memory": 1e9}
    p = place(_node("optional"), cpu_only)
    assert (p.num_gpus, p.device, p.fallback) == (0.0, "cpu", None)  # the ordinary run of a CPU cluster
    with pytest.raises(ToolError) as e:
        place(_node("required"), cpu_only)
    assert e.value.code == ErrorCode.resource
    gpu = {"CPU": 8.0, "GPU": 1.0, "memory": 1e10}
    assert (place(_node("optional"), gpu).device, place(_node("optional"), gpu).num_gpus) == ("cuda", 1.0)
    assert place(_node("optional", num_gpus=0.5), gpu).num_gpus == 0.5
    assert place(_node("optional"), gpu, device_override="cpu").fallback == "patched to CPU"
    assert place(_node("optional"), gpu, device_policy="cpu").device == "cpu"
    with pytest.raises(ToolError):
        place(_node("required"), gpu, device_policy="cpu")
    big = place(_node("none", num_cpus=16, memory_mb=4096), cpu_only)
    assert big.num_cpus == 2.0 and big.memory == int(1e9)  # capped: never pending forever


def test_resolve_params_tokens_and_errors(tmp_path):
    case = _case(tmp_path)
    rt = {"output_dir": "/o", "device": "cpu", "seed": 3, "run_id": "r"}
    got = resolve_params({"w": "@case.weight", "nested": {"s": ["@runtime.seed", 1]}, "lit": "x"}, case, rt)
    assert got == {"w": 70, "nested": {"s": [3, 1]}, "lit": "x"}
    for bad, code in [("@case.height", "bad_reference"), ("@runtime.nope", "bad_reference"),
                      ("@seq.T1c", "bad_reference"), ("@case", "bad_reference")]:
        with pytest.raises(ToolError) as e:
            resolve_params({"p": bad}, case, rt)
        assert e.value.code.value == code
    assert sequence_key(case, "T1c") == "t1ce" and sequence_key(case, "t1gd") == "t1ce"
    assert sequence_key(case, "FLAIR") is None
    assert file_digest(case.sequences["t1ce"].path) == file_digest(Path(case.sequences["t1ce"].path))


def test_ray_failures_map_to_error_codes():
    import ray.exceptions as rex

    from bcer.engine.executor import error_from_ray

    assert error_from_ray(rex.WorkerCrashedError())["code"] == "worker_lost"
    assert error_from_ray(rex.TaskCancelledError())["code"] == "timeout"
    assert error_from_ray(ValueError("boom"))["code"] == "internal"
    wrapped = rex.RayTaskError("f", "tb", ToolError("schema", "bad file", file="/x.nii.gz"))
    got = error_from_ray(wrapped)
    assert (got["code"], got["context"]["file"]) == ("schema", "/x.nii.gz")  # cause unwrapped, context kept
