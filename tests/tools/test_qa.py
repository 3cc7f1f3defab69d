"""qa.overlay: the PNG is written, each label's fixed colour is in its pixels, boxes land on the lesion."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image as PILImage

from bcer.contracts.artifacts import Finding, Findings, Image, Mask, Report
from bcer.contracts.errors import ErrorCode, ToolError
from bcer.contracts.geometry import vox2world
from bcer.datasets.brain import make_brain
from bcer.tools.qa import BOX_COLOUR, label_colour
from bcer.tools.registry import call_tool


@pytest.fixture(scope="module")
def brain():
    ph = make_brain("qa01", seed=2, size="small", grade="HGG")
    return ph.sequences["T1c"], ph.labels["seg"]


def _pixels(path: str) -> np.ndarray:
    return np.asarray(PILImage.open(path).convert("RGB"))


def _count(px: np.ndarray, rgb: tuple[int, int, int], tol: int = 2) -> int:
    return int(np.count_nonzero(np.all(np.abs(px.astype(int) - np.asarray(rgb)) <= tol, axis=-1)))


def test_overlay_label_colours_in_pixels(tmp_path: Path, brain) -> None:
    t1c, seg = brain
    out = call_tool("qa.overlay", {"image": t1c, "mask": seg},
                    {"path": str(tmp_path / "qa" / "seg.png"), "n_slices": 4, "title": "qa01"})["report"]
    assert isinstance(out, Report)
    png = out.meta["path"]
    assert Path(png).is_file() and Path(png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    px = _pixels(png)
    present = sorted(int(v) for v in np.unique(seg.data) if v)
    assert present == [1, 2, 4]
    assert sorted(int(k) for k in out.structured["labels"]) == present
    for v in present:
        # Legend patch plus outline: the exact colour is drawn (well beyond a stray pixel).
        assert _count(px, label_colour(v)) >= 30, v
    assert _count(px, label_colour(3)) == 0  # a label that is absent is not drawn
    # Slices are chosen within the tumour's axial extent.
    assert len(out.structured["slices"]) == 4


def test_overlay_draws_finding_box(tmp_path: Path, brain) -> None:
    t1c, seg = brain
    ijk = np.argwhere(seg.data == 4)
    lo, hi = ijk.min(axis=0), ijk.max(axis=0) + 1
    world = vox2world(t1c.affine, np.array([lo, hi - 1]))
    f = Finding(id="L1", label="enhancing", box_voxel=(tuple(map(int, lo)), tuple(map(int, hi))),
                box_world=(tuple(world.min(axis=0)), tuple(world.max(axis=0))))
    no_box = call_tool("qa.overlay", {"image": t1c}, {"path": str(tmp_path / "plain.png"), "n_slices": 4})["report"]
    boxed = call_tool("qa.overlay", {"image": t1c, "findings": Findings([f], t1c.affine)},
                      {"path": str(tmp_path / "box.png"), "n_slices": 4})["report"]
    assert len(boxed.structured["boxes"]) == 1
    b = boxed.structured["boxes"][0]
    # The box spans as many voxels as the lesion, whatever the reorientation did to the axes.
    assert sorted(np.round(np.subtract(b["max"], b["min"])).astype(int).tolist()) == sorted((hi - lo).tolist())
    # Antialiased cyan outline: near-cyan pixels cannot come from a grey image on a white page.
    assert _count(_pixels(boxed.meta["path"]), BOX_COLOUR, tol=80) >= 50
    assert _count(_pixels(no_box.meta["path"]), BOX_COLOUR, tol=80) == 0


def test_radiological_display_puts_patient_right_on_the_left(tmp_path: Path) -> None:
    from bcer.datasets.geometry import make_affine, random_direction, world_coords

    # An oblique, flipped grid; a labelled blob at patient right (RAS x > 0).
    affine = make_affine(random_direction(np.random.default_rng(5), 20.0), (2.0, 2.0, 3.0), (40, 40, 12))
    p = world_coords(affine, (40, 40, 12))
    blob = np.linalg.norm(p - np.array([18.0, 0.0, 0.0]), axis=-1) < 10.0
    img = Image(np.where(np.linalg.norm(p, axis=-1) < 35, 100.0, 0.0).astype(np.float32), affine)
    mask = Mask(blob.astype(np.int16), affine, labels={1: "lesion"})
    rep = call_tool("qa.overlay", {"image": img, "mask": mask},
                    {"path": str(tmp_path / "side.png"), "n_slices": 1, "alpha": 1.0})["report"]
    px = _pixels(rep.meta["path"])
    cols = np.nonzero(np.all(px == np.asarray(label_colour(1)), axis=-1))[1]
    assert cols.size > 100
    assert np.median(cols) < px.shape[1] / 2  # right hemisphere drawn on the image's left


def test_errors(tmp_path: Path, brain) -> None:
    t1c, seg = brain
    off = Mask(np.zeros((4, 4, 4), np.int16), np.eye(4))
    cases = [
        ({"image": Image(np.zeros((5, 5), np.float32), np.eye(4))}, {"path": str(tmp_path / "a.png")}, ErrorCode.shape),
        ({"image": Image(np.full((4, 4, 4), np.nan, np.float32), np.eye(4))}, {"path": str(tmp_path / "a.png")},
         ErrorCode.numeric),
        ({"image": t1c, "mask": off}, {"path": str(tmp_path / "a.png")}, ErrorCode.shape),
        ({"image": seg}, {"path": str(tmp_path / "a.png")}, ErrorCode.schema),
        ({"image": t1c}, {"path": str(tmp_path / "a.jpg")}, ErrorCode.value_range),
        ({"image": t1c}, {"path": str(tmp_path / "a.png"), "n_slices": 0}, ErrorCode.value_range),
        ({"image": t1c}, {}, ErrorCode.schema),
    ]
    for inputs, params, code in cases:
        with pytest.raises(ToolError) as e:
            call_tool("qa.overlay", inputs, params)
        assert e.value.code == code, (params, e.value)
    assert not list(tmp_path.glob("a.*"))
