"""The one alias table for sequence names. Everything that names a sequence goes through it."""
from __future__ import annotations

import re

CANONICAL = ("T1", "T1c", "T2", "FLAIR", "T2w", "ADC", "DWI", "CINE", "KSPACE", "PD")

ALIASES: dict[str, str] = {
    "t1": "T1", "t1w": "T1", "t1_native": "T1", "t1n": "T1",  # t1n, t2f: BraTS 2023+
    "t1c": "T1c", "t1ce": "T1c", "t1gd": "T1c", "t1_gd": "T1c", "t1post": "T1c", "t1_contrast": "T1c",
    "t2": "T2",
    "flair": "FLAIR", "t2flair": "FLAIR", "t2_flair": "FLAIR", "t2f": "FLAIR",
    "t2w": "T2w", "ax_t2": "T2w", "t2_tse": "T2w",
    "adc": "ADC", "ax_diffusion_adc": "ADC",
    "dwi": "DWI", "highb": "DWI", "hbv": "DWI", "b1400": "DWI", "ax_diffusion_calc_bval": "DWI",
    "calc_bval": "DWI", "trace": "DWI",
    "cine": "CINE", "sa": "CINE", "sax": "CINE", "4d": "CINE", "cine_sax": "CINE",
    "kspace": "KSPACE", "raw": "KSPACE", "k_space": "KSPACE",
    "pd": "PD",
}


def canonical_sequence(name: str) -> str | None:
    """Canonical sequence name for ``name`` (case- and separator-insensitive), or None."""
    key = re.sub(r"[\s\-]+", "_", str(name).strip()).lower()
    if key in ALIASES:
        return ALIASES[key]
    for c in CANONICAL:
        if key == c.lower():
            return c
    return None
