"""The public surface: `from bcer import ...` is enough to write a tool and run a plan with it.
The examples of docs/extending.md (own tool, own task YAML, own tool inside a built-in task)
are executed exactly as written (so they cannot drift from the code)."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import bcer

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(300)


def doc_block(name: str) -> str:
    text = (ROOT / "docs" / "extending.md").read_text()
    m = re.search(rf"<!-- example: {re.escape(name)}[^>]*-->\s*```(?:python|yaml)\n(.*?)```", text, re.S)
    assert m, f"docs/extending.md has no example block {name!r}"
    return m.group(1)


def test_public_names_resolve():
    for name in bcer.__all__:
        assert getattr(bcer, name) is not None, name
    with pytest.raises(AttributeError):
        bcer.no_such_name  # noqa: B018


def test_sitk_roundtrip_keeps_geometry():
    aff = np.array([[0.0, -1.2, 0.0, 10.0], [1.1, 0.0, 0.0, -5.0], [0.0, 0.0, 3.0, 2.0], [0, 0, 0, 1.0]])
    img = bcer.Image(np.random.default_rng(0).random((6, 7, 5)).astype(np.float32), aff, {"note": "x"})
    back = bcer.from_sitk(bcer.to_sitk(img), like=img)
    np.testing.assert_allclose(back.affine, aff, atol=1e-9)
    np.testing.assert_array_equal(back.data, img.data)
    assert back.meta["note"] == "x"
    nib_back = bcer.from_nibabel(bcer.to_nibabel(img))
    np.testing.assert_allclose(nib_back.affine, aff)
    with pytest.raises(bcer.ToolError) as e:
        bcer.to_sitk(bcer.Image(np.zeros((2, 2, 2, 3)), np.eye(4)))
    assert e.value.code.value == "shape"


@pytest.fixture
def docs_env(tmp_path, monkeypatch):
    """tmp_path holds my_tools.py and my_task.yaml from the page and is the working folder."""
    from bcer.datasets.synth import synth_cohort

    (tmp_path / "my_tools.py").write_text(doc_block("my_tools.py"))
    (tmp_path / "my_task.yaml").write_text(doc_block("my_task.yaml"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    data, out = tmp_path / "data", tmp_path / "out"
    synth_cohort("brain", 1, data, layout="brats", seed=8, size="small")  # one case: the suite's time
    return {"DATA": str(data), "OUT": str(out)}


def test_docs_user_tool_runs_in_a_study(ray_local, docs_env):
    namespace = dict(docs_env)
    exec(compile(doc_block("run"), "extending:run", "exec"), namespace)
    rows = namespace["result"].rows
    assert [r["status"] for r in rows] == ["succeeded"], rows
    # the user tool's mask is the head: tens to hundreds of mL on the small brain phantom, never the FOV
    for r in rows:
        vol = r["measurements"]["stats.foreground.volume_ml"]
        assert 50 < vol < 3000, vol
    with pytest.raises(bcer.ToolError) as e:
        bcer.call_tool("user.otsu_mask", {"image": bcer.Image(np.zeros((8, 8, 8), np.float32), np.eye(4))})
    assert e.value.code.value == "value_range"


def test_docs_own_task_yaml_is_planned_and_delivered(ray_local, docs_env):
    import json

    namespace = dict(docs_env)
    exec(compile(doc_block("own_task"), "extending:own_task", "exec"), namespace)
    rows = namespace["result"].rows
    assert [r["status"] for r in rows] == ["succeeded"], rows
    assert namespace["contract"].id == "foreground_volume"
    case = Path(docs_env["OUT"]) / "my_task" / rows[0]["case"]
    wf = json.loads((case / "provenance.json").read_text())["dag"]  # the DAG that ran
    assert {n["tool"] for n in wf["nodes"]} == {"user.otsu_mask", "quant.roi_stats"}  # the offline planner's chain
    stats = json.loads((case / "stats.json").read_text())
    vol = next(v for k, v in rows[0]["measurements"].items() if k.endswith("volume_ml"))
    assert 50 < vol < 3000 and stats, vol  # the head of the small phantom, never the whole FOV


def test_docs_user_tool_inside_a_built_in_task(ray_local, docs_env):
    import json

    import nibabel as nib

    namespace = dict(docs_env)
    exec(compile(doc_block("inside"), "extending:inside", "exec"), namespace)
    rows = namespace["result"].rows
    assert [r["status"] for r in rows] == ["succeeded"], rows  # segment_brain's own checks passed
    case = Path(docs_env["OUT"]) / "inside" / rows[0]["case"]
    prov = json.loads((case / "provenance.json").read_text())
    seg = next(r for d in prov["deliverables"].values() for r in d["chain"] if r["tool"] == "seg.brain_tumor")
    assert seg["inputs"]["flair"] == "@node.clip.image"
    truth = json.loads(next((Path(docs_env["DATA"]) / rows[0]["case"]).glob("bcer_truth.json")).read_text())
    labels = np.asarray(nib.load(str(case / "seg.nii.gz")).dataobj)
    assert labels.any() and truth  # delivered; quality of the clipped input is the bench's job
