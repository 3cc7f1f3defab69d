"""k-space reconstructed on the header's recon matrix (readout oversampling removed, centre
crop exactly as fastMRI's ``reconstruction_rss``), the generic ``recon`` task, and the case
domain read from the ISMRMRD header."""
from __future__ import annotations

import xml.etree.ElementTree as ET
from functools import lru_cache

import h5py
import numpy as np
import pytest

from bcer.contracts import Case, ErrorCode, KSpace, ToolError, load_contract
from bcer.contracts.case import SequenceRef
from bcer.datasets.kspace import make_kspace_case
from bcer.datasets.layouts import fastmri
from bcer.engine.driver import admit_case
from bcer.engine.validate import validate_deliverable
from bcer.metrics import nrmse_scaled
from bcer.io.fastmri import domain_of, ismrmrd_xml, read_fastmri, read_fastmri_reference
from bcer.io.nifti import write_nifti
from bcer.tools.registry import call_tool

_NS = {"m": "http://www.ismrm.org/ISMRMRD"}


def _header_recon_matrix(path) -> tuple[int, int]:
    """reconSpace matrix read straight from the file's XML (not through bcer's reader)."""
    with h5py.File(path, "r") as f:
        root = ET.fromstring(f["ismrmrd_header"][()])
    node = root.find("m:encoding/m:reconSpace/m:matrixSize", _NS)
    return int(node.find("m:x", _NS).text), int(node.find("m:y", _NS).text)


def _fastmri_rss(kspace: np.ndarray, crop: tuple[int, int]) -> np.ndarray:
    """fastMRI's recipe, written independently: centred orthonormal 2-D IFFT over (kx, ky),
    centre crop to the recon matrix with offsets (n - m) // 2, root-sum-of-squares over coils."""
    axes = (-2, -1)
    im = np.fft.fftshift(np.fft.ifftn(np.fft.ifftshift(kspace, axes=axes), axes=axes, norm="ortho"), axes=axes)
    w0, h0 = (im.shape[-2] - crop[0]) // 2, (im.shape[-1] - crop[1]) // 2
    im = im[..., w0:w0 + crop[0], h0:h0 + crop[1]]
    return np.sqrt((np.abs(im) ** 2).sum(axis=1))  # (slices, x, y)


@lru_cache(maxsize=4)
def _written(tmp: str, domain: str, R: int, noise: float) -> Case:
    ph = make_kspace_case(f"ov_{domain}_{R}", 5, "small", domain=domain, frames="ed", R=R, noise=noise,
                          readout_oversampling=2.0, phase_oversampling=1.14)
    (case,) = fastmri.write([ph], f"{tmp}/{domain}_{R}")
    return case


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("recon_matrix"))


def test_fully_sampled_oversampled_file_matches_fastmri_recipe(tmp) -> None:
    """On a fully sampled, noiseless, 2x readout-oversampled file, fastMRI's own recipe, the
    file's reconstruction_rss and bcer's recon agree to float precision on the recon matrix."""
    case = _written(tmp, "cardiac", 1, 0.0)
    path = case.sequences["KSPACE"].path
    rx, ry = _header_recon_matrix(path)
    with h5py.File(path, "r") as f:
        k, rss_file = f["kspace"][()], f["reconstruction_rss"][()]
    assert k.shape[2] == 2 * rx and k.shape[3] > ry  # readout 2x, phase oversampled too
    ref = _fastmri_rss(k, (rx, ry))
    assert np.abs(ref - rss_file).max() < 1e-5 * rss_file.max()
    out = call_tool("recon.zero_filled", {"kspace": read_fastmri(path)})["image"]
    assert out.shape == (rx, ry, k.shape[0])
    assert np.abs(out.data - ref.transpose(1, 2, 0)).max() < 1e-5 * ref.max()
    assert out.meta["recon_matrix"] == [rx, ry] and out.meta["encoded_matrix"] == [k.shape[2], k.shape[3]]
    np.testing.assert_allclose(out.affine, read_fastmri_reference(path).affine, atol=1e-9)
    assert case.metadata["recon_matrix"] == [rx, ry] and case.domain == "cardiac"


@pytest.mark.parametrize("tool", ["recon.sense", "recon.grappa"])
def test_undersampled_oversampled_file(tmp, tool) -> None:
    """R=4 with readout oversampling: the output is on the header's recon matrix, lines up with
    reconstruction_rss, beats zero filling by 2x and passes the contract's affine check."""
    case = _written(tmp, "cardiac", 4, 0.002)
    path = case.sequences["KSPACE"].path
    ks = read_fastmri(path)
    ref = read_fastmri_reference(path)
    out = call_tool(tool, {"kspace": ks})["image"]
    zf = call_tool("recon.zero_filled", {"kspace": ks})["image"]
    assert out.shape[:2] == _header_recon_matrix(path) == ref.shape[:2]
    err, base = nrmse_scaled(out.data, ref.data), nrmse_scaled(zf.data, ref.data)
    assert err < 0.12 and err < 0.5 * base, (tool, err, base)
    write_nifti(out, f"{tmp}/recon.nii.gz")
    spec = load_contract("recon").deliverables[0]
    ok, why = validate_deliverable(spec.model_copy(update={"file": "recon.nii.gz"}), tmp, case)
    assert ok, why


def test_recon_task_accepts_any_organ_and_keeps_recon_cardiac(tmp) -> None:
    brain = _written(tmp, "brain", 4, 0.002)
    assert brain.domain == "brain" and brain.metadata["encoded_matrix"][0] == 2 * brain.metadata["recon_matrix"][0]
    admit_case(brain, load_contract("recon"))
    with pytest.raises(ToolError) as e:  # recon_cardiac is for cardiac k-space only
        admit_case(brain, load_contract("recon_cardiac"))
    assert e.value.code is ErrorCode.input_missing
    admit_case(_written(tmp, "cardiac", 1, 0.0), load_contract("recon_cardiac"))


def test_offline_brain_plans_recon_for_a_knee_file() -> None:
    from bcer.agents.planners.offline import OfflinePlanner
    from bcer.engine.planning import plan_and_compile

    knee = Case(id="k", root="/nonexistent", domain="knee",
                sequences={"KSPACE": SequenceRef(path="/nonexistent/k.h5", format="fastmri_h5", kind="kspace")})
    sketch, wf, _ = plan_and_compile(OfflinePlanner(), load_contract("recon").goal, knee, load_contract("recon"))
    assert sketch.domain == "knee" and {n.milestone for n in wf.nodes} == {"reconstruction"}


@pytest.mark.parametrize("acq,protocol,want", [
    ("CORPD_FBK", "", "knee"), ("AXFLAIR", "", "brain"), ("AXT2", "", "brain"),
    ("AXT2", "T2 TSE prostate", "prostate"), ("", "cine bSSFP SAX", "cardiac"), ("XYZ", "", "unknown")])
def test_domain_from_header(tmp_path, acq, protocol, want) -> None:
    xml = ismrmrd_xml((32, 24, 2), (1.0, 1.0, 3.0), (16, 16), (1.0, 1.0, 3.0), protocol)
    assert domain_of(acq, xml) == want
    k = np.zeros((2, 3, 32, 24), np.complex64)
    k[..., 10:14] = 1.0
    with h5py.File(tmp_path / "file1.h5", "w") as f:  # a real-style file: no bcer attributes
        f.create_dataset("kspace", data=k)
        f.create_dataset("ismrmrd_header", data=xml)
        f.attrs["acquisition"] = acq
    (case,) = fastmri.read(tmp_path)
    assert case.domain == want and case.metadata["recon_matrix"] == [16, 16]


def test_recon_matrix_that_does_not_fit_is_a_shape_error() -> None:
    k = np.ones((2, 16, 12, 1), np.complex64)
    ks = KSpace(k, np.ones(12, bool), np.eye(4), {"recon_matrix": [20, 8]})
    with pytest.raises(ToolError) as e:
        call_tool("recon.zero_filled", {"kspace": ks})
    assert e.value.code is ErrorCode.shape and "recon matrix" in e.value.message
    # fastMRI's rule for files whose phase matrix is smaller than the recon y: a (Y, Y) crop
    wide = KSpace(k, np.ones(12, bool), np.eye(4), {"recon_matrix": [16, 14]})
    assert wide.recon_crop == (2, 0, 12, 12)
    assert call_tool("recon.zero_filled", {"kspace": wide})["image"].shape == (12, 12, 1)
