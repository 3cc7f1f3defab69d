"""Names in and out of a MONAI bundle: input channels to sequences, output classes to tool labels.

A bundle says what its channels are only by name: ``network_data_format.inputs.image.channel_def``
(``{"0": "T1c", "1": "T1", ...}``) and ``outputs.pred.channel_def`` (``{"0": "Tumor core", ...}``
or ``{"1": "central gland", "2": "peripheral zone"}``). bcer maps both by name:

* input names go through the one alias table (:func:`bcer.contracts.sequences.canonical_sequence`);
  T2 and T2w are one contrast under two conventions (brain vs body), so either stands for
  the other when a tool has only one of them;
* output names are matched against a tool's label vocabulary (:data:`BRATS_TARGETS`,
  :data:`PROSTATE_ZONE_TARGETS`, :data:`CARDIAC_TARGETS`). A vocabulary is in priority
  order: a voxel in several regions (BraTS TC inside WT) takes the first target any of its
  regions names, which is the BraTS rule ET > TC > WT.

What value the bundle's own post-processing writes for which regions is found by a probe
(:func:`probe_values`): the value-changing post-transforms (activation, threshold, argmax,
the bundle's label lambda) are run on a tiny tensor holding every combination of "channel
on/off" logits, and each output value is traced back to the fewest channels that produce it.
"""
from __future__ import annotations

import itertools
import logging
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from ...contracts.errors import ErrorCode, ToolError
from ...contracts.sequences import canonical_sequence

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LabelTarget:
    """One label of a tool's output and the class names that mean it."""

    value: int
    name: str
    aliases: frozenset[str]


def _target(value: int, name: str, *aliases: str) -> LabelTarget:
    return LabelTarget(value, name, frozenset(norm_name(a) for a in (name, *aliases)))


def norm_name(name: Any) -> str:
    """Lower case, one spelling (tumour/tumor, oedema/edema), words split on anything else."""
    s = str(name).lower().replace("tumour", "tumor").replace("oedema", "edema")
    return " ".join(re.findall(r"[a-z0-9]+", s))


BACKGROUND = frozenset(norm_name(n) for n in ("background", "bg", "other", "none", "everything else"))

# Priority order matters (see the module docstring): ET before TC before WT.
BRATS_TARGETS: tuple[LabelTarget, ...] = (
    _target(4, "enhancing", "enhancing tumor", "et", "enhancing tumour", "gd enhancing tumor"),
    _target(1, "necrotic_core", "tumor core", "tc", "necrotic core", "necrosis", "necrotic",
            "non enhancing tumor", "non enhancing tumor core", "ncr", "net", "ncr net",
            "necrotic and non enhancing tumor core"),
    _target(2, "oedema", "whole tumor", "wt", "edema", "peritumoral edema", "ed", "snfh"),
)
PROSTATE_ZONE_TARGETS: tuple[LabelTarget, ...] = (
    _target(1, "PZ", "peripheral zone", "peripheral"),
    _target(2, "TZ", "transition zone", "central gland", "cg", "transition", "tz cz", "central zone"),
)
CARDIAC_TARGETS: tuple[LabelTarget, ...] = (
    _target(3, "LV", "left ventricle", "lv cavity", "lv blood pool", "left ventricular cavity", "lvc"),
    _target(2, "MYO", "myocardium", "lv myocardium", "left ventricular myocardium", "lvm"),
    _target(1, "RV", "right ventricle", "rv cavity", "right ventricular cavity", "rvc"),
)

_EQUIVALENT = {"T2": "T2w", "T2w": "T2"}


@dataclass(frozen=True)
class Channel:
    """One input a tool offers a bundle: the canonical sequence, the tool port (for errors)
    and the data (an array, a zero-argument function computing it, or None when absent)."""

    sequence: str
    port: str
    data: np.ndarray | Callable[[], np.ndarray] | None

    def array(self) -> np.ndarray:
        d = self.data() if callable(self.data) else self.data
        return np.asarray(d, dtype=np.float32)


def order_channels(names: Mapping[int, str], n_channels: int, offered: Sequence[Channel],
                   bundle: str) -> list[Channel]:
    """The tool's channels in the order the bundle's ``channel_def`` names them.

    Names that are all sequences pick by name (T2 and T2w stand in for each other); names
    that are none (``"image"``) take the tool's own order. A bundle whose names are partly
    sequences, or that needs a sequence the tool lacks, is a typed error.

    Raises:
        ToolError: ``input_missing`` naming the channel and the tool port that must feed it;
            ``schema`` for names that mix sequences and other words.
    """
    listed = [names.get(i) for i in range(n_channels)]
    canon = [canonical_sequence(n) if n is not None else None for n in listed]
    if not any(canon):  # generic names ("image") or none: the tool's order
        chosen = list(offered[:n_channels])
        if len(chosen) < n_channels:
            raise ToolError(ErrorCode.shape, f"bundle {bundle} takes {n_channels} input channels; this tool "
                            f"offers {len(offered)} ({[c.sequence for c in offered]})", arg="bundle_dir")
        for i, ch in enumerate(chosen):
            if ch.data is None:
                raise ToolError(ErrorCode.input_missing, f"bundle {bundle} takes {n_channels} input channels; "
                                f"channel {i} is the tool's {ch.port!r} input, which is not connected",
                                arg=ch.port)
        return chosen
    if not all(canon):
        bad = [n for n, c in zip(listed, canon) if not c]
        raise ToolError(ErrorCode.schema, f"bundle {bundle}: input channel names {bad} are not sequences "
                        f"(others are: {[c for c in canon if c]})",
                        hint="name every channel in metadata.json channel_def by its sequence", arg="bundle_dir")
    by_seq = {c.sequence: c for c in offered}
    out = []
    for i, seq in enumerate(canon):
        ch = by_seq.get(seq) or by_seq.get(_EQUIVALENT.get(seq, ""))
        if ch is None:
            raise ToolError(ErrorCode.input_missing, f"bundle {bundle} needs {listed[i]!r} ({seq}) as input "
                            f"channel {i}; this tool offers {[c.sequence for c in offered]}", arg="bundle_dir")
        if ch.data is None:
            raise ToolError(ErrorCode.input_missing, f"bundle {bundle} needs {seq} as input channel {i}: "
                            f"connect the tool's {ch.port!r} input", arg=ch.port)
        out.append(ch)
    return out


def target_for(names: Iterable[str], targets: Sequence[LabelTarget]) -> int | None:
    """The tool label a set of bundle class names means: 0 for background/nothing, None when
    no name is known."""
    normed = {norm_name(n) for n in names}
    if not normed or normed <= BACKGROUND:
        return 0
    for t in targets:
        if normed & t.aliases:
            return t.value
    return None


def probe_values(value_steps: Callable[[dict], dict], n_channels: int) -> dict[int, tuple[int, ...]]:
    """{output value: the fewest channels whose "on" logits make the post-processing write it}.

    Every subset of channels (up to 6 channels; beyond, the empty set and each single
    channel) becomes one probe voxel with logits +8 for its channels and -8 for the others.
    A value written by some non-empty subset is traced to the smallest such subset (an
    argmax writes 0 for "nothing on" and for "channel 0 on": channel 0 decides); the empty
    set only names a value no channel produces (BraTS "no region" = 0).
    """
    import torch
    from monai.data import MetaTensor

    if n_channels <= 6:
        subsets = [s for k in range(n_channels + 1) for s in itertools.combinations(range(n_channels), k)]
    else:
        subsets = [()] + [(i,) for i in range(n_channels)]
    logits = torch.full((n_channels, len(subsets), 1, 1), -8.0)
    for j, s in enumerate(subsets):
        for i in s:
            logits[i, j] = 8.0
    out = value_steps({"pred": MetaTensor(logits)})["pred"]
    out = np.asarray(out.detach().cpu().numpy() if hasattr(out, "detach") else out)
    if out.shape[0] != 1:
        return {}  # multi-channel output: channels keep their names, no value table needed
    table: dict[int, tuple[int, ...]] = {}
    for j, s in enumerate(subsets):
        v = int(round(float(out[0, j, 0, 0])))
        old = table.get(v)
        if old is None or (len(old) == 0 and s) or (s and len(s) < len(old)):
            table[v] = s
    return table


def value_map(table: Mapping[int, tuple[int, ...]], out_names: Mapping[int, str],
              targets: Sequence[LabelTarget], bundle: str) -> dict[int, int]:
    """{bundle output value: tool label value} from a probe table and the output class names.

    Raises:
        ToolError: ``schema`` naming a bundle class that means none of the tool's labels.
    """
    names = {t.name for t in targets}
    mapping = {}
    for v, subset in table.items():
        classes = [out_names.get(i, f"channel {i}") for i in subset]
        tool_value = target_for(classes, targets)
        if tool_value is None:
            raise ToolError(ErrorCode.schema, f"bundle {bundle}: output class {classes} (value {v}) means none "
                            f"of this tool's labels {sorted(names)}",
                            hint="name the classes in metadata.json outputs.pred.channel_def, or map values "
                            "with metadata.json bcer.label_map", arg="bundle_dir")
        mapping[v] = tool_value
    return mapping


def channels_to_labels(pred: np.ndarray, out_names: Mapping[int, str], targets: Sequence[LabelTarget],
                       bundle: str) -> np.ndarray:
    """Labels from a multi-channel binary output (one-hot, or overlapping regions such as
    TC/WT/ET): lowest-priority targets are painted first, so higher ones win."""
    labels = np.zeros(pred.shape[1:], np.int16)
    per_channel = {}
    for i in range(pred.shape[0]):
        value = target_for([out_names.get(i, f"channel {i}")], targets)
        if value is None:
            raise ToolError(ErrorCode.schema, f"bundle {bundle}: output channel {i} "
                            f"({out_names.get(i, 'unnamed')!r}) means none of this tool's labels "
                            f"{[t.name for t in targets]}", arg="bundle_dir")
        per_channel[i] = value
    for t in reversed(targets):
        for i, value in per_channel.items():
            if value == t.value:
                labels[pred[i] > 0.5] = t.value
    return labels


__all__ = ["BACKGROUND", "BRATS_TARGETS", "CARDIAC_TARGETS", "PROSTATE_ZONE_TARGETS", "Channel",
           "LabelTarget", "channels_to_labels", "norm_name", "order_channels", "probe_values",
           "target_for", "value_map"]
