"""Sandbox: a corpus of hostile paths is rejected with code ``sandbox`` naming the path; paths
inside the roots resolve to absolute paths there."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import BaseModel

from bcer.contracts.errors import ErrorCode, ToolError
from bcer.engine.sandbox import Sandbox


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    """in/ (with files and symlinks), out/, and a secret outside both."""
    inp, out, outside = tmp_path / "in", tmp_path / "out", tmp_path / "outside"
    (inp / "sub").mkdir(parents=True)
    out.mkdir()
    outside.mkdir()
    (inp / "t1.nii.gz").write_bytes(b"x")
    (inp / "sub" / "t2.nii.gz").write_bytes(b"x")
    (outside / "secret.txt").write_text("s")
    (tmp_path / "in_evil").mkdir()
    (tmp_path / "in_evil" / "f.nii.gz").write_bytes(b"x")
    os.symlink(outside / "secret.txt", inp / "escape.nii.gz")  # file symlink out of the root
    os.symlink(outside, inp / "linkdir")  # directory symlink out of the root
    os.symlink(inp / "t1.nii.gz", inp / "alias.nii.gz")  # symlink that stays inside: fine
    os.symlink(inp / "loop_b", inp / "loop_a")
    os.symlink(inp / "loop_a", inp / "loop_b")
    os.symlink(outside, out / "exfil")  # a symlink planted in the output folder
    return {"root": tmp_path, "in": inp, "out": out, "outside": outside}


@pytest.fixture
def box(tree: dict[str, Path]) -> Sandbox:
    return Sandbox(tree["in"], tree["out"])


def hostile_reads(tree: dict[str, Path]) -> list[object]:
    return [
        "../outside/secret.txt", "sub/../../outside/secret.txt", "sub/..", "./../in/t1.nii.gz",
        "/etc/passwd", str(tree["outside"] / "secret.txt"), str(tree["root"] / "in_evil" / "f.nii.gz"),
        "escape.nii.gz", "linkdir/secret.txt", "loop_a",
        "file:///etc/passwd", "http://evil.example/x.nii.gz", "s3://bucket/key.nii.gz", "file:/etc/passwd",
        "t1\x00.nii.gz", "~/.ssh/id_rsa", "~root/.bashrc",
        "@runtime.output_dir", "@seq.T1c", "@node.seg.mask",
        "", "   ", "..\\..\\outside\\secret.txt", "/proc/self/environ",
        42, None, 3.5, b"t1.nii.gz", ["t1.nii.gz"], Path("../outside/secret.txt"),
    ]


def test_hostile_read_corpus_rejected(box: Sandbox, tree: dict[str, Path]) -> None:
    corpus = hostile_reads(tree)
    assert len(corpus) >= 15
    for path in corpus:
        with pytest.raises(ToolError) as e:
            box.check_read(path)
        assert e.value.code is ErrorCode.sandbox, path
        assert e.value.context["path"] == repr(os.fspath(path) if isinstance(path, Path) else path)


@pytest.mark.parametrize("path", ["../in/t1.nii.gz", "exfil/secret.txt", "/tmp/x.nii.gz", "INPUT",
                                  "@runtime.output_dir/seg.nii.gz", "~/seg.nii.gz"])
def test_hostile_writes_rejected(box: Sandbox, tree: dict[str, Path], path: str) -> None:
    # "INPUT": an absolute path into the input root, readable but never writable
    with pytest.raises(ToolError) as e:
        box.check_write(str(tree["in"] / "t1.nii.gz") if path == "INPUT" else path)
    assert e.value.code is ErrorCode.sandbox


def test_inside_paths_resolve(box: Sandbox, tree: dict[str, Path]) -> None:
    inp, out = tree["in"].resolve(), tree["out"].resolve()
    assert box.check_read("t1.nii.gz") == inp / "t1.nii.gz"
    assert box.check_read("sub/t2.nii.gz") == inp / "sub" / "t2.nii.gz"
    assert box.check_read(str(inp / "sub" / "t2.nii.gz")) == inp / "sub" / "t2.nii.gz"
    assert box.check_read(Path("alias.nii.gz")) == inp / "t1.nii.gz"  # symlink inside: its target
    assert box.check_read(".") == inp
    assert box.check_read(str(out / "seg.nii.gz")) == out / "seg.nii.gz"  # own outputs are readable
    assert box.check_write("new/dir/seg.nii.gz") == out / "new" / "dir" / "seg.nii.gz"  # need not exist
    assert box.check_write(str(out)) == out


class Params(BaseModel):
    model_config = {"extra": "forbid"}
    atlas: Path | None = None  # a path by annotation, whatever its name
    out_dir: str = "."
    mask_file: str = ""
    file_format: str = "nifti"
    n_files: int = 2
    reference_paths: list[str] = []


def test_check_args_by_name_and_annotation(box: Sandbox, tree: dict[str, Path]) -> None:
    inp, out = tree["in"].resolve(), tree["out"].resolve()
    got = box.check_args({"atlas": "sub/t2.nii.gz", "out_dir": "seg", "mask_file": "t1.nii.gz",
                          "file_format": "nifti", "n_files": 2, "reference_paths": ["t1.nii.gz", "alias.nii.gz"],
                          "threshold": 0.5}, Params)
    assert got == {"atlas": str(inp / "sub" / "t2.nii.gz"), "out_dir": str(out / "seg"),
                   "mask_file": str(inp / "t1.nii.gz"), "file_format": "nifti", "n_files": 2,
                   "reference_paths": [str(inp / "t1.nii.gz"), str(inp / "t1.nii.gz")], "threshold": 0.5}


@pytest.mark.parametrize("params, arg", [
    ({"atlas": "../outside/secret.txt"}, "atlas"),
    ({"atlas": 7}, "atlas"),  # annotated Path: any non-path value is rejected
    ({"out_dir": "../in"}, "out_dir"),  # write path into the input root
    ({"out_dir": "@runtime.output_dir"}, "out_dir"),  # token left unresolved
    ({"mask_file": "https://x/y.nii.gz"}, "mask_file"),
    ({"reference_paths": ["t1.nii.gz", "/etc/shadow"]}, "reference_paths"),
])
def test_check_args_rejects(box: Sandbox, params: dict, arg: str) -> None:
    with pytest.raises(ToolError) as e:
        box.check_args(params, Params)
    assert e.value.code is ErrorCode.sandbox and e.value.context["arg"] == arg


def test_read_roots_are_read_only(tree: dict[str, Path]) -> None:
    box = Sandbox(tree["in"], tree["out"], read_roots=[tree["outside"]])
    secret = tree["outside"].resolve() / "secret.txt"
    assert box.check_args({"bundle_dir": str(tree["outside"]), "mask_file": ""}) == {
        "bundle_dir": str(tree["outside"].resolve()), "mask_file": ""}
    assert box.check_read("linkdir/secret.txt") == secret  # the symlink now lands in a read root
    with pytest.raises(ToolError) as e:
        box.check_write(str(secret))
    assert e.value.code is ErrorCode.sandbox


def test_check_args_without_model_uses_names(box: Sandbox) -> None:
    with pytest.raises(ToolError) as e:
        box.check_args({"save_path": "/etc/cron.d/x"})
    assert e.value.code is ErrorCode.sandbox and e.value.context["arg"] == "save_path"
    assert box.check_args({"direction": "../x", "profile": "/etc"}) == {"direction": "../x", "profile": "/etc"}
