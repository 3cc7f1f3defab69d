"""DICOM SR groups of a cardiac case (no Ray): the function table's LV/RV volumes and EF go into
the TID 1500 report with their values; LVEF under its LOINC code, the rest in ``99BCER``."""
from __future__ import annotations

import numpy as np
import pytest
from pydicom.data import get_testdata_file

from bcer.contracts import Case
from bcer.engine.derivatives import Finished
from bcer.engine.dicom_out import measurement_groups
from bcer.io.dicom_seg import read_source_series
from bcer.io.dicom_sr import PRIVATE_SCHEME, read_measurements, write_sr

FUNCTION = {"kind": "table", "name": "cardiac_function",
            "units": {"lv_edv_ml": "mL", "lv_esv_ml": "mL", "lv_ef_pct": "%", "rv_edv_ml": "mL", "rv_esv_ml": "mL",
                      "rv_ef_pct": "%"},
            "rows": [{"lv_edv_ml": 151.5, "lv_esv_ml": 61.0, "lv_ef_pct": 59.7, "rv_edv_ml": 160.25,
                      "rv_esv_ml": 75.5, "rv_ef_pct": 52.9, "ed_frame": 0, "flag": True, "lv_ef_min_pct": np.nan}]}
GROUP = {"kind": "classification", "label": "NOR", "scores": {"NOR": 0.8}}


def test_cardiac_function_goes_into_the_sr_with_its_values(tmp_path):
    done = Finished(case=Case(id="cine01", root=str(tmp_path)), folder=tmp_path,
                    docs={"function": FUNCTION, "group": GROUP})
    groups = measurement_groups(done, segments={})
    assert [g.tracking_id for g in groups] == ["function.0", "group"]
    # only columns with units, never a flag or a NaN
    assert [i.name for i in groups[0].items] == ["lv_edv_ml", "lv_esv_ml", "lv_ef_pct", "rv_edv_ml", "rv_esv_ml",
                                                 "rv_ef_pct"]
    assert groups[1].qualitative == {"group": "NOR"} and not groups[1].items
    sources = read_source_series(get_testdata_file("MR_small.dcm"))
    write_sr(groups, sources, tmp_path / "sr.dcm")
    values = read_measurements(tmp_path / "sr.dcm")["function.0"]
    assert values["Left ventricular Ejection fraction"] == pytest.approx(59.7)
    assert values["rv_edv_ml"] == pytest.approx(160.25) and values["lv_esv_ml"] == pytest.approx(61.0)
    import highdicom as hd

    sr = hd.sr.srread(tmp_path / "sr.dcm")
    (group,) = sr.content.get_image_measurement_groups(tracking_uid=None)[:1]
    codes = {m.name.meaning: (m.name.value, m.name.scheme_designator, m.unit.value) for m in group.get_measurements()}
    assert codes["Left ventricular Ejection fraction"] == ("10230-1", "LN", "%")
    assert codes["rv edv ml"] == ("rv_edv_ml", PRIVATE_SCHEME, "ml")
