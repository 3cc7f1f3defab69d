"""Synthetic MRI phantoms with exact ground truth, and adapters for real dataset layouts."""
from . import cardiac_family, prostate_family  # noqa: F401  (register the non-base phantom families)
from .layouts import detect_layout, get_layout, layouts, read_dataset
from .phantom import Phantom

__all__ = ["Phantom", "detect_layout", "get_layout", "layouts", "read_dataset"]
