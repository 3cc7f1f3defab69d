"""Numbers a report writes without an evidence link, read as a radiologist reads them: a value
(or a range, or a count in words), its unit with its conversion, the entity it is about, and
the evidence fact it states.

A number whose value, converted through its unit, equals a fact of its entity (within the
printed precision) states that fact; one that disagrees is a wrong value of the fact its
quantity words (``EDV``, ``end-systolic``, ``ejection fraction``...) or its unit point to; a
number of a kind no fact of its entity has is unsupported.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from ...tools.report.evidence import Evidence, Fact
from ...tools.report.lexicon import CHAMBER, LESION_ID, side_of

# unit text (lower case) -> (dimension, factor to the dimension's base unit)
UNITS: dict[str, tuple[str, float]] = {
    "mm": ("length", 1.0), "cm": ("length", 10.0), "m": ("length", 1000.0),
    "ml": ("volume", 1.0), "cc": ("volume", 1.0), "cm³": ("volume", 1.0), "cm3": ("volume", 1.0),
    "l": ("volume", 1000.0), "dl": ("volume", 100.0), "mm³": ("volume", 1e-3), "mm3": ("volume", 1e-3),
    "µl": ("volume", 1e-3), "g": ("mass", 1.0), "kg": ("mass", 1000.0), "mg": ("mass", 1e-3), "%": ("percent", 1.0),
    "ml/m²": ("volume_index", 1.0), "ml/m2": ("volume_index", 1.0), "g/m²": ("mass_index", 1.0),
    "g/m2": ("mass_index", 1.0), "m²": ("area", 1.0), "m2": ("area", 1.0), "µm²/s": ("diffusivity", 1.0),
    "um2/s": ("diffusivity", 1.0), "1e-6 mm2/s": ("diffusivity", 1.0), "mm²/s": ("diffusivity", 1e6),
    "mm2/s": ("diffusivity", 1e6), "x10-6 mm2/s": ("diffusivity", 1.0), "x10-3 mm2/s": ("diffusivity", 1000.0),
    "ms": ("time", 1.0), "s": ("time", 1000.0), "kg/m2": ("bmi", 1.0), "segments": ("count", 1.0),
    "segment": ("count", 1.0), "frame": ("frame", 1.0), "frames": ("frame", 1.0),
}
_POW = r"(?:x|×|\*)\s*10\s*(?:\^\s*)?(?:⁻|-|−)\s*(?:³|⁶|3|6)\s*mm(?:²|2)\s*/\s*s"
_UNIT = (rf"{_POW}|[µu]m(?:²|2)/s|mm(?:²|2)/s|m[lL]/m(?:²|2)|g/m(?:²|2)|kg/m(?:²|2)|cm(?:³|3)|mm(?:³|3)|[µu][lL]|"
         r"mm|cm|"
         r"m[lL]|d[lL]|cc|L|kg|mg|g|%|ms|s|m(?:²|2)")
WORDS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve thirteen "
                                    "fourteen fifteen sixteen seventeen eighteen nineteen twenty".split())}
WORDS.update(none=0, no=0, single=1)
_WORD = "|".join(sorted(WORDS, key=len, reverse=True))
_VAL = rf"\d+(?:\.\d+)?|\b(?:{_WORD})\b"
QTY = re.compile(rf"(?<![\w.⁻^/])(?P<a>{_VAL})(?:\s*(?:-|–|to)\s*(?P<b>\d+(?:\.\d+)?))?"
                 rf"(?:\s*(?P<unit>{_UNIT})(?![\w²³]))?", re.IGNORECASE)
_COUNT_AFTER = re.compile(r"^(?:\s+of\s+(?:\d+|[a-z]+))?\s+(?:[a-z-]+\s+){0,2}segments?\b", re.I)
_SLICE_BEFORE = re.compile(r"\b(?:slices?|images?|sections?)\s*(?:\w+\s+){0,1}$", re.I)
_FRAME_BEFORE = re.compile(r"\bframes?\s*$", re.I)
# quantity words that tell which fact of a dimension a number is (nearest one before it wins)
KEYWORDS: dict[str, re.Pattern] = {
    "edv": re.compile(r"end-?\s?diastol\w*|\bEDV\b|diastolic volume|EDVi?\b", re.I),
    "esv": re.compile(r"end-?\s?systol\w*|\bESV\b", re.I), "sv": re.compile(r"\bstroke\b|\bSV\b", re.I),
    "ef": re.compile(r"ejection fraction|\b[LR]?VEF\b|\bEF\b", re.I), "mass": re.compile(r"\bmass\b", re.I),
    "wall": re.compile(r"\bwall\b|thickness", re.I), "volume": re.compile(r"\bvolume\b", re.I),
    "diameter": re.compile(r"diameter|dimension|extent|across|spans?|measur\w*|size", re.I),
    "abn": re.compile(r"hypokine\w*|akine\w*|dyskine\w*|abnormal\w*|wall motion|contract\w*", re.I),
    "total": re.compile(r"\bof\b|\btotal\b|\banalys\w*", re.I),  # "4 of 16 segments": the second is the total
}
# measures no bcer fact is: a number named so is not a wrong value of another measure
_OTHER_MEASURE = re.compile(r"\b(?:length|width|height|antero-?posterior|craniocaudal|transverse|"
                            r"thickness|depth|distance)\b", re.I)
_FACT_KEY = [("n_abnormal", "abn"), ("n_segments", "total"), ("edvi", "edv"), ("esvi", "esv"), ("edv", "edv"),
             ("esv", "esv"), ("_sv_", "sv"), ("ef_pct", "ef"),
             ("mass", "mass"), ("wall", "wall"), ("volume", "volume"), ("diameter", "diameter"), ("size", "diameter")]


@dataclass
class Quantity:
    span: tuple[int, int]
    lo: float
    hi: float
    tol: float       # in the base unit
    dim: str
    text: str


def fact_dim(f: Fact) -> tuple[str, float]:
    return _dim(f.role, f.name, f.unit)


@lru_cache(maxsize=1024)
def _dim(role: str, name: str, unit: str) -> tuple[str, float]:
    if role == "slice":
        return "slice", 1.0
    if role in ("score", "rule_value", "rule_threshold") or name.startswith(("centroid", "midline")):
        return "", 1.0  # coordinates and rule values are not what a report's prose states
    return UNITS.get(unit.lower(), ("", 1.0)) if unit else ("plain", 1.0)


def _unit(text: str) -> tuple[str, float] | None:
    u = re.sub(r"\s+", "", text.lower()).replace("×", "x").replace("*", "x").replace("−", "-").replace("⁻", "-")
    power = "10" in u
    u = u.replace("^", "").replace("³", "3" if power else "³").replace("⁶", "6").replace("²", "2" if power else "²")
    if u.startswith("x10"):
        return UNITS["x10-3 mm2/s"] if "-3" in u else UNITS["x10-6 mm2/s"]
    return UNITS.get(u) or UNITS.get(u.replace("²", "2").replace("³", "3"))


def _value(text: str) -> float:
    return float(WORDS[text.lower()]) if text.lower() in WORDS else float(text)


def _tol(text: str) -> float:
    return 0.5 * 10 ** -(len(text.split(".")[1]) if "." in text else 0) + 1e-9


def quantities(s: str) -> list[Quantity]:
    """Every number of a (masked) sentence with its dimension ('' when it has none it names)."""
    out = []
    for m in QTY.finditer(s):
        a, b, unit = m.group("a"), m.group("b"), m.group("unit")
        word = a.lower() in WORDS
        after = s[m.end():]
        if unit:
            u = _unit(unit)
            if u is None:
                continue
            dim, factor = u
        elif _COUNT_AFTER.match(after):
            dim, factor = "count", 1.0
        elif word:
            continue  # "one of", "no" in prose: not a number
        elif _SLICE_BEFORE.search(s[:m.start()]):
            dim, factor = "slice", 1.0
        elif _FRAME_BEFORE.search(s[:m.start()]):
            dim, factor = "frame", 1.0
        else:
            dim, factor = "", 1.0
        lo = _value(a) * factor
        if dim == "slice" and b:  # "slices 13 to 14": two facts (first and last)
            out.append(Quantity((m.start("a"), m.end("a")), lo, lo, _tol(a), dim, a))
            out.append(Quantity((m.start("b"), m.end("b")), float(b), float(b), _tol(b), dim, b))
            continue
        hi = float(b) * factor if b else lo
        tol = (0.5 if word else _tol(b or a)) * factor
        out.append(Quantity(m.span(), min(lo, hi), max(lo, hi), tol, dim, m.group(0)))
    return out


def _scope(ev: Evidence, s: str, pos: int) -> set[str] | None:
    """The entities the words nearest before (else after) position ``pos`` name; None: any."""
    marks: list[tuple[int, set[str]]] = []
    if ev.domain == "cardiac":
        for m in CHAMBER.finditer(s):
            marks.append((m.start(), {"lv", "myo", "heart"} if side_of(m.group(0)) == "left" else {"rv", "heart"}))
        for m in re.finditer(r"\bmyocard\w*", s, re.I):
            marks.append((m.start(), {"myo", "lv", "heart"}))
    elif ev.domain == "brain":
        for roi, pat in (("enhancing", r"enhanc\w*"), ("necrotic_core", r"necro\w*"),
                         ("oedema", r"o?edema\w*|FLAIR|T2 hyperintens\w*")):
            marks += [(m.start(), {roi}) for m in re.finditer(pat, s, re.I) if roi in ev.entities]
    elif ev.domain == "prostate":
        marks += [(m.start(), {f"lesion_{int(m.group(1))}"}) for m in LESION_ID.finditer(s)]
        marks += [(m.start(), {"gland"}) for m in re.finditer(r"\b(?:prostate|gland)\b(?! zone)", s, re.I)]
        lesions = ev.lesions()
        if len(lesions) == 1:
            marks += [(m.start(), {lesions[0].id}) for m in re.finditer(r"\b(?:lesion|focus|nodule)\b", s, re.I)]
    if not marks:
        return None
    before = [x for x in marks if x[0] <= pos]
    return (max(before, key=lambda x: x[0]) if before else min(marks, key=lambda x: x[0]))[1]


def _key_of(f: Fact) -> str:
    return next((k for frag, k in _FACT_KEY if frag in f.name), "")


def _by_keyword(cands: list[Fact], s: str, pos: int) -> list[Fact]:
    """The facts whose quantity word is nearest before ``pos`` (else the first one after it:
    "Six segments are hypokinetic")."""
    best, at = [], -1
    for f in cands:
        pat = KEYWORDS.get(_key_of(f))
        if pat is None:
            continue
        ends = [m.end() for m in pat.finditer(s, 0, pos)]
        if ends and max(ends) > at:
            best, at = [f], max(ends)
        elif ends and max(ends) == at:
            best.append(f)
    if best:
        return best
    after = [(m.start(), f) for f in cands if KEYWORDS.get(_key_of(f))
             for m in [KEYWORDS[_key_of(f)].search(s, pos)] if m]
    first = min((a for a, _ in after), default=None)
    return [f for a, f in after if a == first]


def ground(ev: Evidence, s: str, q: Quantity, subject: str | None = None) -> tuple[str, Fact | None]:
    """('ok', fact) | ('wrong', the fact it should state) | ('unsupported', None). ``subject``:
    the entity the sentence is about when its words name none (a lesion named by location)."""
    if not q.dim:
        return "unsupported", None
    scope = _scope(ev, s, q.span[0]) or ({subject} if subject else None)
    cands = [f for f in ev.facts.values() if fact_dim(f)[0] == q.dim and (scope is None or f.entity in scope)]
    if not cands:
        return "unsupported", None
    good = [f for f in cands if q.lo - q.tol <= f.value * fact_dim(f)[1] <= q.hi + q.tol]
    keyed = _by_keyword(cands, s, q.span[0])
    named = [f for f in good if any(f is k for k in keyed)]
    if good and (not keyed or named):
        return "ok", (named or sorted(good, key=lambda f: not f.required))[0]
    # a value that is another fact's (the EDV written with the ESV's value) is wrong for the fact its words name
    if scope is None and not keyed:
        return "unsupported", None  # neither an entity nor a quantity word says what it measures
    pool = keyed or [f for f in cands if f.required] or cands
    mid = (q.lo + q.hi) / 2
    f = min(pool, key=lambda f: abs(f.value * fact_dim(f)[1] - mid))
    near = s[max(0, q.span[0] - 40):q.span[1] + 40]
    other = _OTHER_MEASURE.search(near)
    if other and not (KEYWORDS.get(_key_of(f)) and KEYWORDS[_key_of(f)].search(other.group(0))):
        return "unsupported", None  # "51 mm in length" of a gland whose evidence has a largest diameter only
    return "wrong", f


__all__ = ["KEYWORDS", "QTY", "Quantity", "UNITS", "WORDS", "fact_dim", "ground", "quantities"]
