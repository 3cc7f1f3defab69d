"""The words a report uses for sides, zones, categories and findings, as patterns: one table
shared by the template drafter (which must match them) and the R4 Reflector (which reads them).
"""
from __future__ import annotations

import re

NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w])")
CODE = re.compile(r"`[^`]*`")
LINK = re.compile(r"`\[([^`]+?)\]`")
# a number, its unit (a few non-space chars, optional) and its evidence link
LINKED_NUMBER = re.compile(r"(?<![\w.`])(-?\d+(?:\.\d+)?)((?:\s*[^\s\d`\[][^\s`]{0,8})?)\s*`\[([^`]+?)\]`")
LESION_ID = re.compile(r"`?\b[Ll]esion[ _-]?(\d+)\b`?")
SIDE = re.compile(r"\b(left|right)(?:[- ](?:sided|hemispheric|hemisphere))?\b", re.IGNORECASE)
CHAMBER = re.compile(r"\b(LV|RV)(?:EF)?\b|\b(left|right)[- ]ventric\w*", re.IGNORECASE)
ZONE = re.compile(r"\b(peripheral zone|transition zone|central zone|anterior fibromuscular stroma)\b"
                  r"|\b(PZ|TZ|CZ|AFS)\b", re.IGNORECASE)
ZONE_WORDS = {"PZ": "peripheral zone", "TZ": "transition zone", "CZ": "central zone",
              "AFS": "anterior fibromuscular stroma"}
ZONE_CODES = {v: k for k, v in ZONE_WORDS.items()}
PIRADS = re.compile(r"PI-?RADS\s*(?:category\s*)?(\d)", re.IGNORECASE)
GRADE = re.compile(r"\b(HGG|LGG)\b|\b(high|low)[- ]grade\b", re.IGNORECASE)
ACDC_CODE = re.compile(r"`(NOR|DCM|HCM|MINF|RV)`")
ACDC_PHRASE = {"DCM": re.compile(r"dilated cardiomyopathy", re.I), "HCM": re.compile(r"hypertrophic cardiomyopathy", re.I),
               "MINF": re.compile(r"(myocardial )?infarct\w*", re.I),
               "RV": re.compile(r"abnormal right ventricle|right ventricular (cardiomyopathy|disease)", re.I),
               "NOR": re.compile(r"normal (cardiac|heart|study|examination)", re.I)}
NEGATION = re.compile(r"\b(no|not|without|absence of|absent|free of|negative for|nor|neither)\b", re.IGNORECASE)
CLAUSE = re.compile(r"[;:,]|\bbut\b|\bwhile\b|\bwhereas\b")

# "reduced ejection fraction" and "ejection fraction is reduced" (either word order)
_EF = r"(?:ejection fraction|systolic function|[LR]VEF|EF)"
_EF_LOW = re.compile(rf"\b(?:reduced|impaired|depressed|decreased)\s+(?:\w+\s+){{0,2}}{_EF}|\b{_EF}\s+(?:is|was|are)\s+"
                     rf"(?:\w+\s+)?(?:reduced|impaired|depressed|decreased)\b", re.I)
_EF_OK = re.compile(rf"\b(?:preserved|normal)\s+(?:\w+\s+){{0,2}}{_EF}|\b{_EF}\s+(?:is|was|are)\s+(?:\w+\s+)?"
                    rf"(?:preserved|normal)\b", re.I)
# concept -> (keyword pattern, antonym pattern asserting absence, chamber side or "")
CONCEPTS: dict[str, tuple[re.Pattern, re.Pattern | None, str]] = {
    "enhancement": (re.compile(r"\benhanc\w*", re.I), re.compile(r"\bnon-?enhancing\b", re.I), ""),
    "necrosis": (re.compile(r"\bnecro\w*", re.I), None, ""),
    "oedema": (re.compile(r"\bo?edema\w*|\boedematous\b", re.I), None, ""),
    "suspicious lesion": (re.compile(r"\b(?:suspicious|focal)\s+(?:focal\s+)?lesions?\b|\blesions?\b", re.I), None, ""),
    "LV dilatation": (re.compile(r"\bdilat\w*|\benlarged\b", re.I), re.compile(r"\bnormal(?:ly)?[- ]sized?\b|\bnormal in size\b", re.I), "left"),
    "RV dilatation": (re.compile(r"\bdilat\w*|\benlarged\b", re.I), re.compile(r"\bnormal(?:ly)?[- ]sized?\b|\bnormal in size\b", re.I), "right"),
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
    return "left" if w.startswith(("left", "lv")) else ("right" if w.startswith(("right", "rv")) else "")


def swap_side(word: str) -> str:
    """The same word for the other side, case and form kept (left-sided -> right-sided, LV -> RV)."""
    table = {"left": "right", "right": "left", "Left": "Right", "Right": "Left", "LEFT": "RIGHT", "RIGHT": "LEFT",
             "LV": "RV", "RV": "LV", "lv": "rv", "rv": "lv"}
    for a, b in table.items():
        if word.startswith(a):
            return b + word[len(a):]
    return word


def with_side(word: str, side: str) -> str:
    return word if side_of(word) == side or not side else swap_side(word)


__all__ = ["ACDC_CODE", "ACDC_PHRASE", "CHAMBER", "CLAUSE", "CODE", "CONCEPTS", "DOMAIN_CONCEPTS", "GRADE",
           "LESION_ID", "LINK", "LINKED_NUMBER", "NEGATION", "NUMBER", "PIRADS", "SIDE", "SUBJECTS", "ZONE",
           "ZONE_CODES", "ZONE_WORDS", "side_of", "swap_side", "with_side"]
