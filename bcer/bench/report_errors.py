"""An injected-error corpus for the R4 Reflector and Repairer.

Each corrupted report is a clean template draft of a bench case with exactly ONE error of a
known type, at a known place (section and sentence, or entity), with the true value and the
injected one. Variants per type:

- laterality: a side word of a lesion or tumour sentence swapped; cardiac: a chamber word
  that governs sided numbers, or an affirmed chamber finding, moved to the other chamber.
- negation: a finding's polarity flipped ("is dilated" <-> "is not dilated", "there is a
  focal lesion" -> "there is no focal lesion", "reduced" <-> "preserved", ...).
- unsupported: a sentence added that no evidence backs: a claim about something never
  measured, a number without a link, a link to evidence that does not exist, a lesion that
  does not exist.
- contradiction: a linked number changed by 20-60 %, or the category/label changed.
- missing: a sentence deleted that is the only one stating some required facts, or the label.
- localization (prostate cases with lesions only; brain and cardiac reports have no zones,
  slices or boxes): a zone swapped, a slice number shifted, or a lesion box moved by its own
  width (IoU < 0.5).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np

from ..agents.r4.critic import concept_mentions
from ..tools.report.evidence import Evidence
from ..tools.report.lexicon import CHAMBER, LINKED_NUMBER, SIDE, ZONE, ZONE_CODES, ZONE_WORDS, swap_side
from ..tools.report.prose import _ACDC_TEXT, Box, Draft, value_text

TYPES = ("laterality", "negation", "unsupported", "contradiction", "missing", "localization")


@dataclass
class Injected:
    type: str
    variant: str
    section: str
    sentence: int = -1
    entity: str = ""
    true_value: Any = None
    injected_value: Any = None
    removed_ids: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _sentences(d: Draft) -> list[tuple[str, int, str]]:
    return d.sentences()


def _replace(d: Draft, section: str, idx: int, a: int, b: int, text: str) -> Draft:
    new = d.model_copy(deep=True)
    s = getattr(new, section)
    s[idx] = s[idx][:a] + text + s[idx][b:]
    return new


# ---- laterality -------------------------------------------------------------------------------
def _laterality(d: Draft, ev: Evidence) -> list[tuple[Draft, Injected]]:
    out = []
    for section, idx, s in _sentences(d):
        if ev.domain == "cardiac":
            sided = [m for m in LINKED_NUMBER.finditer(s) if ev.facts.get(m.group(3)) and ev.facts[m.group(3)].side]
            affirmed = [(k, p) for k, p, *_ in concept_mentions(s, "cardiac") if p and ev.concepts.get(k)
                        and ev.concepts[k].present and k.split()[0] in ("LV", "RV")]
            m = CHAMBER.search(s)
            if m and (sided and m.start() < sided[0].start() or affirmed):
                word = m.group(0)
                out.append((_replace(d, section, idx, *m.span(), swap_side(word)),
                            Injected("laterality", "chamber", section, idx, "chamber", word, swap_side(word))))
            continue
        m = SIDE.search(s)
        if m is None:
            continue
        if ev.domain == "prostate" and "lesion_" not in s:
            continue
        word = m.group(0)
        out.append((_replace(d, section, idx, *m.span(), swap_side(word)),
                    Injected("laterality", "side", section, idx, "", word, swap_side(word))))
    return out


# ---- negation ---------------------------------------------------------------------------------
_FLIPS: list[tuple[str, str]] = [
    (r"^There is no (?!enhancing component above)", "There is "), (r" is not (dilated)", r" is \1"),
    (r" is (dilated)", r" is not \1"), (r"^No suspicious focal lesion is seen", "A suspicious focal lesion is seen"),
    (r"^No enhancing component is seen", "An enhancing component is seen"),
    (r"There is reduced", "There is preserved"), (r"There is preserved", "There is reduced"),
    (r"^The enhancing component measures ", "There is no enhancing component; it measures "),
    (r"^A necrotic core of (.*) is present, ", r"There is no necrotic core; it measures \1, "),
    (r"^Surrounding oedema measures ", "There is no surrounding oedema; it measures "),
    (r"there is a focal lesion", "there is no focal lesion"),
    (r"^The enhancing component of (.*) is at or above", r"There is no enhancing component of \1 at or above"),
    (r"^There is no enhancing component above", "There is an enhancing component above"),
    (r"^There is (left ventricular hypertrophy|regional wall motion abnormality)", r"There is no \1"),
]


def _negation(d: Draft, ev: Evidence) -> list[tuple[Draft, Injected]]:
    out = []
    for section, idx, s in _sentences(d):
        before = {(k, p) for k, p, *_ in concept_mentions(s, ev.domain)}
        if not before:
            continue
        for pat, rep in _FLIPS:
            t = re.sub(pat, rep, s, count=1)
            if t == s:
                continue
            after = {(k, p) for k, p, *_ in concept_mentions(t, ev.domain)}
            flipped = [k for k, p in before if (k, not p) in after and ev.concepts.get(k)]
            if flipped:
                new = d.model_copy(deep=True)
                getattr(new, section)[idx] = t
                out.append((new, Injected("negation", pat, section, idx, flipped[0], s, t)))
                break
    return out


# ---- unsupported ------------------------------------------------------------------------------
_CLAIMS = {"prostate": ["The seminal vesicles are unremarkable.", "There is no extraprostatic extension."],
           "brain": ["There is no midline shift.", "The basal cisterns are patent."],
           "cardiac": ["There is no pericardial effusion.", "The aortic root is unremarkable."]}
_UNLINKED = {"prostate": "The gland also measures {x} mm in length.", "brain": "The tumour abuts the ventricle over {x} mm.",
             "cardiac": "The left atrium measures {x} mm."}


def _unsupported(d: Draft, ev: Evidence, rng: np.random.Generator) -> list[tuple[Draft, Injected]]:
    node = next(iter(ev.facts.values())).node if ev.facts else "node"
    options = [("claim", c) for c in _CLAIMS.get(ev.domain, [])]
    options.append(("unlinked_number", _UNLINKED.get(ev.domain, "It measures {x} mm.").format(x=f"{rng.uniform(8, 60):.1f}")))
    options.append(("dangling_link", f"The study also shows a {rng.uniform(2, 9):.1f} mm `[{node}.features.rim_mm]` rim."))
    if ev.lesions():
        options.append(("unknown_lesion", "A further focal lesion (`lesion_9`) is seen in the left transition zone."))
    out = []
    for variant, sentence in options:
        new = d.model_copy(deep=True)
        pos = int(rng.integers(0, len(new.findings) + 1))
        new.findings.insert(pos, sentence)
        out.append((new, Injected("unsupported", variant, "findings", pos, "", None, sentence)))
    return out


# ---- contradiction ----------------------------------------------------------------------------
def _contradiction(d: Draft, ev: Evidence, rng: np.random.Generator) -> list[tuple[Draft, Injected]]:
    out = []
    numbers = [(section, idx, m) for section, idx, s in _sentences(d) for m in LINKED_NUMBER.finditer(s)
               if ev.facts.get(m.group(3)) and ev.facts[m.group(3)].role in ("measure", "count")
               and ev.facts[m.group(3)].required]
    for section, idx, m in [numbers[int(i)] for i in rng.choice(len(numbers), min(2, len(numbers)), replace=False)]:
        f = ev.facts[m.group(3)]
        factor = rng.choice([rng.uniform(1.2, 1.6), rng.uniform(0.4, 0.8)])
        printed = m.group(1)
        dec = len(printed.split(".")[1]) if "." in printed else 0
        value = float(printed) * factor if float(printed) != 0 else float(rng.integers(2, 9))
        text = f"{value:.{dec}f}" if dec else str(int(round(value)) if round(value) != float(printed) else int(value) + 2)
        out.append((_replace(d, section, idx, *m.span(1), text),
                    Injected("contradiction", "number", section, idx, f.entity, f.value, float(text))))
    label = _label_change(d, ev, rng)
    if label:
        out.append(label)
    return out


def _label_change(d: Draft, ev: Evidence, rng: np.random.Generator) -> tuple[Draft, Injected] | None:
    for section, idx, s in _sentences(d):
        if ev.label.startswith("PI-RADS") and f"`{ev.label}`" in s:
            n = int(ev.label.split()[-1])
            wrong = f"PI-RADS {n - 1 if n > 2 else n + 1}"
            return (_replace(d, section, idx, s.index(ev.label), s.index(ev.label) + len(ev.label), wrong),
                    Injected("contradiction", "label", section, idx, "label", ev.label, wrong))
        if ev.label in ("HGG", "LGG") and f"(`{ev.label}`)" in s:
            a, b = ("high-grade glioma (`HGG`)", "low-grade glioma (`LGG`)")
            t = s.replace(a, b) if ev.label == "HGG" else s.replace(b, a)
            if t == s:  # reworded: this sentence does not carry the template's phrase
                continue
            new = d.model_copy(deep=True)
            getattr(new, section)[idx] = t
            return new, Injected("contradiction", "label", section, idx, "label", ev.label, "LGG" if ev.label == "HGG" else "HGG")
        if ev.label in _ACDC_TEXT and s == _ACDC_TEXT[ev.label]:
            other = [x for x in _ACDC_TEXT if x != ev.label]
            wrong = other[int(rng.integers(0, len(other)))]
            new = d.model_copy(deep=True)
            getattr(new, section)[idx] = _ACDC_TEXT[wrong]
            return new, Injected("contradiction", "label", section, idx, "label", ev.label, wrong)
    return None


# ---- missing ----------------------------------------------------------------------------------
def _missing(d: Draft, ev: Evidence) -> list[tuple[Draft, Injected]]:
    out, all_s = [], _sentences(d)
    required = set(ev.required_ids())
    for section, idx, s in all_s:
        others = "\n".join(t for sec, j, t in all_s if (sec, j) != (section, idx))
        ids = [i for i in dict.fromkeys(re.findall(r"`\[([^`]+?)\]`", s)) if i in required and f"[{i}]" not in others]
        label = bool(ev.label) and (f"`{ev.label}`" in s) and f"`{ev.label}`" not in others and section == "impression"
        if not ids and not label:
            continue
        new = d.model_copy(deep=True)
        del getattr(new, section)[idx]
        out.append((new, Injected("missing", "label" if label and not ids else "facts", section, -1,
                                  "label" if label and not ids else ev.facts[ids[0]].entity, s, None, ids)))
    return out


# ---- localization -----------------------------------------------------------------------------
def _localization(d: Draft, ev: Evidence, rng: np.random.Generator) -> list[tuple[Draft, Injected]]:
    if ev.domain != "prostate" or not ev.lesions():
        return []
    out = []
    for section, idx, s in _sentences(d):
        lesion = next((e for e in ev.lesions() if f"`{e.id}`" in s), None)
        if lesion is None:
            continue
        m = ZONE.search(s)
        if m:
            code = (m.group(2) or ZONE_CODES.get(m.group(1).lower(), "")).upper()
            other = "TZ" if code == "PZ" else "PZ"
            text = other if m.group(2) else ZONE_WORDS[other]
            out.append((_replace(d, section, idx, *m.span(), text),
                        Injected("localization", "zone", section, idx, lesion.id, code, other)))
        for m in LINKED_NUMBER.finditer(s):
            f = ev.facts.get(m.group(3))
            if f is not None and f.role == "slice":
                shift = int(rng.choice([-4, -3, -2, 2, 3, 4]))
                out.append((_replace(d, section, idx, *m.span(1), str(int(f.value) + shift)),
                            Injected("localization", "slice", section, idx, lesion.id, int(f.value), int(f.value) + shift)))
                break
    for b in d.boxes:
        (i0, j0, k0), (i1, j1, k1) = b.box_voxel
        di, dj = (i1 - i0, 0) if rng.random() < 0.5 else (0, j1 - j0)
        moved = [[i0 + di, j0 + dj, k0], [i1 + di, j1 + dj, k1]]
        new = d.model_copy(deep=True)
        new.boxes = [Box(lesion=x.lesion, box_voxel=moved if x.lesion == b.lesion else x.box_voxel) for x in new.boxes]
        out.append((new, Injected("localization", "box", "boxes", -1, b.lesion, b.box_voxel, moved)))
    return out


# Rewordings of the template sentences, written before the paraphrased corpus was first run and
# not tuned afterwards: they test the Reflector on wording its lexicon was not written against.
PARAPHRASES: list[tuple[str, str]] = [
    (r"^The left ventricle measures ", "Left ventricular volume is "),
    (r"^The right ventricle measures ", "Right ventricular volume is "),
    (r"^The left ventricle is dilated\.", "The LV is enlarged."),
    (r" is not dilated\.", " is normal in size."),
    (r"^There is no ", "No evidence of "),
    (r"^No suspicious focal lesion is seen\.", "No suspicious lesion is identified."),
    (r"there is a focal lesion", "a lesion is seen"),
    (r" % `", "% `"),
    (r"^Findings consistent with ", "Appearances suggest "),
    (r"high-grade glioma", "high grade glioma"), (r"low-grade glioma", "low grade glioma"),
    (r"^There is a (left|right)-hemispheric intra-axial tumour\.", r"An intra-axial tumour is present in the \1 hemisphere."),
    (r" in largest diameter", " in maximal dimension"),
    (r"^There is reduced left ventricular systolic function\.", "Left ventricular systolic function is impaired."),
    (r"^There is preserved right ventricular systolic function\.", "Right ventricular systolic function is preserved."),
]


def paraphrase(draft: Draft) -> Draft:
    new = draft.model_copy(deep=True)
    for section in ("findings", "impression"):
        out = []
        for s in getattr(new, section):
            for pat, rep in PARAPHRASES:
                s = re.sub(pat, rep, s)
            out.append(s)
        setattr(new, section, out)
    return new


def corrupt(draft: Draft, ev: Evidence, type_: str, rng: np.random.Generator) -> list[tuple[Draft, Injected]]:
    """Every single-error corruption of ``type_`` this draft admits (variants of one type)."""
    makers: dict[str, Callable[[], list[tuple[Draft, Injected]]]] = {
        "laterality": lambda: _laterality(draft, ev), "negation": lambda: _negation(draft, ev),
        "unsupported": lambda: _unsupported(draft, ev, rng), "contradiction": lambda: _contradiction(draft, ev, rng),
        "missing": lambda: _missing(draft, ev), "localization": lambda: _localization(draft, ev, rng)}
    return makers[type_]()


def matches(issue: Any, inj: Injected) -> bool:
    """Whether a Reflector issue is the detection of this injected error (type and place)."""
    if issue.type != inj.type:
        return False
    if inj.type == "missing":
        return bool(set(issue.evidence_ids) & set(inj.removed_ids)) or (inj.entity == "label" and issue.entity == "label")
    if inj.section == "boxes":
        return issue.section == "boxes" and issue.entity == inj.entity
    return issue.section == inj.section and issue.sentence == inj.sentence


__all__ = ["Injected", "PARAPHRASES", "TYPES", "corrupt", "matches", "paraphrase", "value_text"]
