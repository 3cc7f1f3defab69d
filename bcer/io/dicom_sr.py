"""DICOM SR out: measurements as a TID 1500 Measurement Report (highdicom ``Comprehensive3DSR``).

One measurement group per row: a row whose region names a segment of the case's SEG becomes a
volumetric ROI group (TID 1411) that references that segment and the source series; any
other row (a lesion, the cardiac function table, a classification) becomes a generic group
(TID 1501) tracked by its id. Concepts use SNOMED CT, DCM or LOINC codes where a standard
code exists (:data:`CONCEPTS`); the others are coded in the private scheme ``99BCER`` with
the column name as their meaning, so nothing is dropped and a reader can still find them.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
PRIVATE_SCHEME = "99BCER"
# column or attribute name -> (code value, scheme, meaning)
CONCEPTS: dict[str, tuple[str, str, str]] = {
    "volume_ml": ("118565006", "SCT", "Volume"),
    "max_diameter_mm": ("81827009", "SCT", "Diameter"),
    "size_mm": ("81827009", "SCT", "Diameter"),
    "adc": ("113041", "DCM", "Apparent Diffusion Coefficient"),
    "lv_ef_pct": ("10230-1", "LN", "Left ventricular Ejection fraction"),
}
# bcer unit -> UCUM code
UNITS = {"mL": "ml", "ml": "ml", "mm": "mm", "%": "%", "a.u.": "1", "um2/s": "um2/s", "m2": "m2",
         "mL/m2": "ml/m2", "frame": "{frame}", "category": "{category}", "mm2/s": "mm2/s", "s": "s"}

__all__ = ["CONCEPTS", "PRIVATE_SCHEME", "Group", "Item", "concept", "read_measurements", "write_sr"]


@dataclass
class Item:
    """One numeric measurement: the column name, its value and bcer's unit."""
    name: str
    value: float
    unit: str


@dataclass
class Group:
    """One measurement group: a tracking id, its items, and the SEG segment it measures (if any)."""
    tracking_id: str
    items: list[Item] = field(default_factory=list)
    segment: int | None = None
    seg: Any = None  # the SEG dataset that holds ``segment``
    finding: str | None = None  # e.g. "lesion": the finding type of the group
    qualitative: dict[str, str] = field(default_factory=dict)  # name -> category label


def concept(name: str) -> Any:
    """The coded concept of a column name (standard code, else ``99BCER``)."""
    from highdicom.sr import CodedConcept

    value, scheme, meaning = CONCEPTS.get(name, (name[:16], PRIVATE_SCHEME, name.replace("_", " ")))
    return CodedConcept(value=value, scheme_designator=scheme, meaning=meaning[:64])


def _unit(unit: str) -> Any:
    from highdicom.sr import CodedConcept

    code = UNITS.get(unit, unit or "1")
    return CodedConcept(value=code, scheme_designator="UCUM", meaning=code)


def _group(g: Group, sources: Sequence[Any], algorithm: Any) -> Any:
    import highdicom as hd
    from pydicom.sr.codedict import codes

    tracking = hd.sr.TrackingIdentifier(uid=hd.UID(), identifier=g.tracking_id[:64])
    measurements = [hd.sr.Measurement(name=concept(i.name), value=float(i.value), unit=_unit(i.unit),
                                      algorithm_id=algorithm) for i in g.items]
    qualitative = [hd.sr.QualitativeEvaluation(name=concept(k), value=concept(v)) for k, v in g.qualitative.items()]
    finding = codes.SCT.Lesion if g.finding == "lesion" else None
    seg = g.seg
    if g.segment is not None and seg is not None:
        ref = hd.sr.ReferencedSegment(
            sop_class_uid=seg.SOPClassUID, sop_instance_uid=seg.SOPInstanceUID, segment_number=g.segment,
            source_series=hd.sr.SourceSeriesForSegmentation(str(seg.ReferencedSeriesSequence[0].SeriesInstanceUID)))
        return hd.sr.VolumetricROIMeasurementsAndQualitativeEvaluations(
            tracking_identifier=tracking, referenced_segment=ref, measurements=measurements,
            qualitative_evaluations=qualitative or None, finding_type=finding, algorithm_id=algorithm)
    return hd.sr.MeasurementsAndQualitativeEvaluations(
        tracking_identifier=tracking, measurements=measurements or None,
        qualitative_evaluations=qualitative or None, finding_type=finding, algorithm_id=algorithm)


def write_sr(groups: Sequence[Group], sources: Sequence[Any], path: str | Path, *, version: str = "0",
             series_number: int = 901) -> Any:
    """Write a TID 1500 measurement report over ``sources`` and the SEGs its groups reference;
    returns it."""
    import highdicom as hd
    from pydicom.sr.codedict import codes

    algorithm = hd.sr.AlgorithmIdentification(name="bcer", version=version)
    context = hd.sr.ObservationContext(observer_device_context=hd.sr.ObserverContext(
        observer_type=codes.DCM.Device,
        observer_identifying_attributes=hd.sr.DeviceObserverIdentifyingAttributes(uid=hd.UID(), name="bcer")))
    report = hd.sr.MeasurementReport(
        observation_context=context, procedure_reported=_procedure(),
        imaging_measurements=[_group(g, sources, algorithm) for g in groups])
    segs = {g.seg.SOPInstanceUID: g.seg for g in groups if g.seg is not None}
    evidence = list(sources) + list(segs.values())
    sr = hd.sr.Comprehensive3DSR(evidence=evidence, content=report, series_instance_uid=hd.UID(),
                                 series_number=series_number, sop_instance_uid=hd.UID(), instance_number=1,
                                 manufacturer="bcer", series_description="bcer measurements")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sr.save_as(path)
    return sr


def _procedure() -> Any:
    from highdicom.sr import CodedConcept

    return CodedConcept(value="113091000", scheme_designator="SCT", meaning="Magnetic resonance imaging")


def read_measurements(path: str | Path) -> dict[str, dict[str, float]]:
    """Read an SR back through highdicom: ``{tracking id: {concept: value}}``, the concept named
    by its meaning (standard codes) or its code value (``99BCER``)."""
    import highdicom as hd

    report = hd.sr.srread(path).content
    groups = [*report.get_volumetric_roi_measurement_groups(), *report.get_image_measurement_groups()]
    out: dict[str, dict[str, float]] = {}
    for g in groups:
        out[g.tracking_identifier] = {
            (m.name.value if m.name.scheme_designator == PRIVATE_SCHEME else m.name.meaning): float(m.value)
            for m in g.get_measurements()}
    return out
