"""Raw-data layouts are synthesised as multi-coil k-space with the fully sampled truth."""
from __future__ import annotations

import numpy as np
import pytest

from bcer.datasets import read_dataset
from bcer.datasets.synth import synth_cohort
from bcer.io import load_sequence


@pytest.mark.parametrize("layout,ndim", [("fastmri", 4), ("cmrx", 5)])
def test_kspace_layouts_synthesise_kspace_cases(tmp_path, layout, ndim):
    cases = synth_cohort("cardiac", 2, tmp_path, layout=layout, seed=1)
    back = read_dataset(tmp_path)
    assert [c.id for c in back] == [c.id for c in cases] and all(not c.issues for c in back)
    k = load_sequence(back[0].sequences["KSPACE"])
    assert k.data.ndim == ndim and k.n_coils == 8 and np.iscomplexobj(k.data)
    centre = np.flatnonzero(k.mask)
    assert k.mask.sum() >= 24 and 1.5 < k.acceleration < 4.01 and len(centre) == k.mask.sum()
    assert back[0].ground_truth and back[0].ground_truth.get("references")
