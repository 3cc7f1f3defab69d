"""Run outputs the page tests render: a small bench of real tasks, and a prostate cohort with a
rejected case, a failed case and a deleted deliverable (built once per session; Ray shared)."""
from __future__ import annotations

import gzip
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def bench_out(bench_all) -> Path:
    """The shared bench (one small case of every task): its pages show every overlay kind (masks,
    cine ED/ES, lesion boxes, recon vs zero-filled, registration)."""
    return bench_all[1]


@pytest.fixture(scope="session")
def cohort_out(ray_local, tmp_path_factory) -> Path:
    """A prostate_report cohort: case 0 fine (then its findings file deleted), case 1 without its
    ADC (rejected), case 2 with a truncated T2w (failed)."""
    from bcer.api import Study, load_cases
    from bcer.datasets.synth import synth_cohort

    data = tmp_path_factory.mktemp("prostate_data")
    synth_cohort("prostate", 3, data, layout="bids", seed=11, size="small", n_lesions=1)
    cases = load_cases(data)
    adc = Path(cases[1].sequences["ADC"].path)
    adc.unlink()
    t2w = Path(cases[2].sequences["T2w"].path)
    t2w.write_bytes(gzip.compress(b"not a nifti at all"))
    out = tmp_path_factory.mktemp("cohort")
    result = Study(data, task="prostate_report", out=out, max_in_flight=2).run()
    ok = next(r for r in result.rows if r["status"] == "succeeded")
    (out / ok["case"] / "lesions.json").unlink()  # a deliverable that went missing after the run
    return out
