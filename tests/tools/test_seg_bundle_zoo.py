"""Model-zoo MONAI bundles run through seg.* as their configs say.

Bundle folders come from ``_zoo_bundles`` (the published brats_mri_segmentation and
prostate_mri_anatomy configs, numbers scaled down, random or chosen weights). The tests prove
that the network receives the channels ``channel_def`` names in that order, that the config's
roi and symbolic shapes hold, and that the config's post-processing (sigmoid, threshold, label
lambda, argmax, largest component, inversion to the input grid) decides the labels.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import ndimage as ndi

from bcer.contracts.artifacts import Image
from bcer.contracts.errors import ErrorCode, ToolError
from bcer.tools.registry import call_tool
from bcer.tools.seg import bundle as B
from bcer.tools.seg.bundle_config import axis_rule

from tests.tools import _zoo_bundles as Z

BRAIN_PORTS = (("t1", "T1"), ("t1c", "T1c"), ("t2", "T2"), ("flair", "FLAIR"))


@pytest.fixture(autouse=True)
def _fresh_cache():
    B.clear_cache()
    yield
    B.clear_cache()


def _brain_inputs(shape: tuple[int, ...], seed: int = 0, affine: np.ndarray | None = None) -> dict[str, Image]:
    """Four independent positive random volumes (each channel identifiable by correlation)."""
    rng = np.random.default_rng(seed)
    aff = np.diag([1.0, 1.0, 1.0, 1.0]) if affine is None else affine
    return {port: Image(rng.uniform(20.0, 200.0, shape).astype(np.float32), aff.copy()) for port, _ in BRAIN_PORTS}


def _zscore(x: np.ndarray) -> np.ndarray:
    """NormalizeIntensity(nonzero=True): every voxel here is non-zero."""
    return (x - x.mean()) / x.std()


def test_published_brats_config_loads_as_published(tmp_path: Path) -> None:
    root = Z.write_bundle(tmp_path / "brats", Z.brats_inference(), Z.brats_metadata())  # full-size SegResNet
    b = B.load_bundle(root)
    assert type(b.network).__name__ == "SegResNet" and b.kind == "monai_bundle_config"
    assert b.in_channels == 4 and b.input_names == {0: "T1c", 1: "T1", 2: "T2", 3: "FLAIR"}
    assert b.roi_size == (240, 240, 160) and b.sw_batch_size == 1 and b.overlap == 0.5
    assert b.spatial_dims == 3 and b.channel_names[2] == "Enhancing tumor"
    # "8*n" (the metadata's symbolic spatial shape): any roi is moved up to a multiple of 8
    assert B.fit_roi((50, 64, 1), b.shape_rules) == (56, 64, 8)
    assert any("LoadImaged" in n for n in b.pipeline.notes) and any("SaveImaged" in n for n in b.pipeline.notes)


def test_symbolic_spatial_shapes() -> None:
    assert axis_rule("8*n", "m").fit(50) == 56
    assert axis_rule("16 * n", "m").fit(16) == 16
    assert axis_rule("2**p", "m").fit(50) == 64
    assert axis_rule("32*n+16", "m").fit(40) == 48
    assert axis_rule("*", "m").fit(37) == 37 and axis_rule(96, "m").fit(37) == 37  # ints are hints
    for bad in ("8*x", "__import__('os')", "8*n;1"):
        with pytest.raises(ToolError) as e:
            axis_rule(bad, "metadata.json")
        assert e.value.code == ErrorCode.schema


def test_brats_network_gets_channel_def_order_and_config_roi(tmp_path: Path) -> None:
    root = Z.small_brats(tmp_path / "brats", roi=[32, 32, 24])
    seen: list[np.ndarray] = []
    B.load_bundle(root).network.register_forward_pre_hook(lambda m, a: seen.append(a[0].detach().numpy().copy()))

    inputs = _brain_inputs((32, 32, 24))  # exactly one window: the network sees the whole volume
    out = call_tool("seg.brain_tumor", inputs, {"bundle_dir": str(root)})
    # one window for the answer, one for its mirrored second reading (the confidence score)
    assert len(seen) == 2 and all(s.shape == (1, 4, 32, 32, 24) for s in seen)
    got, mirrored = seen[0][0], seen[1][0]
    order = ["t1c", "t1", "t2", "flair"]  # channel_def: T1c, T1, T2, FLAIR (bcer offers t1 first)
    for k, port in enumerate(order):
        np.testing.assert_allclose(got[k], _zscore(inputs[port].data), atol=1e-4)
        np.testing.assert_allclose(mirrored[k], _zscore(inputs[port].data)[::-1], atol=1e-4)
        for other in set(order) - {port}:
            assert abs(np.corrcoef(got[k].ravel(), inputs[other].data.ravel())[0, 1]) < 0.1
    meta = out["labels"].meta
    assert meta["channels"] == ["T1c", "T1", "T2", "FLAIR"] and meta["roi_size"] == [32, 32, 24]
    assert meta["sw_batch_size"] == 1 and meta["overlap"] == 0.5
    assert meta["bundle_cache"] == "hit"  # loaded once above (to hook it), reused by the tool call

    seen.clear()  # a larger volume: every window is the config's roi; a roi override is fitted to "8*n"
    call_tool("seg.brain_tumor", _brain_inputs((48, 40, 30), 1), {"bundle_dir": str(root)})
    assert seen and all(s.shape[2:] == (32, 32, 24) for s in seen)
    seen.clear()
    out = call_tool("seg.brain_tumor", _brain_inputs((48, 40, 30), 1), {"bundle_dir": str(root), "roi_size": 20})
    assert seen and all(s.shape[2:] == (24, 24, 24) for s in seen)
    assert out["labels"].meta["roi_size"] == [24, 24, 24]
    assert B.cache_info().misses == 1 and B.cache_info().hits >= 3  # one load, reused by every call


def _conv_bundle(root: Path, inference: dict, metadata: dict, weight: np.ndarray, bias: np.ndarray) -> Path:
    state = {"weight": torch.tensor(weight, dtype=torch.float32)[..., None, None, None],
             "bias": torch.tensor(bias, dtype=torch.float32)}
    return Z.write_bundle(root, inference, metadata, state=state)


def test_brats_sigmoid_threshold_and_label_lambda_decide_the_labels(tmp_path: Path) -> None:
    # A 1x1x1 convolution in place of SegResNet: logits are known linear maps of the channels.
    net = {"_target_": "torch.nn.Conv3d", "in_channels": 4, "out_channels": 3, "kernel_size": 1}
    w = np.array([[1.0, 0.0, 0.0, 0.0],    # TC  <- T1c (channel 0 of channel_def)
                  [0.0, 0.0, 0.2, 0.8],    # WT  <- FLAIR, T2
                  [1.0, -1.0, 0.0, 0.0]])  # ET  <- T1c - T1
    b = np.array([0.3, 0.3, -0.2])
    root = _conv_bundle(tmp_path / "conv", Z.brats_inference(net, [32, 32, 24]), Z.brats_metadata(), w, b)
    inputs = _brain_inputs((40, 36, 28), seed=3)
    out = call_tool("seg.brain_tumor", inputs, {"bundle_dir": str(root)})

    def expected(order: list[str], thr: float) -> np.ndarray:
        z = np.stack([_zscore(inputs[p].data.astype(np.float64)) for p in order])
        logit = np.tensordot(w, z, axes=1) + b[:, None, None, None]
        on = logit > thr
        return np.where(on[2], 4, np.where(on[0], 1, np.where(on[1], 2, 0))), logit

    want, logit = expected(["t1c", "t1", "t2", "flair"], 0.0)  # sigmoid(x) > 0.5  <=>  x > 0
    sure = np.all(np.abs(logit) > 0.02, axis=0)
    got = out["labels"].data
    np.testing.assert_array_equal(got[sure], want[sure])
    assert set(np.unique(got)) == {0, 1, 2, 4}
    np.testing.assert_array_equal(out["wt"].data > 0, got > 0)
    np.testing.assert_array_equal(out["et"].data > 0, got == 4)
    # The check has teeth: bcer's old channel order, or no sigmoid, give other labels.
    wrong_order, _ = expected(["t1", "t1c", "t2", "flair"], 0.0)
    no_sigmoid, _ = expected(["t1c", "t1", "t2", "flair"], 0.5)
    assert np.mean(wrong_order[sure] != got[sure]) > 0.2 and np.mean(no_sigmoid[sure] != got[sure]) > 0.05
    assert out["labels"].meta["label_map"] == {"0": 0, "1": 1, "2": 2, "4": 4}


def test_published_prostate_bundle_runs_through_seg_prostate(tmp_path: Path) -> None:
    from bcer.datasets.prostate import make_prostate

    root = Z.small_prostate(tmp_path / "prostate")
    ph = make_prostate("pz", 0, size="small")
    t2w = ph.sequences["T2w"]
    out = call_tool("seg.prostate", {"t2w": t2w, "adc": ph.sequences["ADC"]}, {"bundle_dir": str(root)})
    zones = out["zones"]
    assert zones.data.shape == t2w.shape and set(np.unique(zones.data)) <= {0, 1, 2}
    np.testing.assert_array_equal(zones.affine, t2w.affine)
    meta = zones.meta
    assert meta["channels"] == ["T2w"] and meta["roi_size"] == [32, 32, 32] and meta["sw_batch_size"] == 4
    assert meta["label_map"] == {"0": 0, "1": 2, "2": 1}  # central gland -> TZ (2), peripheral zone -> PZ (1)
    assert any("nearest" in n for n in meta["bundle_notes"])
    np.testing.assert_array_equal(out["gland"].data > 0, zones.data > 0)


def _blocks() -> tuple[np.ndarray, dict[str, tuple[slice, ...]]]:
    img = np.full((40, 40, 16), 10.0, np.float32)
    where = {"tz": (slice(4, 20), slice(4, 36), slice(3, 13)),        # mid intensity: "central gland"
             "pz": (slice(24, 37), slice(4, 28), slice(3, 13)),       # bright, large: "peripheral zone"
             "speck": (slice(25, 30), slice(32, 37), slice(5, 10))}   # bright, small, apart: not kept
    img[where["tz"]] = 150.0
    img[where["pz"]] = 300.0
    img[where["speck"]] = 300.0
    return img, where


def test_prostate_argmax_largest_component_and_inversion_decide_the_zones(tmp_path: Path) -> None:
    img, where = _blocks()
    # z of the three levels after ScaleIntensity(0..1) and NormalizeIntensity, on this volume
    s = (img - img.min()) / (img.max() - img.min())
    z = {v: (float((v - img.min()) / (img.max() - img.min())) - s.mean()) / s.std() for v in (10.0, 150.0, 300.0)}
    assert z[10.0] < -0.1 and 0.2 < z[150.0] < z[300.0] - 0.5
    cut = 0.5 * (z[150.0] + z[300.0])
    # 1x1x1 conv, 3 classes: background 0, CG wins for 0 < z < cut, PZ above cut
    net = {"_target_": "torch.nn.Conv3d", "in_channels": 1, "out_channels": 3, "kernel_size": 1}
    root = _conv_bundle(tmp_path / "conv", Z.prostate_inference(net, [32, 32, 32], [1.5, 1.5, 1.5]),
                        Z.prostate_metadata(), np.array([[0.0], [1.0], [2.0]]), np.array([0.0, 0.0, -cut]))
    # an LPS-like, anisotropic grid: Orientationd and Spacingd change it, Invertd brings labels back
    affine = np.array([[-1.2, 0, 0, 30.0], [0, -1.2, 0, 20.0], [0, 0, 3.0, -10.0], [0, 0, 0, 1]])
    out = call_tool("seg.prostate", {"t2w": Image(img, affine)}, {"bundle_dir": str(root)})
    zones = out["zones"].data
    assert zones.shape == img.shape

    def inner(key: str) -> np.ndarray:
        m = np.zeros(img.shape, bool)
        m[where[key]] = True
        return ndi.binary_erosion(m, iterations=2)

    assert np.all(zones[inner("pz")] == 1)      # peripheral zone -> bcer PZ = 1
    assert np.all(zones[inner("tz")] == 2)      # central gland -> bcer TZ = 2
    assert np.all(zones[inner("speck")] == 0)   # KeepLargestConnectedComponentd removed it
    far = ndi.binary_dilation(img > 10.0, iterations=3)
    assert np.all(zones[~far] == 0)


def test_without_postprocessing_bcer_takes_argmax_and_inverts_the_preprocessing(tmp_path: Path) -> None:
    img, where = _blocks()
    net = {"_target_": "torch.nn.Conv3d", "in_channels": 1, "out_channels": 3, "kernel_size": 1}
    inf = Z.prostate_inference(net, [32, 32, 32], [1.5, 1.5, 1.5])
    del inf["postprocessing"]  # scores out; no Invertd although Orientationd/Spacingd ran
    s = (img - img.min()) / (img.max() - img.min())
    cut = 0.5 * sum((float((v - img.min()) / (img.max() - img.min())) - s.mean()) / s.std() for v in (150.0, 300.0))
    root = _conv_bundle(tmp_path / "raw", inf, Z.prostate_metadata(), np.array([[0.0], [1.0], [2.0]]),
                        np.array([0.0, 0.0, -cut]))
    affine = np.array([[-1.2, 0, 0, 30.0], [0, -1.2, 0, 20.0], [0, 0, 3.0, -10.0], [0, 0, 0, 1]])
    out = call_tool("seg.prostate", {"t2w": Image(img, affine)}, {"bundle_dir": str(root)})
    zones = out["zones"].data
    speck = np.zeros(img.shape, bool)
    speck[where["speck"]] = True
    big = np.zeros(img.shape, bool)
    big[where["pz"]] = True
    assert zones.shape == img.shape and any("argmax" in n for n in out["zones"].meta["bundle_notes"])
    assert np.all(zones[ndi.binary_erosion(big, iterations=2)] == 1)
    assert np.all(zones[ndi.binary_erosion(speck, iterations=1)] == 1)  # no largest-component step here


def test_named_input_channels_need_their_sequences(tmp_path: Path) -> None:
    from bcer.datasets.prostate import make_prostate

    ph = make_prostate("pc", 1, size="small")
    t2w, adc = ph.sequences["T2w"], ph.sequences["ADC"]
    net = {"_target_": "torch.nn.Conv3d", "in_channels": 2, "out_channels": 3, "kernel_size": 1}
    meta = Z.prostate_metadata()
    meta["network_data_format"]["inputs"]["image"].update(num_channels=2, channel_def={"0": "ADC", "1": "T2"})
    root = _conv_bundle(tmp_path / "two", Z.prostate_inference(net, [32, 32, 32], [3.0, 3.0, 3.0]), meta,
                        np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]), np.zeros(3))
    with pytest.raises(ToolError) as e:
        call_tool("seg.prostate", {"t2w": t2w}, {"bundle_dir": str(root)})
    assert e.value.code == ErrorCode.input_missing and e.value.context["arg"] == "adc"
    out = call_tool("seg.prostate", {"t2w": t2w, "adc": adc}, {"bundle_dir": str(root)})
    assert out["zones"].meta["channels"] == ["ADC", "T2w"]  # "T2" in channel_def stands for T2w

    brats = Z.small_brats(tmp_path / "brats")
    with pytest.raises(ToolError) as e:  # a brain bundle on a prostate tool: T1c is not offered
        call_tool("seg.prostate", {"t2w": t2w, "adc": adc}, {"bundle_dir": str(brats)})
    assert e.value.code == ErrorCode.input_missing and "T1c" in e.value.message


def test_output_classes_that_mean_no_tool_label_are_schema_errors(tmp_path: Path) -> None:
    meta = Z.prostate_metadata()
    meta["network_data_format"]["outputs"]["pred"]["channel_def"] = {"0": "background", "1": "liver", "2": "spleen"}
    net = {"_target_": "torch.nn.Conv3d", "in_channels": 1, "out_channels": 3, "kernel_size": 1}
    root = _conv_bundle(tmp_path / "organs", Z.prostate_inference(net, [32, 32, 32], [3.0, 3.0, 3.0]), meta,
                        np.array([[0.0], [1.0], [2.0]]), np.zeros(3))
    img, _ = _blocks()
    with pytest.raises(ToolError) as e:
        call_tool("seg.prostate", {"t2w": Image(img, np.eye(4))}, {"bundle_dir": str(root)})
    assert e.value.code == ErrorCode.schema and "liver" in e.value.message
    # metadata bcer.label_map states the mapping where names cannot
    meta["bcer"] = {"label_map": {"0": 0, "1": 2, "2": 1}}
    (root / "configs" / "metadata.json").write_text(json.dumps(meta))
    out = call_tool("seg.prostate", {"t2w": Image(img, np.eye(4))}, {"bundle_dir": str(root)})
    assert set(np.unique(out["zones"].data)) <= {0, 1, 2} and out["zones"].meta["label_map"] == {"0": 0, "1": 2, "2": 1}


def test_bad_symbolic_shape_and_unbuildable_sections_are_schema_errors(tmp_path: Path) -> None:
    meta = Z.brats_metadata()
    meta["network_data_format"]["inputs"]["image"]["spatial_shape"] = ["8*n", "8*m", "8*n"]
    root = Z.small_brats(tmp_path / "bad")
    (root / "configs" / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(ToolError) as e:
        B.load_bundle(root)
    assert e.value.code == ErrorCode.schema and e.value.context["file"].endswith("metadata.json")

    inf = Z.brats_inference(dict(Z.BRATS_NETWORK, init_filters=8), [32, 32, 24])
    inf["postprocessing"]["transforms"][0]["_target_"] = "NoSuchTransformd"
    root = Z.write_bundle(tmp_path / "bad2", inf, Z.brats_metadata())
    with pytest.raises(ToolError) as e:
        B.load_bundle(root)
    assert e.value.code == ErrorCode.schema and e.value.context["file"].endswith("inference.json")
