"""The public surface: `from bcer import ...` is enough to write a tool and run a plan with it.
The README's example is executed exactly as written (so it cannot drift from the code)."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import bcer

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(300)


def readme_block(name: str) -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(rf"<!-- example: {re.escape(name)}[^>]*-->\s*```python\n(.*?)```", text, re.S)
    assert m, f"README has no example block {name!r}"
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


def test_readme_user_tool_runs_in_a_study(ray_local, tmp_path, monkeypatch):
    from bcer.datasets.synth import synth_cohort

    (tmp_path / "my_tools.py").write_text(readme_block("my_tools.py"))
    monkeypatch.syspath_prepend(str(tmp_path))
    data, out = tmp_path / "data", tmp_path / "out"
    synth_cohort("brain", 2, data, layout="brats", seed=8, size="small")
    namespace = {"DATA": str(data), "OUT": str(out)}
    exec(compile(readme_block("run"), "README:run", "exec"), namespace)
    rows = namespace["result"].rows
    assert [r["status"] for r in rows] == ["succeeded", "succeeded"], rows
    # the user tool's mask is the head: tens to hundreds of mL on the small brain phantom, never the FOV
    for r in rows:
        vol = r["measurements"]["stats.foreground.volume_ml"]
        assert 50 < vol < 3000, vol
    with pytest.raises(bcer.ToolError) as e:
        bcer.call_tool("user.otsu_mask", {"image": bcer.Image(np.zeros((8, 8, 8), np.float32), np.eye(4))})
    assert e.value.code.value == "value_range"
