"""The Reflector's GPU -> CPU fallback when Ray granted a GPU the worker cannot use."""
from __future__ import annotations

from bcer.agents.repair.reflector import Reflector
from bcer.contracts import Case, Resources, SequenceRef, ToolError
from bcer.contracts.artifacts import ArtifactKind
from bcer.contracts.errors import ErrorCode
from bcer.contracts.repair import Failure, Halt, Patch
from bcer.contracts.workflow import Node, Workflow
from bcer.tools._gpu import torch_device
from bcer.tools.seg.bundle import shipped_bundle

CASE = Case(id="c", root="/tmp", sequences={"CINE": SequenceRef(path="/tmp/cine.nii.gz", kind=ArtifactKind.cine)})


def _verdict(gpu: str, err: ToolError, has_gpu: bool = True) -> Patch | Halt:
    node = Node(id="seg", tool="seg.cardiac", gpu=gpu, inputs={"cine": "@seq.CINE"},
                params={"bundle_dir": str(shipped_bundle()), "roi_size": 64}, outputs=["labels"], resources=Resources())
    wf = Workflow(case_id="c", nodes=[node])
    f = Failure(case_id="c", node=node, error=err.with_context(device="cuda").to_dict(), has_gpu=has_gpu)
    return Reflector().repair(f, wf, CASE)


def _no_device_error() -> ToolError:
    try:
        torch_device("cuda")  # this machine has no CUDA device
    except ToolError as e:
        return e
    raise AssertionError("torch sees a CUDA device here: this test needs a machine without one")


def test_unusable_gpu_runs_the_cpu_path_not_an_oom_shrink():
    err = _no_device_error()
    assert err.code == ErrorCode.resource and err.context.get("no_device") is True
    v = _verdict("optional", err)
    assert isinstance(v, Patch) and v.device == "cpu" and v.params["roi_size"] == 64  # nothing halved


def test_unusable_gpu_halts_a_gpu_only_tool():
    v = _verdict("required", _no_device_error())
    assert isinstance(v, Halt) and v.code == "resource" and "no usable GPU" in v.reason


def test_real_out_of_memory_still_shrinks_the_window():
    oom = ToolError(ErrorCode.resource, "bundle ran out of memory", arg="roi_size")
    v = _verdict("optional", oom)
    assert isinstance(v, Patch) and v.params["roi_size"] == 32 and v.device is None
