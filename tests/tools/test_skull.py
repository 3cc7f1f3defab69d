"""``bcer.tools.skull.strip_skull``: the brain inside the dark bone shell of a head that was not
skull-stripped, checked against the head's own labels (ground truth by construction)."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage as ndi

from bcer.tools.skull import strip_skull

SHAPE = (56, 60, 48)
# tissue -> (T1, T1c, T2, FLAIR): bone is dark on all four, CSF bright on T2 only, scalp bright
LEVELS = {"scalp": (0.8, 1.1, 0.5, 0.6), "bone": (0.1, 0.1, 0.08, 0.08), "csf": (0.12, 0.12, 0.95, 0.1),
          "brain": (0.7, 0.7, 0.4, 0.45)}


def _head(bone_mm: float = 6.0, gap: bool = False) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Nested ellipsoids on a 2 mm grid: scalp, bone, CSF, brain; partial volume by smoothing."""
    g = np.indices(SHAPE).astype(float)
    c, semi = np.array([28, 30, 24], float), np.array([25, 28, 22], float)
    r = np.sqrt(sum(((g[i] - c[i]) / semi[i]) ** 2 for i in range(3)))  # 1 at the scalp's surface
    t = bone_mm / 2 / semi.min()
    parts = {"brain": r <= 0.82 - t, "csf": (r > 0.82 - t) & (r <= 0.88 - t),
             "bone": (r > 0.88 - t) & (r <= 0.88), "scalp": (r > 0.88) & (r <= 1.0)}
    if gap:  # an opening in the bone (a foramen): scalp-intensity tissue joins the CSF through it
        hole = parts["bone"] & (np.abs(g[0] - c[0]) < 3) & (np.abs(g[1] - c[1]) < 3) & (g[2] < c[2])
        parts["bone"] &= ~hole
        parts["scalp"] |= hole
    rng = np.random.default_rng(0)
    stack = np.zeros((4, *SHAPE))
    for k in range(4):
        img = sum(LEVELS[name][k] * m for name, m in parts.items())
        stack[k] = ndi.gaussian_filter(img, 0.7) * 1000 + rng.normal(0, 10, SHAPE)
    return stack, parts


def _dice(a: np.ndarray, b: np.ndarray) -> float:
    return 2 * float((a & b).sum()) / float(a.sum() + b.sum())


def test_the_brain_and_its_csf_are_kept_and_the_scalp_dropped() -> None:
    stack, parts = _head()
    head = ndi.binary_fill_holes(stack.mean(0) > 0.3 * np.percentile(stack.mean(0), 99))
    s = strip_skull(stack, head)
    inside = parts["brain"] | parts["csf"]
    assert s.stripped and s.reason == "brain inside the dark (bone) shell" and not s.scalp_left_in
    assert (s.brain & inside).sum() == inside.sum()  # all of the brain and its CSF
    assert (s.brain & parts["scalp"]).sum() == 0
    # beyond them, only the bone's inner partial-volume rim (one voxel)
    assert not (s.brain & ~ndi.binary_dilation(inside, ndi.generate_binary_structure(3, 1))).any()
    assert s.brain_fraction == pytest.approx(s.brain.sum() / head.sum())


def test_t1_alone_gives_the_brain_without_its_csf() -> None:
    stack, parts = _head()
    head = ndi.binary_fill_holes(stack[0] > 0.1 * np.percentile(stack[0], 99))
    s = strip_skull(stack[0], head)  # CSF is as dark as bone on T1: the region stops at the cortex
    assert s.stripped and _dice(s.brain, parts["brain"]) > 0.9
    assert (s.brain & parts["scalp"]).sum() == 0


def test_a_skull_stripped_input_is_returned_unchanged() -> None:
    stack, parts = _head()
    brain = parts["brain"] | parts["csf"]
    stripped = np.where(brain, stack, 0.0)
    s = strip_skull(stripped, brain)
    assert not s.stripped and "already skull-stripped" in s.reason and not s.scalp_left_in
    assert np.array_equal(s.brain, brain)


def test_an_open_shell_joins_the_scalp_and_the_rule_keeps_the_head() -> None:
    """The documented limitation: where the bone is open, scalp joins the brain. The region
    then reaches the head's surface, and the head mask is kept instead of a wrong brain."""
    stack, parts = _head(gap=True)
    head = ndi.binary_fill_holes(stack.mean(0) > 0.3 * np.percentile(stack.mean(0), 99))
    s = strip_skull(stack, head)
    assert not s.stripped and "reaches the head's surface" in s.reason and s.scalp_left_in
    assert np.array_equal(s.brain, head)
    surface = head & ~ndi.binary_erosion(head, ndi.generate_binary_structure(3, 1))
    joined = (parts["brain"] | parts["csf"] | parts["scalp"]) & surface
    assert joined.sum() > 0.5 * surface.sum()  # the joined scalp is most of the surface: far above the 10 % cut


def test_a_region_too_small_to_be_a_brain_falls_back_to_the_head(monkeypatch) -> None:
    """The guard against a wrong small region: with the floor above what this head's brain
    holds (45 % of the head), the same input keeps the head mask."""
    from bcer.tools import skull

    stack, _ = _head()
    head = ndi.binary_fill_holes(stack.mean(0) > 0.3 * np.percentile(stack.mean(0), 99))
    assert strip_skull(stack, head).stripped
    monkeypatch.setattr(skull, "MIN_BRAIN_FRACTION", 0.6)
    s = strip_skull(stack, head)
    assert not s.stripped and s.brain_fraction < 0.6 and np.array_equal(s.brain, head) and "60 %" in s.reason
    assert s.scalp_left_in


def test_an_empty_head_is_reported() -> None:
    s = strip_skull(np.zeros((2, 8, 8, 8)), np.zeros((8, 8, 8), bool))
    assert not s.stripped and s.reason == "empty head mask"


def test_seg_brain_tumor_flags_a_head_whose_scalp_it_could_not_remove() -> None:
    """An open shell leaves the scalp in the 'brain': the label map says so in a flag that the
    report header and the case page show; a closed shell raises no such flag."""
    from bcer.contracts.artifacts import Image
    from bcer.tools.registry import call_tool

    aff = np.diag([2.0, 2.0, 2.0, 1.0])
    for gap, flagged in ((True, True), (False, False)):
        stack, _ = _head(gap=gap)
        ports = {p: Image(stack[k].astype(np.float32), aff, {}) for k, p in enumerate(("t1", "t1c", "t2", "flair"))}
        meta = call_tool("seg.brain_tumor", ports)["labels"].meta
        assert meta["scalp_left_in"] is flagged
        flag = (meta.get("flags") or {}).get("skull_not_removed")
        assert (flag is not None and flag["flagged"] and "skull-strip the input" in flag["detail"]) is flagged
