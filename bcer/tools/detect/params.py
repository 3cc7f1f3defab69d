"""The parameters of ``detect.prostate_lesions`` (their own module: the detector's steps in
``detect_*`` modules take them without importing the detector)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class LesionParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    adc_margin_sd: float = Field(4.0, ge=1.0, le=20.0,
                                 description="smoothed ADC must fall this many (smoothed) noise SDs below its zone's "
                                             "normal level")
    adc_contrast: float = Field(0.12, ge=0.0, le=0.9,
                                description="and at least this fraction below it (restricted diffusion is a relative "
                                            "drop; noise alone never makes a lesion)")
    adc_margin_min: float = Field(40.0, ge=0.0, le=1000.0,
                                  description="and at least this much (ADC units) below it")
    dwi_ratio: float = Field(1.0, ge=0.5, le=5.0,
                             description="smoothed high-b DWI must exceed this x its zone's median DWI (lesions are "
                                         "DWI-bright; excludes fat/bone/calcification a mask edge may touch)")
    grow_margin_sd: float = Field(2.0, ge=0.0, le=20.0,
                                  description="a lesion grows from its candidate voxels into connected gland voxels "
                                              "this many noise SDs (and adc_margin_min) below the reference "
                                              "(hysteresis; 0 = no growth)")
    edge_dwi_ratio: float = Field(2.0, ge=1.0, le=10.0,
                                  description="at the gland's edge (no solid gland around the voxel) a voxel is a "
                                              "candidate on its own ADC only when its DWI is at least this x its "
                                              "zone's median (fat at the capsule has a lesion's ADC, not its DWI)")
    smooth_mm: float = Field(1.0, ge=0.0, le=10.0,
                             description="Gaussian sigma (mm) of the within-zone smoothing of ADC and DWI before the "
                                         "thresholds (0 = none)")
    border_mm: float = Field(3.0, ge=0.0, le=20.0,
                             description="within this distance of the other zone a voxel's reference is the lower "
                                         "of the two zone levels (zone masks are uncertain at their border)")
    rim_mm: float = Field(3.0, ge=0.0, le=10.0,
                          description="also search this far outside the gland mask (a T2-dark lesion at the capsule "
                                      "is what a gland segmentation most often leaves out); there a voxel is a "
                                      "candidate only as at the gland's edge (edge_dwi_ratio) and its lesion must "
                                      "reach into the gland")
    min_volume_ml: float = Field(0.05, ge=0.0, le=50.0, description="smallest lesion kept (mL)")
    max_lesions: int = Field(5, ge=1, le=50, description="keep at most this many (largest volume first)")
    pz_reading: bool = Field(True, description="also read the PZ side of the border band against the PZ's own level "
                                               "and keep what it finds there as PZ lesions (step 4)")
    blackout_adc_ratio: float = Field(0.4, ge=0.0, le=1.0,
                                      description="a lesion whose median ADC is below this x its reference must have "
                                                  "median DWI at least edge_dwi_ratio x its zone's normal tissue "
                                                  "(less at a low b-value, see blackout_s0_ratio): restricted "
                                                  "diffusion that marked is markedly DWI-bright; low ADC without it "
                                                  "is fat or low-signal tissue (step 5)")
    blackout_s0_ratio: float = Field(0.5, ge=0.0, le=1.0,
                                     description="with the DWI's b-value known, the DWI asked of such a lesion is at "
                                                 "most this x what its ADC drop gives tissue of its zone's b=0 signal "
                                                 "(exp(b x drop)): at b 800 a lesion at 0.4x the zone's ADC is only "
                                                 "about 2x brighter, less for a T2-dark one")
    linear_length_vox: float = Field(3.0, ge=1.0, le=50.0,
                                     description="a lesion one ADC voxel wide in-plane in every slice, at least this "
                                                 "many in-plane voxels long and lying along the gland's edge must have "
                                                 "median DWI at least edge_dwi_ratio x its zone's normal tissue: "
                                                 "PI-RADS v2.1 scores linear findings 2, and a mask one voxel too "
                                                 "large takes in the capsule as such a sheet (step 5)")
    linear_depth_vox: float = Field(2.0, ge=0.0, le=10.0,
                                    description="how deep (in-plane ADC voxels) inside the gland's edge a linear lesion "
                                                "is read as lying along it")
    periprostatic_rules: bool = Field(True, description="step 5 on (False: 1.4's rule, for comparison)")
    t2_border_band: bool = Field(True, description="on the T2w outline, voxels within border_mm of the other zone are "
                                                   "dark only below the darker zone's cut (False: 1.5's outline)")
    t2_split: bool = Field(True, description="one lesion per separate T2-dark part of a T2w outline (two lesions the "
                                             "diffusion grid joined; False: 1.6's single finding)")


__all__ = ["LesionParams"]
