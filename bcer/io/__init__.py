"""Readers and writers of the file formats bcer knows (NIfTI, DICOM incl. SEG/SR, MetaImage/NRRD,
fastMRI and CMRxRecon HDF5/MAT, JSON/CSV): one door for every format, below tools, datasets and
engine. Imports only ``bcer.contracts`` and third-party libraries."""
from .nifti import atomic_write_bytes, read_nifti, write_nifti
from .sequence import SEQUENCE_READERS, load_sequence, sequence_header
from .serialize import artifact_from_dict, artifact_to_dict, json_bytes, to_jsonable, write_json, write_table_csv

__all__ = ["SEQUENCE_READERS", "atomic_write_bytes", "artifact_from_dict", "artifact_to_dict", "json_bytes",
           "load_sequence", "read_nifti", "sequence_header", "to_jsonable", "write_json", "write_nifti", "write_table_csv"]
