"""Cohort synthesis (deterministic, balanced) and header-only dataset inspection."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from bcer.contracts.errors import ErrorCode, ToolError
from bcer.datasets.generators import GENERATORS, get_generator
from bcer.datasets.synth import DEFAULT_LAYOUT, cohort_plan, inspect_dataset, synth_cohort
from bcer.io import load_sequence


def test_plan_is_deterministic_and_balanced():
    plan = cohort_plan("brain", 8, seed=3)
    assert plan == cohort_plan("brain", 8, seed=3)
    assert [p["case_id"] for p in plan] == [f"brain-s3-{i:03d}" for i in range(8)]
    combos = Counter((p["kwargs"]["grade"], p["kwargs"]["side"]) for p in plan)
    assert len(combos) == 4 and set(combos.values()) == {2}
    assert len({p["seed"] for p in plan}) == 8
    assert cohort_plan("brain", 8, seed=4)[0]["seed"] != plan[0]["seed"]
    fixed = cohort_plan("brain", 4, seed=3, grade="LGG", noise=0.02)
    assert {p["kwargs"]["grade"] for p in fixed} == {"LGG"}
    assert {p["kwargs"]["side"] for p in fixed} == {"left", "right"}
    assert all(p["kwargs"]["noise"] == 0.02 for p in fixed)
    groups = Counter(p["kwargs"]["group"] for p in cohort_plan("cardiac", 10, seed=1))
    assert set(groups.values()) == {2} and len(groups) == 5
    lesions = Counter(p["kwargs"]["n_lesions"] for p in cohort_plan("prostate", 6, seed=1))
    assert lesions == {0: 2, 1: 2, 2: 2}


@pytest.fixture(scope="module")
def brain_cohort(tmp_path_factory):
    root = tmp_path_factory.mktemp("synth_brain")
    return root, synth_cohort("brain", 4, root, seed=5)


def test_synth_brain_cohort_in_brats(brain_cohort):
    root, cases = brain_cohort
    assert DEFAULT_LAYOUT["brain"] == "brats"
    assert [c.id for c in cases] == [f"Brats18_brain-s5-{i:03d}" for i in range(4)]
    truths = [c.ground_truth["values"] for c in cases]
    assert Counter((t["grade"], t["side"]) for t in truths) == Counter(
        {("HGG", "left"): 1, ("HGG", "right"): 1, ("LGG", "left"): 1, ("LGG", "right"): 1})
    # the same seed gives the same data
    again = get_generator("brain")("brain-s5-000", cohort_plan("brain", 1, seed=5)[0]["seed"], "small",
                                   **cohort_plan("brain", 1, seed=5)[0]["kwargs"])
    assert np.array_equal(load_sequence(cases[0].sequences["T1"]).data, again.sequences["T1"].data)


def test_inspect_reports_headers_metadata_truth(brain_cohort):
    root, cases = brain_cohort
    rows = inspect_dataset(root)
    assert [r["case"] for r in rows] == [c.id for c in cases]
    for row, case in zip(rows, cases):
        assert row["layout"] == "brats" and row["domain"] == "brain"
        img = load_sequence(case.sequences["FLAIR"])
        seq = row["sequences"]["FLAIR"]
        assert tuple(seq["shape"]) == img.shape
        np.testing.assert_allclose(seq["spacing"], img.spacing, atol=1e-3)
        assert seq["orientation"] == img.orientation and seq["dtype"] == "float32"
        assert row["metadata"] == case.metadata
        gt = row["ground_truth"]
        assert "grade" in gt["values"] and "WT_ml" in gt["values"] and gt["labels"] == ["brain", "seg"]


def test_synth_into_bids_and_inspect(tmp_path):
    cases = synth_cohort("brain", 2, tmp_path, layout="bids", seed=1, noise=0.02)
    assert [c.id for c in cases] == ["sub-brains1000", "sub-brains1001"]
    rows = inspect_dataset(tmp_path, layout="bids")
    assert {tuple(r["sequences"]) for r in rows} == {tuple(cases[0].sequences)}
    assert all(r["ground_truth"]["references"] == ["FLAIR", "T1", "T1c", "T2"] for r in rows)


@pytest.mark.parametrize("domain", ["cardiac", "prostate"])
def test_other_domains_when_their_generators_exist(domain, tmp_path):
    try:
        get_generator(domain)
        from bcer.datasets.layouts import get_layout

        get_layout(DEFAULT_LAYOUT[domain])
    except ToolError:
        pytest.skip(f"{domain} generator or its layout is not available yet")
    cases = synth_cohort(domain, 2, tmp_path, seed=2)
    assert len(cases) == 2 and all(c.domain == domain for c in cases)
    assert len(inspect_dataset(tmp_path)) == 2


def test_errors_are_typed(tmp_path):
    with pytest.raises(ToolError) as e:
        synth_cohort("brian", 2, tmp_path)
    assert e.value.code == ErrorCode.value_range and "brain" in e.value.hint
    with pytest.raises(ToolError) as e:
        cohort_plan("brain", 0)
    assert e.value.code == ErrorCode.value_range
    with pytest.raises(ToolError) as e:
        synth_cohort("brain", 1, tmp_path, layout="bratz")
    assert e.value.code == ErrorCode.schema
    assert set(GENERATORS) == {"brain", "cardiac", "prostate"}
