"""The report critic (R4's Reflect step): every sentence of a draft checked against the evidence.

Issue types (R4): ``laterality`` (a side or chamber word that disagrees with the entity it
describes), ``negation`` (a finding negated that the evidence shows, or asserted that it does
not), ``unsupported`` (a number without evidence link, a link to evidence that does not exist,
an entity the evidence does not have, a sentence that states nothing the evidence holds),
``contradiction`` (a number or a category that disagrees with its evidence), ``missing`` (a
required fact, entity, label or box the draft omits), ``localization`` (a zone, slice range
or box that disagrees with the findings; a box counts when its IoU with the evidence box is
below 0.5). Each issue carries a span and a suggested fix that the fixer (``fixer.py``) applies.

Numbers without an evidence link are read by value and unit, with conversions
(:mod:`.quantities`); a finding no bcer evidence holds is unsupported (closed world); a denial
of a component whose volume another sentence states is a contradiction; grade, PI-RADS
likelihood and ACDC group words are checked against the classification; header, disclaimer
and evidence lines are metadata and skipped. Issues name evidence entities.

Deterministic and pure: the same draft and evidence always give the same issues.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Iterable

from ...metrics import box_iou
from ...tools.report.evidence import Evidence
from ...tools.report.lexicon import (ACDC_CODE, ACDC_PHRASE, CATEGORY_LIKELIHOOD, CHAMBER, CLAUSE, CODE, CONCEPTS,
                                        DOMAIN_CONCEPTS, GRADE, LESION_ID, LIKELIHOOD, LIKELIHOOD_CATEGORY,
                                        LINKED_NUMBER, METADATA, NEG_PREFIX, NEG_SUFFIX, NEGATION, PIRADS,
                                        PIRADS_VERSION, SIDE, SUBJECTS, UNSUPPORTED_FINDINGS, WHO_GRADE, ZONE,
                                        ZONE_CODES, ZONE_WORDS, side_of, who_grade, with_side)
from ...tools.report.prose import Draft, default_plan, num, slot_sentences, unit_text, value_text
from .issues import Fix, Issue
from .quantities import _unit, fact_dim, ground, quantities

BOX_IOU_MIN = 0.5
_NEG_WINDOW_WORDS = 6
# the evidence entity a concept is about (issues name evidence entities)
CONCEPT_ENTITY = {"enhancement": "enhancing", "necrosis": "necrotic_core", "oedema": "oedema",
                  "suspicious lesion": "", "LV dilatation": "lv", "RV dilatation": "rv", "LV hypertrophy": "lv",
                  "regional wall motion abnormality": "heart", "reduced LV ejection fraction": "lv",
                  "reduced RV ejection fraction": "rv"}
_COMPARE = re.compile(r"\b(LV|RV|left ventricle|right ventricle)\s+(?:is|appears)\s+(?:\w+\s+)?"
                      r"(larger|bigger|more dilated|"
                      r"smaller)\s+than\s+(?:the\s+)?(LV|RV|left ventricle|right ventricle|left|right)\b", re.I)


def _tolerance(printed: str) -> float:
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return 0.5 * 10 ** -decimals + 1e-9


def _clause(s: str, pos: int) -> tuple[int, int]:
    start, end = 0, len(s)
    for m in CLAUSE.finditer(s):
        if m.end() <= pos:
            start = m.end()
        elif m.start() >= pos:
            end = m.start()
            break
    return start, end


def _masked(s: str, spans: Iterable[tuple[int, int]]) -> str:
    chars = list(s)
    for a, b in spans:
        for i in range(a, b):
            chars[i] = " "
    return "".join(chars)


class _Sentence:
    def __init__(self, section: str, idx: int, text: str, ev: Evidence):
        self.section, self.idx, self.s, self.ev = section, idx, text, ev
        self.issues: list[Issue] = []
        self.stated: set[str] = set()  # facts the sentence states (linked or by value)
        self.grounded = self.closed = False
        self.lesions = []
        for m in LESION_ID.finditer(text):
            lid = f"lesion_{int(m.group(1))}"
            self.lesions.append((lid, m.span()))

    def add(self, type_: str, span, message: str, fix: Fix, *, entity: str = "", ids=(), found=None,
            expected=None) -> None:
        self.issues.append(Issue(type=type_, section=self.section, sentence=self.idx, span=span, entity=entity,
                                 evidence_ids=list(ids), found=found, expected=expected, message=message, fix=fix))

    def subject(self) -> str | None:
        """The one lesion a sentence is about: by id; else the only lesion of the case; else the
        only lesion at the side and zone the sentence names (a location without an id)."""
        known = {lid for lid, _ in self.lesions if lid in self.ev.entities}
        if len(known) == 1:
            return known.pop()
        lesions = self.ev.lesions()
        if self.lesions or not lesions:
            return None
        if len(lesions) == 1:
            return lesions[0].id
        side, zone = SIDE.search(self.s), ZONE.search(self.s)
        if not (side and zone):
            return None
        code = (zone.group(2) or ZONE_CODES.get(zone.group(1).lower(), "")).upper()
        at = [e.id for e in lesions if e.side == side_of(side.group(0)) and e.zone == code]
        return at[0] if len(at) == 1 else None


def _numbers(st: _Sentence, decimals: int) -> list[tuple[int, int]]:
    ev, s, spans = st.ev, st.s, []
    for m in LINKED_NUMBER.finditer(s):
        spans.append(m.span())
        fid, f = m.group(3), ev.facts.get(m.group(3))
        st.grounded = True
        if f is None:
            st.add("unsupported", m.span(), f"evidence {fid!r} does not exist", Fix(op="delete_sentence"), ids=[fid])
            continue
        printed, unit = m.group(1), m.group(2).strip()
        conv, (fdim, ffac) = _unit(unit) if unit else None, fact_dim(f)
        if conv is not None and fdim not in ("", "plain") and conv[0] == fdim:  # through its unit: 7.1 cm is 71 mm
            off = abs(float(printed) * conv[1] - f.value * ffac) > _tolerance(printed) * conv[1]
        else:
            off = abs(float(printed) - f.value) > _tolerance(printed) or (conv is not None and fdim
                                                                            not in ("", "plain") and conv[0] != fdim)
        if off and conv is not None and (conv[1] != ffac or conv[0] != fdim):  # the unit is wrong: rewrite both
            st.add("contradiction", (m.start(1), m.end(2)), f"{f.key} is {num(f, decimals)}, the draft says "
                   f"{printed} {unit}", Fix(op="replace", text=f"{value_text(f, decimals)} {unit_text(f.unit)}".strip()
                                           + " "), entity=f.entity, ids=[fid], found=f"{printed} {unit}",
                   expected=f.value)
        elif off:
            kind = "localization" if f.role == "slice" else "contradiction"
            st.add(kind, m.span(1), f"{f.key} is {num(f, decimals)}, the draft says {printed}",
                   Fix(op="replace", text=value_text(f, decimals)), entity=f.entity, ids=[fid],
                   found=float(printed), expected=f.value)
        else:
            st.stated.add(fid)
        if ev.domain == "cardiac" and f.side:
            before = [c for c in CHAMBER.finditer(s, 0, m.start())]
            if before and side_of(before[-1].group(0)) != f.side:
                c = before[-1]
                st.add("laterality", c.span(), f"{f.key} belongs to the {f.side} side, the draft says "
                       f"{c.group(0)!r}", Fix(op="replace", text=with_side(c.group(0), f.side)),
                       entity=f.entity, ids=[fid], found=c.group(0), expected=f.side)
    return spans


def _unlinked(st: _Sentence, taken: list[tuple[int, int]], decimals: int) -> None:
    """Numbers without a link: grounded by value and unit to a fact of their entity."""
    s = st.s
    masked = _masked(s, taken + [m.span() for m in CODE.finditer(s)] + [sp for _, sp in st.lesions]
                     + [m.span() for p in (PIRADS, WHO_GRADE, PIRADS_VERSION) for m in p.finditer(s)])
    subject = st.subject() if st.ev.domain == "prostate" and not st.lesions else None
    for q in quantities(masked):
        verdict, f = ground(st.ev, s, q, subject)
        if verdict == "ok":
            st.stated.add(f.id)
            st.grounded = True
        elif verdict == "wrong":
            st.grounded = True
            kind = "localization" if f.role == "slice" else "contradiction"
            text = value_text(f, decimals) if f.role == "slice" or q.dim in ("count", "frame") else num(f, decimals)
            st.add(kind, q.span, f"{f.key} is {num(f, decimals)}, the draft says {q.text!r}",
                   Fix(op="replace", text=text), entity=f.entity, ids=[f.id], found=q.text, expected=f.value)
        else:
            st.add("unsupported", q.span, f"{q.text!r} states nothing the evidence holds", Fix(op="delete_sentence"),
                   found=q.text)


def _entities(st: _Sentence) -> None:
    for lid, span in st.lesions:
        if lid not in st.ev.entities:
            st.add("unsupported", span, f"{lid} is not among the findings", Fix(op="delete_sentence"), entity=lid,
                   found=lid, expected=sorted(e.id for e in st.ev.lesions()))
        else:
            st.grounded = True


def _sides(st: _Sentence) -> None:
    ev, s = st.ev, st.s
    if ev.domain == "cardiac":
        return
    for m in SIDE.finditer(s):
        st.grounded = True
        if ev.domain == "brain":
            want, entity = ev.side, "tumour"
        else:
            entity = st.subject() or ""
            want = ev.entities[entity].side if entity else ""
        if want and side_of(m.group(0)) != want:
            st.add("laterality", m.span(), f"{entity or 'the lesion'} is on the {want}, the draft says {m.group(0)!r}",
                   Fix(op="replace", text=with_side(m.group(0), want)), entity=entity, found=side_of(m.group(0)),
                   expected=want)


def _zones(st: _Sentence) -> None:
    ev, s = st.ev, st.s
    if ev.domain != "prostate":
        return
    side, zone = SIDE.search(s), ZONE.search(s)
    if side and zone and not st.lesions and len(ev.lesions()) > 1 and st.subject() is None:
        code = (zone.group(2) or ZONE_CODES.get(zone.group(1).lower(), "")).upper()
        where = sorted(f"{e.side} {e.zone}" for e in ev.lesions())
        if not any(e.side == side_of(side.group(0)) and e.zone == code for e in ev.lesions()):
            st.add("localization", (side.start(), zone.end()), f"no lesion in the {side.group(0)} {code}; the "
                   f"lesions are in the {', '.join(where)}", Fix(op="delete_sentence"), found=f"{side.group(0)} {code}",
                   expected=where)
    for m in ZONE.finditer(s):
        st.grounded = True
        entity = st.subject()
        if not entity:
            continue
        found = (m.group(2) or ZONE_CODES.get(m.group(1).lower(), "")).upper()
        want = ev.entities[entity].zone
        if want and found != want:
            text = want if m.group(2) else ZONE_WORDS.get(want, want)
            st.add("localization", m.span(), f"{entity} is in the {want}, the draft says {m.group(0)!r}",
                   Fix(op="replace", text=text), entity=entity, found=found, expected=want)


def _categories(st: _Sentence) -> None:
    ev, s = st.ev, st.s
    for m in PIRADS.finditer(s):
        st.grounded = True
        g = 1 if m.group(1) else 2
        entity = next((lid for lid, _ in st.lesions if lid in ev.entities), None)
        want = ev.entities[entity].category if entity else (int(ev.label.split()[-1]) if ev.label.startswith("PI-RADS") else None)
        if want is not None and int(m.group(g)) != want:
            st.add("contradiction", m.span(g), f"PI-RADS is {want}, the draft says {m.group(g)}",
                   Fix(op="replace", text=str(want)), entity=entity or "label", ids=[ev.label_id],
                   found=int(m.group(g)), expected=want)
        elif want is not None and entity and ev.fact(entity, "category"):
            st.stated.add(ev.fact(entity, "category").id)
    _likelihood(st)
    for m in GRADE.finditer(s):
        st.grounded = True
        found = (m.group(1) or f"{m.group(2)[0]}GG").upper()
        if ev.label in ("HGG", "LGG") and found != ev.label:
            if m.group(1):
                text = ev.label
            else:
                word = "high" if ev.label == "HGG" else "low"
                text = (word.capitalize() if m.group(2)[0].isupper() else word) + m.group(0)[len(m.group(2)):]
            st.add("contradiction", m.span(), f"the grade is {ev.label}, the draft says {m.group(0)!r}",
                   Fix(op="replace", text=text), entity="label", ids=[ev.label_id], found=found, expected=ev.label)
    for m in WHO_GRADE.finditer(s):
        st.grounded = True
        if ev.label in ("HGG", "LGG") and who_grade(m) != ev.label:
            st.add("contradiction", m.span(), f"the grade is {ev.label}, the draft says {m.group(0)!r}",
                   Fix(op="replace", text="WHO grade 3-4" if ev.label == "HGG" else "WHO grade 2"), entity="label",
                   ids=[ev.label_id], found=who_grade(m), expected=ev.label)
    if ev.domain == "cardiac":
        good = next((x for x in slot_sentences(ev, "cardiac.impression") if "`" + ev.label + "`" in x), "")
        for m in ACDC_CODE.finditer(s):
            st.grounded = True
            if m.group(1) != ev.label:  # the label sentence states the group in words too: restate it whole
                phrase = any(p.search(s) for p in ACDC_PHRASE.values())
                st.add("contradiction", m.span(1), f"the ACDC group is {ev.label}, the draft says {m.group(1)}",
                       Fix(op="replace_sentence", text=good) if phrase and good else Fix(op="replace", text=ev.label),
                       entity="label", ids=[ev.label_id], found=m.group(1), expected=ev.label)
        if not ACDC_CODE.search(s):
            for label, pat in ACDC_PHRASE.items():
                m = pat.search(s)
                st.grounded = st.grounded or bool(m)
                if m and label != ev.label:
                    st.add("contradiction", m.span(), f"the ACDC group is {ev.label}, the draft says {m.group(0)!r}",
                           Fix(op="replace_sentence", text=good) if good else Fix(op="delete_sentence"),
                           entity="label", ids=[ev.label_id], found=label, expected=ev.label)
                    break
        _comparison(st)


def _likelihood(st: _Sentence) -> None:
    """PI-RADS v2.1 likelihood words against the category of the same sentence (else the overall one)."""
    ev, s = st.ev, st.s
    for m in LIKELIHOOD.finditer(s):
        word = re.sub(r"\s+", " ", m.group(1).lower())
        entity = next((lid for lid, _ in st.lesions if lid in ev.entities), None)
        want = ev.entities[entity].category if entity else (int(ev.label.split()[-1]) if ev.label.startswith("PI-RADS") else None)
        st.grounded = True
        if want and LIKELIHOOD_CATEGORY[word] != want:
            st.add("contradiction", m.span(1), f"PI-RADS {want} is {CATEGORY_LIKELIHOOD[want]} likelihood, the draft "
                   f"says {word!r}", Fix(op="replace", text=CATEGORY_LIKELIHOOD[want]), entity=entity or "label",
                   ids=[ev.label_id], found=word, expected=want)


def _comparison(st: _Sentence) -> None:
    """"The RV is larger than the LV": checked against the end-diastolic volumes."""
    ev, s = st.ev, st.s
    lv, rv = ev.fact("lv", "lv_edv_ml"), ev.fact("rv", "rv_edv_ml")
    for m in _COMPARE.finditer(s):
        st.grounded = True
        if lv is None or rv is None:
            continue
        a = side_of(m.group(1))
        bigger = m.group(2).lower() != "smaller"
        truth = (rv.value > lv.value) if a == "right" else (lv.value > rv.value)
        if bigger != truth:
            st.add("contradiction", m.span(2), f"end-diastolic volumes LV {num(lv)} vs RV {num(rv)}: the draft says "
                   f"the {a} ventricle is {m.group(2)}", Fix(op="replace", text="smaller" if bigger else "larger"),
                   entity="rv" if a == "right" else "lv", ids=[lv.id, rv.id], found=m.group(2))


def _chamber_near(s: str, a: int, b: int, lo: int, hi: int) -> tuple[str, tuple[int, int] | None]:
    best, span, dist = "", None, 10 ** 6
    for c in CHAMBER.finditer(s, lo, hi):
        d = a - c.end() if c.end() <= a else (c.start() - b if c.start() >= b else 0)
        if d < dist:
            best, span, dist = side_of(c.group(0)), c.span(), d
    return best, span


def _words(s: str) -> set[str]:
    return set(re.findall(r"[a-z]+", CODE.sub(" ", s).lower()))


def concept_sentence(ev: Evidence, key: str, like: str = "") -> str:
    """The template sentence that states concept ``key`` with its evidence polarity; of several,
    the one sharing most words with ``like`` (the sentence it replaces)."""
    best, score = "", -1.0
    for slot in default_plan(ev):
        for sent in slot_sentences(ev, slot):
            if any(k == key and not wrong for k, _, _, _, _, wrong in concept_mentions(sent, ev.domain)):
                a, b = _words(sent), _words(like)
                sim = len(a & b) / max(len(a | b), 1)
                if sim > score:
                    best, score = sent, sim
    return best


@lru_cache(maxsize=4096)  # pure in (sentence, domain); the critic asks for each sentence several times
def concept_mentions(s: str, domain: str) -> list[tuple]:
    """(concept, claims present, keyword match, chamber span, chamber side, wrong side) of each
    concept mention of a sentence. A negation cue within the clause, up to 6 words before, or
    an antonym ("preserved", "normal-sized") makes it a claim of absence. Label phrases
    ("dilated cardiomyopathy") are not findings. ``wrong side``: a chamber finding stated for
    a chamber that has no such concept (right ventricular hypertrophy)."""
    plain = _masked(s, [m.span() for m in CODE.finditer(s)])
    masked = _masked(plain, [m.span() for p in (ACDC_PHRASE.values() if domain == "cardiac" else ())
                             for m in p.finditer(s)])
    out = []
    keys = DOMAIN_CONCEPTS.get(domain, ())
    for key in keys:
        pat, antonym, chamber = CONCEPTS[key]
        sides = {CONCEPTS[k][2] for k in keys if CONCEPTS[k][0] is pat}
        hits = [(m, False) for m in pat.finditer(masked)] + [(m, True) for m in (antonym.finditer(masked) if antonym else [])]
        for m, is_antonym in hits:
            lo, hi = _clause(masked, m.start())
            side, cspan = _chamber_near(plain, m.start(), m.end(), lo, hi)
            if not side and chamber:  # no chamber in the clause: the sentence's nearest one
                side, cspan = _chamber_near(plain, m.start(), m.end(), 0, len(s))
            wrong = False
            if chamber and (side or "left") != chamber:
                if (side or "left") in sides:
                    continue  # the other chamber's own concept handles it
                wrong = True
            words = masked[lo:m.start()].split()
            cue = (NEGATION.search(" ".join(words[-_NEG_WINDOW_WORDS:]))
                   or NEG_PREFIX.search(masked[max(0, m.start() - 4):m.start()]) or NEG_SUFFIX.match(masked[m.start():]))
            out.append((key, not (is_antonym or cue), m, cspan, side, wrong))
            break
    return out


def _concepts(st: _Sentence, stated_elsewhere: set[tuple[str, bool]], numbered_elsewhere: set[str]) -> None:
    ev, s = st.ev, st.s
    for key, claims_present, m, cspan, side, wrong_side in concept_mentions(s, ev.domain):
        st.grounded = True
        concept = ev.concepts.get(key)
        pat, _, chamber = CONCEPTS[key]
        if concept is None:
            continue
        ent = CONCEPT_ENTITY.get(key, key)
        if wrong_side:  # e.g. "right ventricular hypertrophy": only the left ventricle has that concept
            if claims_present and concept.present and cspan:
                st.add("laterality", cspan, f"{key} is on the {chamber} side, the draft says {s[cspan[0]:cspan[1]]!r}",
                       Fix(op="replace", text=with_side(s[cspan[0]:cspan[1]], chamber)), entity=ent,
                       ids=concept.evidence, found=side, expected=chamber)
            elif claims_present:
                st.add("unsupported", m.span(), f"{key.split(' ', 1)[-1]} of the {side} ventricle is not assessed",
                       Fix(op="delete_sentence"), entity=ent, found=side)
            continue
        if claims_present == concept.present:
            continue
        other = next((k for k in DOMAIN_CONCEPTS[ev.domain] if k != key and CONCEPTS[k][0] is pat), None)
        # "the right ventricle is dilated" when only the left one is: the finding put on the wrong
        # side, unless the draft states the left one's dilatation elsewhere (then it is a negation error)
        if (claims_present and chamber and cspan and other and ev.concepts.get(other)
                and ev.concepts[other].present and (other, True) not in stated_elsewhere):
            st.add("laterality", cspan, f"{key.split()[0]} vs {other.split()[0]}: the draft puts the finding on "
                   f"the wrong side", Fix(op="replace", text=with_side(s[cspan[0]:cspan[1]], CONCEPTS[other][2])),
                   entity=ent, ids=concept.evidence, found=side, expected=CONCEPTS[other][2])
        elif ((key, concept.present) in stated_elsewhere and not st.stated
              and (ent in numbered_elsewhere if ent else any(e.startswith("lesion") for e in numbered_elsewhere))):
            # the report says it both ways (no necrosis here, its volume there): this sentence is the wrong one
            st.add("contradiction", m.span(), f"{key} is {'present' if concept.present else 'absent'} and stated so "
                   f"elsewhere in the report; this sentence {'negates' if concept.present else 'asserts'} it",
                   Fix(op="delete_sentence"), entity=ent, ids=concept.evidence, found=claims_present,
                   expected=concept.present)
        else:
            good = concept_sentence(ev, key, s)
            st.add("negation", m.span(), f"{key} is {'present' if concept.present else 'absent'}, the draft "
                   f"{'asserts' if claims_present else 'negates'} it",
                   Fix(op="replace_sentence", text=good) if good else Fix(op="delete_sentence"),
                   entity=ent, ids=concept.evidence, found=claims_present, expected=concept.present)


def _read(section: str, idx: int, text: str, ev: Evidence, decimals: int) -> _Sentence | None:
    """First pass over one sentence: numbers, entities, sides, zones, categories (None: metadata)."""
    if METADATA.search(text):  # header, disclaimer, evidence table: not a finding
        return None
    st = _Sentence(section, idx, text, ev)
    closed = UNSUPPORTED_FINDINGS.search(text)
    if closed:  # closed world: a finding no evidence of ours holds, whatever else the sentence shares
        st.add("unsupported", closed.span(), f"{closed.group(0)!r}: the evidence holds no such finding",
               Fix(op="delete_sentence"), found=closed.group(0))
        st.closed = True
        return st
    taken = _numbers(st, decimals)
    _unlinked(st, taken, decimals)
    _entities(st)
    _sides(st)
    _zones(st)
    _categories(st)
    return st


def _finish(st: _Sentence, stated_elsewhere: set[tuple[str, bool]], numbered_elsewhere: set[str]) -> list[Issue]:
    """Second pass: the findings' polarity, knowing what the other sentences state."""
    if st.closed:
        return st.issues
    _concepts(st, stated_elsewhere, numbered_elsewhere)
    if SUBJECTS.get(st.ev.domain) is not None and SUBJECTS[st.ev.domain].search(st.s):
        st.grounded = True
    if not st.grounded:
        st.add("unsupported", (0, len(st.s)), "the sentence states nothing the evidence holds",
               Fix(op="delete_sentence"))
    return st.issues


def _no_abnormal_segments(draft: Draft, ev: Evidence) -> set[str]:
    """"No regional wall motion abnormality" states a count of 0 abnormal segments."""
    f = ev.fact("heart", "n_abnormal_segments")
    if f is None or f.value != 0:
        return set()
    for _, _, t in draft.sentences():
        if any(k == "regional wall motion abnormality" and not p for k, p, *_ in concept_mentions(t, ev.domain)):
            return {f.id}
    return set()


def _label_mentioned(text: str, ev: Evidence) -> bool:
    if not ev.label:
        return True
    if f"`{ev.label}`" in text:
        return True
    if ev.label.startswith("PI-RADS"):  # the overall category, not a lesion's (a sentence without a lesion id)
        return any(int(m.group(1) or m.group(2)) == int(ev.label.split()[-1]) for line in text.split("\n")
                   if not LESION_ID.search(line) for m in PIRADS.finditer(line))
    if ev.label in ("HGG", "LGG"):
        return (any((m.group(1) or f"{m.group(2)[0]}GG").upper() == ev.label for m in GRADE.finditer(text))
                or any(who_grade(m) == ev.label for m in WHO_GRADE.finditer(text)))
    pat = ACDC_PHRASE.get(ev.label)
    return bool(pat and pat.search(text))


def _any_label(text: str, ev: Evidence) -> bool:
    if ev.label.startswith("PI-RADS"):
        return any(PIRADS.search(line) for line in text.split("\n") if not LESION_ID.search(line))
    if ev.label in ("HGG", "LGG"):
        return bool(GRADE.search(text) or WHO_GRADE.search(text))
    return bool(ACDC_CODE.search(text)) or any(p.search(text) for p in ACDC_PHRASE.values())


def _missing(draft: Draft, ev: Evidence, decimals: int, stated: set[str] = frozenset()) -> list[Issue]:
    prose = "\n".join(draft.findings + draft.impression)
    cited = set(re.findall(r"`\[([^`]+?)\]`", prose)) | set(stated)
    issues: list[Issue] = []
    by_entity: dict[str, list[str]] = {}
    for fid in ev.required_ids():
        if fid not in cited:
            by_entity.setdefault(ev.facts[fid].entity, []).append(fid)
    for entity, ids in by_entity.items():
        sentences, section = _sentences_citing(ev, ids, decimals)
        issues.append(Issue(type="missing", section=section, entity=entity, evidence_ids=ids,
                            expected=[ev.facts[i].key for i in ids],
                            message=f"{entity}: {', '.join(ev.facts[i].key for i in ids)} not reported",
                            fix=Fix(op="insert", sentences=sentences) if sentences else Fix(op="none")))
    impression = "\n".join(draft.impression)
    if not _label_mentioned(impression, ev) and not _any_label(impression, ev):  # a wrong label is a contradiction
        sentences = [x for slot in default_plan(ev) if slot.endswith("impression")
                     for x in slot_sentences(ev, slot, decimals) if _label_mentioned(x, ev)]
        issues.append(Issue(type="missing", section="impression", entity="label", evidence_ids=[ev.label_id],
                            expected=ev.label, message=f"the impression does not state {ev.label}",
                            fix=Fix(op="insert", sentences=sentences[:1])))
    return issues


def _sentences_citing(ev: Evidence, ids: list[str], decimals: int) -> tuple[list[str], str]:
    out, section, want = [], "findings", set(ids)
    for slot in default_plan(ev):
        for sent in slot_sentences(ev, slot, decimals):
            if want & set(re.findall(r"`\[([^`]+?)\]`", sent)):
                out.append(sent)
                section = "impression" if slot.endswith("impression") and not out[:-1] else section
                want -= set(re.findall(r"`\[([^`]+?)\]`", sent))
    return out, section


def _boxes(draft: Draft, ev: Evidence) -> list[Issue]:
    issues = []
    have = {b.lesion: b for b in draft.boxes}
    for e in ev.lesions():
        if not e.box_voxel:
            continue
        b = have.get(e.id)
        if b is None:
            issues.append(Issue(type="missing", section="boxes", entity=e.id, expected=e.box_voxel,
                                message=f"no box for {e.id}", fix=Fix(op="set_box", box=e.box_voxel)))
            continue
        iou = box_iou(b.box_voxel, e.box_voxel)
        if iou < BOX_IOU_MIN:
            issues.append(Issue(type="localization", section="boxes", entity=e.id, found=b.box_voxel,
                                expected=e.box_voxel, message=f"{e.id} box IoU {iou:.2f} < {BOX_IOU_MIN}",
                                fix=Fix(op="set_box", box=e.box_voxel)))
    for lid in have:
        if lid not in ev.entities:
            issues.append(Issue(type="unsupported", section="boxes", entity=lid, found=have[lid].box_voxel,
                                message=f"box for {lid}, which is not among the findings",
                                fix=Fix(op="set_box", box=None)))
    return issues


def reflect(draft: Draft, ev: Evidence, decimals: int = 1) -> list[Issue]:
    """Every issue of ``draft`` against ``ev``, deduplicated (one issue per type and span)."""
    issues: list[Issue] = []
    sentences = draft.sentences()
    claims = [{(k, p) for k, p, *rest in concept_mentions(t, ev.domain) if not rest[-1]} for _, _, t in sentences]
    read = [_read(section, idx, text, ev, decimals) for section, idx, text in sentences]
    numbered = [{ev.facts[i].entity for i in st.stated} if st else set() for st in read]
    for n, st in enumerate(read):
        if st is None:
            continue
        elsewhere = set().union(*(c for j, c in enumerate(claims) if j != n)) if len(claims) > 1 else set()
        issues += _finish(st, elsewhere, set().union(*(x for j, x in enumerate(numbered) if j != n)))
    stated = {i for st in read if st for i in st.stated} | _no_abnormal_segments(draft, ev)
    # a fact written with a wrong value is a contradiction, not also an omission (its repair states it)
    stated |= {x for i in issues if i.type in ("contradiction", "localization") for x in i.evidence_ids}
    issues += _missing(draft, ev, decimals, stated)
    issues += _boxes(draft, ev)
    seen, out = set(), []
    for i in issues:
        if i.key() not in seen:
            seen.add(i.key())
            out.append(i)
    return out


__all__ = ["BOX_IOU_MIN", "concept_mentions", "concept_sentence", "reflect"]
