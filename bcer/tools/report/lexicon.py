"""The words a report uses for sides, zones, categories and findings, as patterns: one table
shared by the template drafter (which must match them) and the R4 Reflector (which reads them).

The radiologists' vocabulary is written from published vocabularies, not from our templates:
RadLex anatomy and finding terms (ventricles, hemispheres, prostate zones, oedema,
haemorrhage, mass effect, effusion...), PI-RADS v2.1 (zones and their abbreviations PZ, TZ,
CZ, AFS, sectors; categories 1-5 and their likelihood words "very low" to "very high"), the
BraTS compartments (enhancing tumour, necrotic core, peritumoral oedema / FLAIR
hyperintensity) and the WHO CNS grades (2 low grade; 3-4 high grade), and the cardiac MR
terms of the ACDC groups and SCMR reporting (EDV, ESV, EF, LVH, wall motion words).
"""
from __future__ import annotations

import re

NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w])")
CODE = re.compile(r"`[^`]*`")
LINK = re.compile(r"`\[([^`]+?)\]`")
# a number, its unit (a few non-space chars, optional) and its evidence link
LINKED_NUMBER = re.compile(r"(?<![\w.`])(-?\d+(?:\.\d+)?)((?:\s*[^\s\d`\[][^\s`]{0,8})?)\s*`\[([^`]+?)\]`")
LESION_ID = re.compile(r"`?\b[Ll]esion[ _-]?(?:#|no\.? ?)?(\d+)\b`?")
# a side word; L/R only where a location follows (PI-RADS sector notation "R PZ", "L hemisphere")
_SITE = (r"(?:PZ|TZ|CZ|AFS|peripheral|transition|central|anterior|posterior|hemispher\w*|frontal|parietal|temporal|"
         r"occipital|lobe|base|apex|apical|mid)")
SIDE = re.compile(r"\b(left|right)(?:[- ](?:sided|hemispheric|hemisphere))?\b|\b([LR])\b(?=\s*" + _SITE + ")",
                  re.IGNORECASE)
CHAMBER = re.compile(r"\b(LV|RV)(?:EF)?\b|\b(left|right)[- ]ventric\w*", re.IGNORECASE)
ZONE = re.compile(r"\b(peripheral zone|transition(?:al)? zone|central zone|anterior fibromuscular stroma|"
                  r"anterior stroma|peripheral gland|central gland)\b|\b(PZ|TZ|CZ|AFS)\b", re.IGNORECASE)
ZONE_WORDS = {"PZ": "peripheral zone", "TZ": "transition zone", "CZ": "central zone",
              "AFS": "anterior fibromuscular stroma"}
# PI-RADS v2.1 names; "central gland" (TZ + CZ) and "peripheral gland" are the older words
ZONE_CODES = {**{v: k for k, v in ZONE_WORDS.items()}, "transitional zone": "TZ", "anterior stroma": "AFS",
              "peripheral gland": "PZ", "central gland": "TZ"}
PIRADS = re.compile(r"PI-?RADS\s*(?:v(?:ersion\s*)?2(?:\.[01])?\s*)?(?:category|score|assessment)?\s*(\d)\b"
                    r"|\bcategory\s+(\d)\b(?=[^.]*PI-?RADS)", re.IGNORECASE)
PIRADS_VERSION = re.compile(r"\bv(?:ersion\s*)?2(?:\.[01])?\b", re.IGNORECASE)
# PI-RADS v2.1 likelihood of clinically significant cancer, per category
LIKELIHOOD = re.compile(r"\b(very\s+low|very\s+high|low|intermediate|equivocal|high)\s+(?:likelihood|probability|"
                        r"risk|suspicion)\b", re.IGNORECASE)
LIKELIHOOD_CATEGORY = {"very low": 1, "low": 2, "intermediate": 3, "equivocal": 3, "high": 4, "very high": 5}
CATEGORY_LIKELIHOOD = {1: "very low", 2: "low", 3: "intermediate", 4: "high", 5: "very high"}
GRADE = re.compile(r"\b(HGG|LGG)\b|\b(high|low)[- ]grade\b", re.IGNORECASE)
# WHO CNS grades: 2 is low grade, 3 and 4 high grade ("WHO grade 3-4", "grade IV")
WHO_GRADE = re.compile(r"\bWHO\s+(?:CNS\s+)?grade\s+(\d|I{1,3}V?|IV)(?:\s*[-/–]\s*(\d|I{1,3}V?|IV))?\b", re.I)
ROMAN = {"I": 1, "II": 2, "III": 3, "IV": 4}
ACDC_CODE = re.compile(r"`(NOR|DCM|HCM|MINF|RV)`")
ACDC_PHRASE = {"DCM": re.compile(r"dilated cardiomyopathy", re.I), "HCM": re.compile(r"hypertrophic cardiomyopathy", re.I),
               "MINF": re.compile(r"(myocardial )?infarct\w*", re.I),
               "RV": re.compile(r"abnormal right ventricle|right ventricular (cardiomyopathy|disease|abnormality)|"
                                r"arrhythmogenic right ventricular", re.I),
               "NOR": re.compile(r"normal (cardiac|heart|study|examination)|normal biventricular", re.I)}
NEGATION = re.compile(r"\b(no|not|without|absence of|absent|free of|negative for|nor|neither|none)\b", re.IGNORECASE)
# negation inside a compound word: "non-enhancing", "nondilated", "necrosis-free"
NEG_PREFIX = re.compile(r"\bnon-?$", re.IGNORECASE)
NEG_SUFFIX = re.compile(r"^\w*-free\b", re.IGNORECASE)
# findings no bcer evidence holds (RadLex finding terms): a sentence naming one is unsupported (closed world)
UNSUPPORTED_FINDINGS = re.compile(
    r"\bha?emorrha\w*|\bblood products\b|\bcysts?\b|\bcystic\b|\bmidline shift\b|\bmass effect\b|\bherniat\w*|"
    r"\beffac\w*|\bhydroceph\w*|\bleptomening\w*|\bcistern\w*|\bcalcif\w*|\bextra-?(?:capsular|prostatic) "
    r"(?:extension|spread)\b|\b(?:ECE|EPE|SVI)\b|\bseminal vesicles?\b|\blymph\s*nodes?\b|\blymphadenopathy\b|"
    r"\bcapsular (?:bulge|irregularity|breach)\b|\bneurovascular bundles?\b|\bmetasta\w*|\bpericardial\b|"
    r"\blate (?:gadolinium )?enhancement\b|\bLGE\b|\bthromb\w*|\bregurgita\w*|\bstenos\w*|\batri(?:um|al)\b|"
    r"\baort\w*|\bvalv\w*|\bpleural\b|\baneurysm\w*", re.IGNORECASE)
# a header, disclaimer or evidence table line: metadata, not a finding to check
# (the header and Evidence sections of bcer.tools.report.header, between <!-- bcer:metadata --> markers)
METADATA = re.compile(r"^\s*(?:<!--\s*/?bcer:metadata|\[\^\d+\]:|research use only\b|\*\*research use only|"
                      r"-\s+(?:case|input series|method|bcer(?: version)?|run date|date|flags?)\s*:)", re.IGNORECASE)
CLAUSE = re.compile(r"[;:,]|\bbut\b|\bwhile\b|\bwhereas\b")

# "reduced ejection fraction" and "ejection fraction is reduced" (either word order)
_EF = r"(?:ejection fraction|systolic function|[LR]VEF|EF)"
_EF_LOW = re.compile(rf"\b(?:reduced|impaired|depressed|decreased)\s+(?:\w+\s+){{0,2}}{_EF}|\b{_EF}\s+(?:is|was|are)\s+"
                     rf"(?:\w+\s+)?(?:reduced|impaired|depressed|decreased)\b", re.I)
_EF_OK = re.compile(rf"\b(?:preserved|normal)\s+(?:\w+\s+){{0,2}}{_EF}|\b{_EF}\s+(?:is|was|are)\s+(?:\w+\s+)?"
                    rf"(?:preserved|normal)\b", re.I)
_DILATED = re.compile(r"\bdilat\w*|\benlarged\b", re.I)
_NORMAL_SIZE = re.compile(r"\bnormal(?:ly)?[- ]sized?\b|\bnormal in size\b|\bnormal\s+(?:[\w-]+\s+){0,2}size\b", re.I)
# concept -> (keyword pattern, antonym pattern asserting absence, chamber side or "")
CONCEPTS: dict[str, tuple[re.Pattern, re.Pattern | None, str]] = {
    "enhancement": (re.compile(r"\benhanc\w*", re.I), re.compile(r"\bnon-?enhancing\b", re.I), ""),
    "necrosis": (re.compile(r"\bnecro\w*", re.I), None, ""),
    "oedema": (re.compile(r"\bo?edema\w*|\boedematous\b|\bFLAIR (?:signal abnormality|hyperintens\w*)|"
                          r"\bT2/FLAIR hyperintens\w*", re.I), None, ""),
    "suspicious lesion": (re.compile(r"\b(?:suspicious|focal)\s+(?:focal\s+)?lesions?\b|\blesions?\b|"
                                     r"\bfocal abnormalit\w*|\bsuspicious (?:focus|foci|area)\b", re.I), None, ""),
    "LV dilatation": (_DILATED, _NORMAL_SIZE, "left"),
    "RV dilatation": (_DILATED, _NORMAL_SIZE, "right"),
    "LV hypertrophy": (re.compile(r"\bhypertroph\w*|\bthickened\b", re.I), None, "left"),
    "regional wall motion abnormality": (re.compile(r"\bwall[- ]motion abnormalit\w*|\bcontract\w* abnormally\b|"
                                                    r"\bregional(?:ly)? (?:hypo|a|dys)kine\w*", re.I), None, ""),
    "reduced LV ejection fraction": (_EF_LOW, _EF_OK, "left"),
    "reduced RV ejection fraction": (_EF_LOW, _EF_OK, "right"),
}
DOMAIN_CONCEPTS = {"brain": ("enhancement", "necrosis", "oedema"), "prostate": ("suspicious lesion",),
                   "cardiac": ("LV dilatation", "RV dilatation", "LV hypertrophy", "regional wall motion abnormality",
                               "reduced LV ejection fraction", "reduced RV ejection fraction")}
# words that ground a sentence in a domain's evidence even without a number (subjects)
SUBJECTS = {"brain": re.compile(r"\btumou?r\b|\bglioma\b|\bmass\b|\bcompartment|\bhemispher\w*", re.I),
            "prostate": re.compile(r"\bprostate\b|\bgland\b", re.I),
            "cardiac": re.compile(r"\bventric\w*|\bmyocard\w*|\bLV\b|\bRV\b|\bheart\b|\bcardiac\b", re.I)}


def side_of(word: str) -> str:
    w = word.lower()
    if w in ("l", "r"):  # the sector abbreviation (R PZ)
        return "left" if w == "l" else "right"
    return "left" if w.startswith(("left", "lv")) else ("right" if w.startswith(("right", "rv")) else "")


def swap_side(word: str) -> str:
    """The same word for the other side, case and form kept (left-sided -> right-sided, LV -> RV)."""
    table = {"left": "right", "right": "left", "Left": "Right", "Right": "Left", "LEFT": "RIGHT", "RIGHT": "LEFT",
             "LV": "RV", "RV": "LV", "lv": "rv", "rv": "lv", "L": "R", "R": "L"}
    for a, b in table.items():
        if word.startswith(a):
            return b + word[len(a):]
    return word


def with_side(word: str, side: str) -> str:
    return word if side_of(word) == side or not side else swap_side(word)


def who_grade(m: re.Match) -> str:
    """HGG or LGG of a WHO grade match (grade 2: LGG; 3 or 4: HGG)."""
    def n(x: str) -> int:
        return int(x) if x.isdigit() else ROMAN.get(x.upper(), 0)
    top = max(n(m.group(1)), n(m.group(2)) if m.group(2) else 0)
    return "HGG" if top >= 3 else "LGG"


__all__ = ["ACDC_CODE", "ACDC_PHRASE", "CATEGORY_LIKELIHOOD", "CHAMBER", "CLAUSE", "CODE", "CONCEPTS",
           "DOMAIN_CONCEPTS", "GRADE", "LESION_ID", "LIKELIHOOD", "LIKELIHOOD_CATEGORY", "LINK", "LINKED_NUMBER",
           "METADATA", "NEGATION", "NEG_PREFIX", "NEG_SUFFIX", "NUMBER", "PIRADS", "PIRADS_VERSION", "SIDE",
           "SUBJECTS", "UNSUPPORTED_FINDINGS", "WHO_GRADE", "ZONE", "ZONE_CODES", "ZONE_WORDS", "side_of", "swap_side",
           "who_grade", "with_side"]
