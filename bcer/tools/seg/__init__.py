"""Segmentation tools (``seg.*``): a local MONAI bundle when given, else classical methods.

Modules: ``brain_tumor`` (BraTS labels), ``prostate`` (gland + zones), ``cardiac`` (RV/MYO/LV per
cine frame) and ``bundle`` (loading and running local MONAI bundles, cached per process).
"""
