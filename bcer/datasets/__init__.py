"""Synthetic MRI phantoms with exact ground truth, and adapters for real dataset layouts."""
from .layouts import detect_layout, get_layout, layouts, read_dataset
from .phantom import Phantom

__all__ = ["Phantom", "detect_layout", "get_layout", "layouts", "read_dataset"]
