"""The MONAI bundle path of seg.*: loading, per-process caching, typed errors, shipped bundle Dice."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from bcer.contracts.errors import ErrorCode, ToolError
from bcer.tools.seg import bundle as B

NET_DEF = {"_target_": "UNet", "spatial_dims": 2, "in_channels": 1, "out_channels": 3,
           "channels": [4, 8], "strides": [2], "num_res_units": 0}


def _make_bundle(root: Path, torchscript: bool = False) -> Path:
    from monai.bundle import ConfigParser

    torch.manual_seed(0)
    net = ConfigParser({"network_def": NET_DEF}).get_parsed_content("network_def").eval()
    (root / "configs").mkdir(parents=True)
    (root / "models").mkdir()
    meta = {"name": "tiny", "version": "0.0.1",
            "network_data_format": {"inputs": {"image": {"num_channels": 1, "spatial_shape": [16, 16]}},
                                    "outputs": {"pred": {"num_channels": 3,
                                                         "channel_def": {"0": "bg", "1": "a", "2": "b"}}}},
            "bcer": {"spatial_dims": 2, "label_values": [0, 1, 4]}}
    (root / "configs" / "metadata.json").write_text(json.dumps(meta))
    if torchscript:
        torch.jit.script(net).save(str(root / "models" / "model.ts"))
    else:
        (root / "configs" / "inference.json").write_text(json.dumps({"network_def": NET_DEF}))
        torch.save(net.state_dict(), root / "models" / "model.pt")
    return root


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    B.clear_cache()
    return _make_bundle(tmp_path / "tiny")


def test_second_load_is_a_cache_hit_not_a_reload(tiny: Path) -> None:
    first = B.load_bundle(tiny)
    second = B.load_bundle(str(tiny))
    info = B.cache_info()
    assert second is first and second.network is first.network
    assert (info.misses, info.hits) == (1, 1)
    # Edited weights (new mtime) are picked up: a new entry, not the stale network.
    model = tiny / "models" / "model.pt"
    st = model.stat()
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert B.load_bundle(tiny) is not first
    assert B.cache_info().misses == 2


def test_infer_maps_channels_to_label_values(tiny: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(100, 20, (1, 20, 18, 3)).astype(np.float32)
    x.setflags(write=False)  # like an array out of Ray's object store
    labels, meta = B.run_bundle(str(tiny), x, roi_size=16, sw_batch_size=2)
    assert labels.shape == (20, 18, 3)
    assert set(np.unique(labels)) <= {0, 1, 4}
    assert meta["method"] == "monai_bundle" and meta["bundle_name"] == "tiny"
    assert B.cache_info().misses == 1


def test_torchscript_bundle_matches_state_dict_bundle(tmp_path: Path) -> None:
    B.clear_cache()
    pt = _make_bundle(tmp_path / "pt")
    ts = _make_bundle(tmp_path / "ts", torchscript=True)
    x = np.random.default_rng(1).normal(50, 10, (1, 16, 16, 2)).astype(np.float32)
    a, _ = B.run_bundle(str(pt), x, roi_size=16)
    b, _ = B.run_bundle(str(ts), x, roi_size=16)
    np.testing.assert_array_equal(a, b)


def test_bad_bundles_give_typed_errors_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(ToolError) as e:
        B.load_bundle(tmp_path / "nope")
    assert e.value.code == ErrorCode.input_missing and "nope" in e.value.context["file"]

    root = _make_bundle(tmp_path / "b")
    (root / "models" / "model.pt").unlink()
    with pytest.raises(ToolError) as e:
        B.load_bundle(root)
    assert e.value.code == ErrorCode.input_missing and e.value.context["file"].endswith("model.pt")

    root = _make_bundle(tmp_path / "c")
    (root / "configs" / "inference.json").write_text("{not json")
    with pytest.raises(ToolError) as e:
        B.load_bundle(root)
    assert e.value.code == ErrorCode.schema and e.value.context["file"].endswith("inference.json")

    root = _make_bundle(tmp_path / "d")
    wrong = dict(NET_DEF, channels=[8, 16])
    (root / "configs" / "inference.json").write_text(json.dumps({"network_def": wrong}))
    with pytest.raises(ToolError) as e:
        B.load_bundle(root)
    assert e.value.code == ErrorCode.schema and e.value.context["file"].endswith("model.pt")


def test_wrong_channel_count_is_a_shape_error(tiny: Path) -> None:
    with pytest.raises(ToolError) as e:
        B.run_bundle(str(tiny), np.zeros((2, 16, 16, 1), np.float32))
    assert e.value.code == ErrorCode.shape


def test_inputs_on_another_grid_are_resampled_to_the_bundle_pixdim(tmp_path: Path) -> None:
    B.clear_cache()
    root = _make_bundle(tmp_path / "px")
    meta_path = root / "configs" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    meta["bcer"]["pixdim"] = [2.0, 2.0]
    meta_path.write_text(json.dumps(meta))
    x = np.random.default_rng(2).normal(10, 2, (1, 30, 26, 2)).astype(np.float32)
    bundle = B.load_bundle(root)
    assert bundle.pixdim == (2.0, 2.0)
    assert B._zoom_shape((30, 26, 2), (1.0, 1.0, 5.0), bundle.pixdim) == (15, 13, 2)
    assert B._zoom_shape((30, 26, 2), (2.04, 1.98, 5.0), bundle.pixdim) == (30, 26, 2)  # within 5 %
    labels, _ = B.run_bundle(str(root), x, spacing=(1.0, 1.0, 5.0), roi_size=16)
    assert labels.shape == (30, 26, 2)
    assert set(np.unique(labels)) <= {0, 1, 4}


SHIPPED = Path(__file__).resolve().parents[2] / "bcer" / "assets" / "bundles" / "cardiac_unet2d"
HELD_OUT_SEED = 9000  # scripts/train_bundle.py evaluates on seeds 9000+, trains on 1000+


def test_shipped_bundle_lookup() -> None:
    assert B.shipped_bundle() == SHIPPED
    with pytest.raises(ToolError) as e:
        B.shipped_bundle("cardiac_unet")
    assert e.value.code == ErrorCode.input_missing and "cardiac_unet2d" in e.value.hint


def test_shipped_bundle_metadata_and_size() -> None:
    meta = json.loads((SHIPPED / "configs" / "metadata.json").read_text())
    metrics = json.loads((SHIPPED / "metrics.json").read_text())
    lo, hi = meta["training"]["train_seeds"]
    assert not lo <= HELD_OUT_SEED <= hi
    assert metrics["held_out_seeds"][0] == HELD_OUT_SEED
    assert min(metrics["mean_dice"].values()) >= 0.8
    size = sum(f.stat().st_size for f in SHIPPED.rglob("*") if f.is_file())
    assert size <= 5 * 2**20


@pytest.mark.parametrize("offset,group", [(0, "NOR"), (1, "DCM")])
def test_shipped_bundle_through_seg_cardiac_on_a_held_out_phantom(offset: int, group: str) -> None:
    from bcer.datasets.cardiac import make_cardiac
    from bcer.tools.registry import call_tool
    from bcer.metrics import dice

    B.clear_cache()
    ph = make_cardiac("held_out", HELD_OUT_SEED + offset, size="small", group=group)
    cine = ph.sequences["CINE"]
    params = {"bundle_dir": str(SHIPPED), "roi_size": 64}
    out = call_tool("seg.cardiac", {"cine": cine}, params)["labels"]
    truth = np.asarray(ph.labels["seg"].data)
    assert out.data.shape == cine.data.shape and out.meta["method"] == "monai_bundle"
    np.testing.assert_array_equal(out.affine, cine.affine)
    for k in (1, 2, 3):
        d = dice(out.data == k, truth == k)
        assert d >= 0.8, f"label {k}: Dice {d:.3f}"
    # A second call in the same process reuses the loaded network.
    call_tool("seg.cardiac", {"cine": cine}, params)
    info = B.cache_info()
    assert (info.misses, info.hits) == (1, 1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_and_cpu_bundle_paths_agree() -> None:
    from bcer.datasets.cardiac import make_cardiac

    from bcer.tools.seg.cardiac_net import network_input

    cine = make_cardiac("gpu", HELD_OUT_SEED, size="small", group="NOR").sequences["CINE"]
    # the input the tool builds (2 channels: frames and temporal std); this test only runs on a
    # GPU machine, so it went stale when the bundle gained its second channel (found there)
    flat = network_input(np.asarray(cine.data, np.float32), 2)
    cpu, _ = B.run_bundle(str(SHIPPED), flat, cine.spacing, device="cpu")
    gpu, meta = B.run_bundle(str(SHIPPED), flat, cine.spacing, device="cuda")
    assert meta["device"] == "cuda"
    assert np.mean(cpu == gpu) >= 0.999  # argmax ties may flip a few voxels in float32


def _tiny_bundle(root: Path, net_def: dict, meta_bcer: dict, n_out: int) -> Path:
    from monai.bundle import ConfigParser

    torch.manual_seed(0)
    net = ConfigParser({"network_def": net_def}).get_parsed_content("network_def")
    (root / "configs").mkdir(parents=True)
    (root / "models").mkdir()
    (root / "configs" / "inference.json").write_text(json.dumps({"network_def": net_def}))
    (root / "configs" / "metadata.json").write_text(json.dumps({
        "network_data_format": {"outputs": {"pred": {"num_channels": n_out}}}, "bcer": meta_bcer}))
    torch.save(net.state_dict(), root / "models" / "model.pt")
    return root


def test_brats_style_sigmoid_bundle_through_seg_brain_tumor(tmp_path: Path) -> None:
    from bcer.datasets.brain import make_brain
    from bcer.tools.registry import call_tool

    net = {"_target_": "UNet", "spatial_dims": 3, "in_channels": 4, "out_channels": 3,
           "channels": [2, 4], "strides": [2], "num_res_units": 0}
    root = _tiny_bundle(tmp_path / "brats", net, {"output": "sigmoid_brats", "label_values": [0, 1, 2]}, 3)
    ph = make_brain("bb", 0, size="small", grade="HGG")
    inputs = {p: ph.sequences[s] for p, s in (("t1", "T1"), ("t1c", "T1c"), ("t2", "T2"), ("flair", "FLAIR"))}
    out = call_tool("seg.brain_tumor", inputs, {"bundle_dir": str(root), "roi_size": 32})
    lab = out["labels"].data
    assert lab.shape == ph.sequences["T1"].shape and set(np.unique(lab)) <= {0, 1, 2, 4}
    assert out["labels"].meta["method"] == "monai_bundle"
    np.testing.assert_array_equal(out["wt"].data > 0, lab > 0)
    np.testing.assert_array_equal(out["tc"].data > 0, np.isin(lab, [1, 4]))
    np.testing.assert_array_equal(out["labels"].affine, ph.sequences["T1"].affine)


def test_two_channel_prostate_bundle_needs_adc(tmp_path: Path) -> None:
    from bcer.datasets.prostate import make_prostate
    from bcer.tools.registry import call_tool

    net = dict(NET_DEF, in_channels=2)
    root = _tiny_bundle(tmp_path / "pro", net, {"spatial_dims": 2}, 3)
    ph = make_prostate("pb", 0, size="small")
    with pytest.raises(ToolError) as e:
        call_tool("seg.prostate", {"t2w": ph.sequences["T2w"]}, {"bundle_dir": str(root), "roi_size": 32})
    assert e.value.code == ErrorCode.input_missing and e.value.context["arg"] == "adc"
    out = call_tool("seg.prostate", {"t2w": ph.sequences["T2w"], "adc": ph.sequences["ADC"]},
                    {"bundle_dir": str(root), "roi_size": 32})
    assert out["zones"].data.shape == ph.sequences["T2w"].shape
    assert set(np.unique(out["zones"].data)) <= {0, 1, 2}
    np.testing.assert_array_equal(out["gland"].data > 0, out["zones"].data > 0)


def _conv_labels(root: Path, stack: np.ndarray) -> np.ndarray:
    """What a one-layer argmax bundle writes for a (C, X, Y, Z) stack, computed here."""
    from monai.bundle import ConfigParser

    net_def = json.loads((root / "configs" / "inference.json").read_text())["network_def"]
    net = ConfigParser({"network_def": net_def}).get_parsed_content("network_def")
    net.load_state_dict(torch.load(root / "models" / "model.pt"))
    with torch.no_grad():
        logits = net(torch.from_numpy(B._normalize(stack, "zscore"))[None])
    return np.asarray([0, 1, 2, 4])[torch.argmax(logits, dim=1)[0].numpy()]


@pytest.mark.parametrize("kernel", [1, 3])
def test_brain_bundle_confidence_is_its_mirrored_second_reading(tmp_path: Path, kernel: int) -> None:
    """seg.brain_tumor with a bundle scores itself by the same network on the mirrored contrasts:
    a pointwise network is mirror-equivariant (score exactly 1); a 3x3x3 one is not, and its
    score is the Dice computed here from the network itself. The threshold is the bundle's own."""
    from bcer.contracts.artifacts import Image
    from bcer.metrics import dice
    from bcer.tools.registry import call_tool
    from bcer.tools.seg.confidence import MIRROR_METHOD

    net = {"_target_": "torch.nn.Conv3d", "in_channels": 4, "out_channels": 4, "kernel_size": kernel,
           "padding": kernel // 2}
    meta = {"label_values": [0, 1, 2, 4], "low_confidence_threshold": 0.9}
    root = _tiny_bundle(tmp_path / f"k{kernel}", net, meta, 4)
    rng = np.random.default_rng(kernel)
    base = np.zeros((16, 16, 16), np.float32)  # one window of roi 16: no seams between windows
    base[3:9, 4:14, 4:12] = 1.0  # an off-centre block: the mirror is another image
    inputs = {p: Image((50 + 40 * base * (k + 1) + rng.normal(0, 5, base.shape)).astype(np.float32), np.eye(4))
              for k, p in enumerate(("t1", "t1c", "t2", "flair"))}
    out = call_tool("seg.brain_tumor", inputs, {"bundle_dir": str(root), "roi_size": 16})
    conf = out["labels"].meta["confidence"]
    stack = np.stack([inputs[p].data for p in ("t1", "t1c", "t2", "flair")])
    a, b = _conv_labels(root, stack), _conv_labels(root, np.ascontiguousarray(stack[:, ::-1]))[::-1]
    np.testing.assert_array_equal(out["labels"].data, a)
    want = min(dice(np.isin(a, v), np.isin(b, v)) for v in ((1, 2, 4), (1, 4), (4,)))
    assert conf["method"] == MIRROR_METHOD and conf["threshold"] == 0.9
    assert conf["score"] == pytest.approx(want, abs=1e-4)
    assert (conf["score"] == 1.0) if kernel == 1 else (conf["score"] < 0.99)
    assert conf["low_confidence"] == (want < 0.9)
    assert out["labels"].meta["flags"]["low_confidence"]["flagged"] == conf["low_confidence"]


def test_brain_bundle_without_a_threshold_is_flagged_with_its_score(tmp_path: Path) -> None:
    from bcer.contracts.artifacts import Image
    from bcer.tools.registry import call_tool

    net = {"_target_": "torch.nn.Conv3d", "in_channels": 4, "out_channels": 4, "kernel_size": 1}
    root = _tiny_bundle(tmp_path / "nothr", net, {"label_values": [0, 1, 2, 4]}, 4)
    rng = np.random.default_rng(0)
    inputs = {p: Image(rng.uniform(20, 200, (16, 16, 12)).astype(np.float32), np.eye(4))
              for p in ("t1", "t1c", "t2", "flair")}
    meta = call_tool("seg.brain_tumor", inputs, {"bundle_dir": str(root), "roi_size": 16})["labels"].meta
    conf = meta["confidence"]
    assert conf["score"] == 1.0 and conf["threshold"] is None and conf["low_confidence"] is True
    assert "low_confidence_threshold" in conf["reason"]
    assert "no threshold known" in meta["flags"]["low_confidence"]["detail"]


def _pointwise_member(root: Path, name: str, weight: float, bias: float) -> None:
    """A 1x1x1 Conv3d member whose class-1 logit minus class-0 logit is weight * x + bias."""
    state = {"weight": torch.tensor([0.0, weight]).reshape(2, 1, 1, 1, 1), "bias": torch.tensor([0.0, bias])}
    torch.save(state, root / "models" / name)


def test_ensemble_bundle_averages_its_members_softmax(tmp_path: Path) -> None:
    """bcer.members: the answer is the arg-max of the members' mean softmax. With pointwise
    members the expected labels are computed here in closed form, and they differ from what
    either member alone writes."""
    net = {"_target_": "torch.nn.Conv3d", "in_channels": 1, "out_channels": 2, "kernel_size": 1}
    root = _tiny_bundle(tmp_path / "ens", net, {"label_values": [0, 1], "members": ["member_1.pt"]}, 2)
    _pointwise_member(root, "model.pt", 1.0, 0.0)  # class 1 where z > 0
    _pointwise_member(root, "member_1.pt", -3.0, 1.0)  # class 1 where z < 1/3
    B.clear_cache()
    x = np.random.default_rng(0).normal(100, 20, (1, 16, 16, 16)).astype(np.float32)
    labels, meta = B.run_bundle(str(root), x, roi_size=16)
    z = B._normalize(x, "zscore")[0]
    sig = lambda t: 1.0 / (1.0 + np.exp(-t))  # noqa: E731  (two-class softmax)
    want = ((sig(z) + sig(1.0 - 3.0 * z)) / 2 > 0.5).astype(np.int16)
    assert meta["ensemble_members"] == 2 and len(B.load_bundle(root).networks) == 2
    assert (labels != want).sum() <= 2  # float ties at the decision boundary only
    assert (want != (z > 0)).sum() > 100 and (want != (z < 1 / 3)).sum() > 100


def test_ensemble_bundle_errors_are_typed(tmp_path: Path) -> None:
    net = {"_target_": "torch.nn.Conv3d", "in_channels": 1, "out_channels": 3, "kernel_size": 1}
    root = _tiny_bundle(tmp_path / "missing", net, {"members": ["member_1.pt"]}, 3)
    with pytest.raises(ToolError) as e:
        B.load_bundle(root)
    assert e.value.code == ErrorCode.input_missing and e.value.context["file"].endswith("member_1.pt")
    root = _tiny_bundle(tmp_path / "sigmoid", net, {"members": ["model.pt"], "output": "sigmoid_brats"}, 3)
    with pytest.raises(ToolError) as e:
        B.load_bundle(root)
    assert e.value.code == ErrorCode.schema and "argmax" in str(e.value)
    for bad in ("member_1.pt", ["../other/model.pt"]):  # not a list; a path out of models/
        root = _tiny_bundle(tmp_path / f"bad{len(str(bad))}", net, {"members": bad}, 3)
        with pytest.raises(ToolError) as e:
            B.load_bundle(root)
        assert e.value.code == ErrorCode.schema and e.value.context["file"].endswith("metadata.json")
