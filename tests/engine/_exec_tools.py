"""Toy tools for the executor tests (registered on import, in the driver and in Ray workers).

Each returns deterministic data so digests of two runs can be compared, and records what
it received so tests can check the binding.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from bcer.contracts import Classification, Image, Mask, Table, ToolError
from bcer.tools.registry import tool

CHEAP = {"num_cpus": 0.25, "memory_mb": 64}


class Step(BaseModel):
    model_config = ConfigDict(extra="forbid")
    add: float = Field(1.0, ge=-100, le=100)
    sleep_s: float = Field(0.0, ge=0, le=5)
    # a file in the case's input root: while it exists the step waits (tests hold a case at a
    # known point and release it by deleting the file, instead of racing a timer)
    hold_file: str = ""


class Windowed(BaseModel):
    model_config = ConfigDict(extra="forbid")
    window: int = Field(8, ge=1, le=64)


class Suicide(BaseModel):
    model_config = ConfigDict(extra="forbid")
    scratch_dir: str  # bound to @runtime.output_dir, so the sandbox lets it through
    always: bool = False  # kill on every attempt (Ray eventually gives up)


class Writer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    out_path: str = "note.txt"


class Parts(NamedTuple):
    big: Image
    small: Mask


def _wait_released(hold: str, limit_s: float = 240.0) -> None:
    """Block while the hold file exists (bounded: a test that never releases fails, not hangs)."""
    if not hold:
        return
    t0 = time.monotonic()
    while Path(hold).exists():
        if time.monotonic() - t0 > limit_s:
            raise ToolError("timeout", f"hold file {hold} never released")
        time.sleep(0.02)


@tool("xtoy.step", resources=CHEAP, milestone="stepped")
def step(img: Image, params: Step) -> Image:
    """Add a constant (optionally sleeping first, to make run intervals measurable; optionally
    held while ``hold_file`` exists)."""
    _wait_released(params.hold_file)
    time.sleep(params.sleep_s)
    return Image(np.asarray(img.data) + params.add, img.affine, {"pid": os.getpid()})


@tool("xtoy.step_1cpu", resources={"num_cpus": 1, "memory_mb": 64}, milestone="stepped")
def step_1cpu(img: Image, params: Step) -> Image:
    """``xtoy.step`` holding a whole CPU: on a cluster of 1-CPU nodes, cases cannot all pack onto
    one node (a quarter-CPU step can, as Ray's hybrid policy sometimes chooses)."""
    return step(img, params)


@tool("xtoy.join", resources=CHEAP, milestone="joined")
def join(a: Image, b: Image) -> Image:
    """Sum of two images."""
    return Image(np.asarray(a.data) + np.asarray(b.data), a.affine)


@tool("xtoy.split", resources=CHEAP)
def split(img: Image) -> Parts:
    """A big image field and a small mask field."""
    big = Image(np.ones((64, 64, 32), np.float32), img.affine, {"field": "big"})
    small = Mask((np.asarray(img.data) > np.median(img.data)).astype(np.int16), img.affine, {"field": "small"},
                 labels={1: "bright"})
    return Parts(big, small)


@tool("xtoy.probe", resources=CHEAP, milestone="probed")
def probe(mask: Mask) -> Table:
    """Report what arrived at the port: its type, the field it claims to be, its shape."""
    return Table([{"type": type(mask).__name__, "field": mask.meta.get("field"),
                   "shape": list(mask.shape), "voxels": int(np.count_nonzero(mask.data))}])


@tool("xtoy.measure", resources=CHEAP, milestone="measured")
def measure(img: Image) -> Table:
    """Mean and voxel count of an image."""
    return Table([{"label": "all", "mean": float(np.mean(img.data)), "n": int(np.size(img.data))}],
                 units={"mean": "a.u."})


@tool("xtoy.grade", resources=CHEAP, milestone="graded")
def grade(table: Table) -> Classification:
    """high if the mean is above 10."""
    mean = table.rows[0]["mean"]
    return Classification("high" if mean > 10 else "low", [{"rule": "mean > 10", "value": mean}])


@tool("xtoy.window", resources=CHEAP)
def windowed(img: Image, params: Windowed) -> Image:
    """Pretends to run out of memory above window 16 (like a sliding-window network)."""
    if params.window > 16:
        raise ToolError("resource", f"out of memory with window {params.window}", arg="window",
                        oom=True)
    return Image(np.asarray(img.data) * 2, img.affine, {"window": params.window})


@tool("xtoy.suicide", resources=CHEAP)
def suicide(img: Image, params: Suicide) -> Image:
    """SIGKILLs its own worker on the first attempt (marker file), then works."""
    marker = Path(params.scratch_dir) / "killed_once"
    if params.always or not marker.exists():
        marker.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return Image(np.asarray(img.data) - 3, img.affine)


@tool("xtoy.gpu_opt", resources=CHEAP, gpu="optional")
def gpu_opt(img: Image, device: str = "cpu") -> Table:
    """Records the device it was given."""
    return Table([{"device": device, "mean": float(np.mean(img.data))}])


@tool("xtoy.gpu_only", resources=CHEAP, gpu="required")
def gpu_only(img: Image, device: str = "cuda") -> Image:
    """Has no CPU path."""
    return img


@tool("xtoy.writer", resources=CHEAP)
def writer(img: Image, params: Writer) -> Image:
    """Takes a path param (the sandbox must vet it before the task runs)."""
    return img


@tool("xtoy.needs_even", resources=CHEAP, milestone="evened")
def needs_even(img: Image) -> Image:
    """Refuses an image whose first axis is odd-sized (like a tool that needs another grid)."""
    if np.shape(img.data)[0] % 2:
        raise ToolError("shape", f"first axis has odd size {np.shape(img.data)[0]}", arg="img")
    return Image(np.asarray(img.data) * 3, img.affine)


@tool("xtoy.pad_even", resources=CHEAP)
def pad_even(img: Image) -> Image:
    """Pads the first axis to an even size (the step a repair can insert)."""
    data = np.asarray(img.data)
    if data.shape[0] % 2:
        data = np.concatenate([data, data[-1:]], axis=0)
    return Image(data, img.affine)


@tool("xtoy.flaky_extra", resources=CHEAP, milestone="extra")
def flaky_extra(img: Image) -> Table:
    """An optional side measurement that always fails (a repair may skip it)."""
    raise ToolError("numeric", "side measurement diverged")


class Tally(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tag: str
    scratch_dir: str  # bound to @runtime.output_dir: the tally survives the worker
    add: float = Field(1.0, ge=-100, le=100)
    sleep_s: float = Field(0.0, ge=0, le=5)
    # a file in the case's input root: while it exists the step waits (tests hold a case at a
    # known point and release it by deleting the file, instead of racing a timer)
    hold_file: str = ""


@tool("xtoy.tally", resources=CHEAP, milestone="tallied")
def tally(img: Image, params: Tally) -> Image:
    """Adds ``add`` and appends ``tag`` to ``tally.log``: a line per real execution."""
    time.sleep(params.sleep_s)
    with open(Path(params.scratch_dir) / "tally.log", "a") as fh:
        fh.write(params.tag + "\n")
    return Image(np.asarray(img.data) + params.add, img.affine)


class Sleep(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sleep_s: float = Field(5.0, ge=0, le=60)


@tool("xtoy.sleepy", resources={**CHEAP, "timeout_s": 1.0})
def sleepy(img: Image, params: Sleep) -> Image:
    """Sleeps past its own default time limit (1 s, from its Resources)."""
    time.sleep(params.sleep_s)
    return img


@tool("xtoy.stubborn", resources=CHEAP)
def stubborn(img: Image, params: Sleep) -> Image:
    """Blocks SIGALRM while it sleeps, like C code that never returns to the interpreter."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(params.sleep_s)
    return img


TUMOUR_LABELS = {1: "necrotic_core", 2: "oedema", 4: "enhancing"}


@tool("xtoy.as_mask", resources=CHEAP, milestone="segmented")
def as_mask(img: Image) -> Mask:
    """The image's integer values as a tumour label map (BraTS 2021 label names)."""
    return Mask(np.rint(np.asarray(img.data)).astype(np.int16), img.affine, labels=dict(TUMOUR_LABELS))
