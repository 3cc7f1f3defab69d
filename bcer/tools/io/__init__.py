"""Reading sequences and writing artifacts: one door for every file format bcer knows."""
from .nifti import atomic_write_bytes, read_nifti, write_nifti
from .serialize import artifact_from_dict, artifact_to_dict, to_jsonable, write_json, write_table_csv

__all__ = ["atomic_write_bytes", "artifact_from_dict", "artifact_to_dict", "read_nifti",
           "to_jsonable", "write_json", "write_nifti", "write_table_csv"]

import importlib
from typing import Any

from ...contracts.case import SequenceRef
from ...contracts.errors import ErrorCode, ToolError

# format -> module of bcer.tools.io that defines ``read_sequence(ref: SequenceRef)``
SEQUENCE_READERS = {
    "nifti": "nifti",
    "nifti_frames": "nifti",
    "dicom": "dicom",
    "itk": "itk",  # .mha / .nrrd through SimpleITK
    "fastmri_h5": "fastmri",
    "cmrx_mat": "cmrx",
}


def load_sequence(ref: SequenceRef) -> Any:
    """Load the artifact a SequenceRef points at (the lazy half of a dataset adapter)."""
    mod = SEQUENCE_READERS.get(ref.format)
    if mod is None:
        raise ToolError(ErrorCode.schema, f"unknown sequence format {ref.format!r}",
                        hint=f"valid: {sorted(SEQUENCE_READERS)}", file=ref.path)
    return importlib.import_module(f"{__name__}.{mod}").read_sequence(ref)


__all__ += ["SEQUENCE_READERS", "load_sequence"]
