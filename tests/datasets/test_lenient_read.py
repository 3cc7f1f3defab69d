"""A corrupt case in a cohort folder is kept as a Case with typed issues, not a failed read."""
from __future__ import annotations

import pytest

from bcer.contracts import ErrorCode, ToolError
from bcer.datasets import read_dataset
from bcer.datasets.synth import synth_cohort
from bcer.engine.driver import admit_case


@pytest.mark.parametrize("domain", ["brain", "cardiac"])
def test_truncated_file_becomes_case_issue_under_lenient_read(tmp_path, domain):
    cases = synth_cohort(domain, 3, tmp_path, seed=3, size="small")
    victim = sorted((tmp_path / cases[1].id).rglob("*.nii.gz"))[0]
    victim.write_bytes(victim.read_bytes()[:100])
    with pytest.raises(ToolError):
        read_dataset(tmp_path, strict=True)
    read = read_dataset(tmp_path)
    assert [c.id for c in read] == [c.id for c in cases]
    bad = [c for c in read if c.issues]
    assert [c.id for c in bad] == [cases[1].id]
    assert bad[0].issues[0]["code"] == "schema" and victim.name in bad[0].issues[0]["context"]["file"]
    with pytest.raises(ToolError) as e:
        admit_case(bad[0], None)  # no contract: issues still reject
    assert e.value.code is ErrorCode.schema and e.value.context["case"] == cases[1].id
