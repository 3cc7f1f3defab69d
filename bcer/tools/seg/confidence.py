"""Self-consistency of a segmentation, measured per case, and the ``low_confidence`` flag.

A segmentation can look plausible and still be wrong. Each ``seg.*`` tool measures how well
its answer agrees with a second, independent reading of the same case and puts the result in
its masks' ``meta["confidence"]`` (and ``meta["flags"]["low_confidence"]``, which the report
header and the case page show):

* ``seg.cardiac``: agreement between the two methods that exist, the network and the
  classical method (both already run for the default hybrid): Dice per structure (LV, MYO,
  RV) over every frame, score = the lowest. When the classical method stands alone (the
  network failed its checks or could not run) there is nothing to agree with: the score is
  None and the case is flagged. A bundle other than the shipped one may state its own
  threshold for this agreement (``bcer.low_confidence_threshold``).
* ``seg.prostate`` (network): test-time flip. The network also segments the left-right
  mirrored volume (the canonical grid's first axis); score = the lowest Dice of gland, PZ and
  TZ between the two answers. The classical fallback is flagged like cardiac's. A retrained
  network's bundle may state its own threshold (``bcer.low_confidence_threshold``); the
  shipped one's is below.
* ``seg.brain_tumor`` (classical): the method rerun with 1.5x its smoothing; score = the lowest
  Dice of WT, TC and ET (an ET absent in both counts as agreement).
* ``seg.brain_tumor`` (a bundle): test-time mirror. The network also segments the four
  contrasts mirrored along the first voxel axis; score = the lowest Dice of WT, TC and ET
  between the two answers. A threshold belongs to a model, so it is read from the bundle's
  ``configs/metadata.json`` (``bcer.low_confidence_threshold``, chosen on that model's own
  development data); a bundle that states none is flagged on every case, its score still shown.

``low_confidence`` is ``score < threshold`` (or no score). The thresholds below were chosen on
the randomised (development) phantom families before the held-out families were scored
(``benchmarks/confidence.py``, ``docs/trust.md``): each is the score that 95 % of the right
answers there exceed. They are numbers measured on bcer's own synthetic phantoms only.

``meta["confidence"]`` = ``{"score", "threshold", "low_confidence", "method", "parts"}``.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ...metrics import dice

# Chosen on the randomised (development) families only, before any held-out case was scored:
# the 5th percentile of the scores of the right answers there (benchmarks/confidence.py,
# docs/trust.md): cardiac 30 cines, prostate 80 and brain 60 volumes. Brain: chosen again for
# seg.brain_tumor 1.4 (bias correction), whose rerun agreement is higher (1.3: 0.816).
THRESHOLDS = {"seg.cardiac": 0.671, "seg.prostate": 0.919, "seg.brain_tumor": 0.889}
MIRROR_METHOD = "test-time mirror of the network along the first voxel axis (lowest Dice of WT, TC, ET)"
METHODS = {"seg.cardiac": "agreement of the network and the classical method (lowest Dice of LV, MYO, RV)",
           "seg.prostate": "test-time left-right flip of the network or ensemble (lowest Dice of gland, PZ, TZ)",
           "seg.brain_tumor": "classical method rerun at 1.5x smoothing (lowest Dice of WT, TC, ET)"}


def dice_by_label(a: np.ndarray, b: np.ndarray, groups: Mapping[str, tuple[int, ...]]) -> dict[str, float]:
    """Dice of ``a`` and ``b`` for each named group of label values."""
    return {name: float(dice(np.isin(a, vals), np.isin(b, vals))) for name, vals in groups.items()}


def confidence(tool: str, parts: dict[str, float] | None, reason: str = "", *, threshold: float | None = None,
               method: str | None = None) -> dict[str, Any]:
    """The ``meta["confidence"]`` record of one segmentation: ``parts`` are the agreement
    scores (None: no second reading could be made, then ``reason`` says why). ``threshold``
    alone replaces the tool's own (a bundle's, chosen on its development data); ``method``
    and ``threshold`` replace both when the second reading is another one (a bundle's
    mirror), and with ``method`` given and ``threshold`` None no threshold is known: flagged."""
    if method is None:
        method = METHODS[tool]
        threshold = THRESHOLDS[tool] if threshold is None else float(threshold)
    score = min(parts.values()) if parts else None
    low = score is None or threshold is None or score < threshold
    out = {"score": None if score is None else round(float(score), 4), "threshold": threshold,
           "low_confidence": bool(low), "method": method,
           "parts": {k: round(float(v), 4) for k, v in (parts or {}).items()}}
    if reason:
        out["reason"] = reason
    return out


def attach(meta: dict[str, Any], conf: dict[str, Any]) -> None:
    """Put ``conf`` in a mask's meta, with its flag for the report header and the case page."""
    meta["confidence"] = conf
    if conf["score"] is None:
        detail = f"no second reading to agree with ({conf.get('reason', '')})"
    elif conf["threshold"] is None:
        detail = f"self-consistency {conf['score']:.3f}, no threshold known ({conf.get('reason', '')}; {conf['method']})"
    else:
        detail = f"self-consistency {conf['score']:.3f} < threshold {conf['threshold']:.2f} ({conf['method']})"
    if not conf["low_confidence"]:
        detail = f"self-consistency {conf['score']:.3f} >= threshold {conf['threshold']:.2f} ({conf['method']})"
    meta.setdefault("flags", {})["low_confidence"] = {"flagged": conf["low_confidence"], "detail": detail,
                                                      "score": conf["score"], "threshold": conf["threshold"]}


__all__ = ["METHODS", "MIRROR_METHOD", "THRESHOLDS", "attach", "confidence", "dice_by_label"]
