"""Segmentation tools (``seg.*``): a local MONAI bundle when given, else classical methods.

Modules: ``brain_tumor`` (BraTS labels), ``prostate`` (gland + zones), ``cardiac`` (RV/MYO/LV per
cine frame); ``bundle`` (loading and running local MONAI bundles, cached per process) with
``bundle_config`` (model-zoo configs read by ``monai.bundle.ConfigParser``) and
``bundle_labels`` (input channels and output classes matched by name).
"""
