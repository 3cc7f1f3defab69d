"""Run outputs the page tests render: a small bench of real tasks, and a prostate cohort with a
rejected case, a failed case and a deleted deliverable (built once per session; Ray shared)."""
from __future__ import annotations

import gzip
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def bench_out(ray_local, tmp_path_factory) -> Path:
    """One small case each of five tasks whose pages show every overlay kind (masks, cine ED/ES,
    lesion boxes, recon vs zero-filled, registration)."""
    from bcer.bench import run_bench

    out = tmp_path_factory.mktemp("bench")
    run_bench(["prostate_report", "cardiac_report", "recon_cardiac", "register_prostate", "segment_brain"],
              n_cases=1, out=out, size="small", seed=3, max_in_flight=2)
    return out


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
