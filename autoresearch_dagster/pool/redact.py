"""Owns PII redaction: detection, keyed consistent format-preserving surrogates, structure-aware traversal.

Surrogate = G_type(HMAC-SHA256(K, type | normalized value)). K comes from the environment variable
AUTORESEARCH_REDACTION_KEY, else a random per-process key that is never written anywhere. The
same value therefore gets the same surrogate everywhere in a pool (shared prefixes stay shared),
in every worker process. Surrogates keep character classes (letter -> letter with case, digit ->
digit, punctuation kept), so lengths and the approximate token count are unchanged; names and
streets come from lists of the same length. Checksummed identifiers are made deliberately invalid
(cards fail Luhn, IBANs fail mod-97, SSNs get the never-issued area 9xx) so a surrogate can never
be a real number.

What is found (patterns here, library-backed detectors in ``pool.pii_detect``): e-mail addresses;
phone numbers in every region's national and international formats (libphonenumber); payment
cards (12-19 digits, issuer prefix and Luhn checked); IBANs (any case, spaced or not; mod-97);
US SSNs and national ids of FR, IT, ES, BR, NL, IN, CA, DE, AU, IE (python-stdnum checksums) and
UK NI numbers; IPv4/IPv6; secrets (cloud keys and secret keys, GitHub/Slack/Stripe/Google tokens,
JWTs, Bearer tokens, PEM private keys, passwords and keys in assignments, credentials in URLs,
high-entropy tokens); dates of birth, passport and driving-licence numbers after a cue; person
names, places and facilities (spaCy NER on the sentences where a name can be, honorific/greeting/
signature cues, Faker's first names before a capitalised word); street addresses in English,
Romance, German and Dutch shapes. Organisations are found only with AUTORESEARCH_REDACTION_ORGS=1
(company names are not personal data and fill system prompts). Each distinct text is analysed
once per process (content-addressed cache), so repeated system prompts, documents and resent
conversation turns cost one analysis.
What is not: a lone surname or first name with no cue that NER misses, postal codes on their own,
PII inside images or other non-text parts.
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import math
import os
import re
from collections import Counter
from typing import Any, Callable, Iterator

from autoresearch_dagster.pool import pii_detect
from autoresearch_dagster.pool.pii_detect import iban_valid

KEY_ENV = "AUTORESEARCH_REDACTION_KEY"
PII_TYPES = ("email", "phone", "card", "iban", "ssn", "national_id", "ipv4", "ipv6", "url_secret", "api_key", "dob",
             "passport", "licence", "person", "address", "location", "organization")

FIRST_NAMES = frozenset("""
James Mary Robert Patricia John Jennifer Michael Linda David Elizabeth William Barbara Richard Susan
Joseph Jessica Thomas Sarah Charles Karen Christopher Lisa Daniel Nancy Matthew Betty Anthony Sandra
Donald Ashley Steven Kimberly Paul Emily Andrew Donna Joshua Michelle Kenneth Carol Kevin Amanda Brian
Melissa George Deborah Timothy Stephanie Ronald Rebecca Jason Sharon Edward Laura Jeffrey Cynthia Ryan
Kathleen Jacob Amy Gary Angela Nicholas Shirley Eric Anna Jonathan Brenda Stephen Pamela Larry Emma
Justin Nicole Scott Helen Brandon Samantha Benjamin Katherine Samuel Christine Gregory Debra Alexander
Rachel Patrick Carolyn Frank Janet Raymond Catherine Jack Maria Dennis Heather Jerry Diane Tyler Olivia
Aaron Julie Jose Joyce Adam Victoria Nathan Kelly Henry Christina Zachary Lauren Douglas Joan Peter
Evelyn Kyle Judith Noah Megan Ethan Andrea Jeremy Cheryl Walter Hannah Christian Jacqueline Keith Martha
Roger Gloria Terry Teresa Austin Ann Sean Sara Gerald Madison Carl Frances Harold Kathryn Dylan Janice
Arthur Jean Lawrence Abigail Jordan Alice Jesse Judy Bryan Sophia Billy Lucas Mateo Amelia Liam Mia
Ahmed Mohammed Fatima Wei Li Priya Raj Hiroshi Yuki Olga Ivan Pierre Marie Hans Giulia Carlos Lucia
""".split())
# Surrogate pools (fictional-enough common names); chosen by HMAC among same-length entries.
_SUR_FIRST = sorted(FIRST_NAMES)
_SUR_LAST = sorted("""
Abbott Acosta Adler Baker Banks Barton Bell Bishop Black Boyd Brooks Burke Carr Chase Cole Cross Dale Dean
Dixon Drake Dunn Ellis Evans Fields Fisher Flynn Ford Fox Frost Gale Grant Gray Hale Hardy Hayes Hicks Hill
Holt Hunt Kane Keller Klein Knox Lamb Lane Lowe Lynch Marsh Mason Meyer Monroe Moss Nash Noble Olsen Owen
Page Parks Pierce Quinn Reed Reese Rhodes Rowe Rush Sharp Shaw Stone Swift Tate Todd Vance Wade Walsh Ward
Webb West Wolfe Wood Wyatt York Young Zimmer Albright Bancroft Carrington Dillinger Fairbanks Hollister
Kensington Lancaster Pemberton Whitfield Worthington Castellano Fitzgerald Montgomery Richardson Carlson
Donovan Garrett Holland Jenkins Lambert Mathews Sanders Simmons Stevens Sullivan Thornton Whitaker Harrington
Wellington Hutchinson Fairweather Abernathy Kingsley Blackwood Templeton Winchester Livingston Castillo
""".split())
_SUR_STREET = sorted("Maple Cedar Birch Aspen Willow Spruce Juniper Magnolia Chestnut Hawthorn Linden Alder "
                     "Poplar Laurel Sycamore Holly Ivy Fern Sage Hazel Orchard Meadow Ridge Brook River Harbor Lincoln "
                     "Franklin Jefferson Riverside Greenwood Lakeshore Evergreen Cottonwood Brookfield Springdale "
                     "Wildflower Blackberry Huckleberry".split())

# Common lower-case words (and names) for e-mail surrogates: tokenizers split them like real addresses.
_SUR_WORDS = sorted({w.lower() for w in _SUR_FIRST + _SUR_LAST + _SUR_STREET} | set(
    "mail info team admin sales hello office news alpha beta delta gamma north south east west river lake "
    "stone field house home work mail post data cloud tech group media labs global online service support "
    "contact center market store shop trade print press studio design health care first".split()))

_HONORIFIC = re.compile(r"\b(?:Mr|Mrs|Ms|Miss|Mx|Dr|Prof|Sir|Madam|Mme|Herr|Frau)\.?\s+"
                        r"([A-Z][a-z]+(?:[ -][A-Z][a-z]+)?)")
_INTRO = re.compile(r"\b(?:[Mm]y name is|[Cc]all me|[Nn]ame:|[Ss]igned,?)\s+([A-Z][a-z]+(?:\s+[A-Z][a-z]+){0,2})")
_GREETING = re.compile(r"\b(?:Dear|Hi|Hello|Hey|Thanks|Thank you|I am|I'm|This is)\s+([A-Z][a-z]+(?:\s+[A-Z][a-z]+)?)")
_SIGNATURE = re.compile(r"\b(?:Regards|Thanks|Thank you|Cheers|Best|Sincerely|Best regards|Kind regards|Yours)"
                        r",?[ \t]*\r?\n[ \t]*([A-Z][a-z]+(?:[ \t]+[A-Z][a-z]+)?)")
_STREET_SUFFIX = (r"Street|St|Avenue|Ave|Road|Rd|Boulevard|Blvd|Lane|Ln|Drive|Dr|Court|Ct|Way|Place|Pl|Terrace|"
                  r"Circle|Cir|Parkway|Pkwy|Highway|Hwy|Square|Sq|Trail|Alley")
_ADDRESS = re.compile(r"\b\d{1,6}[A-Za-z]?\s+(?:[NSEW]\.?\s+)?(?:[A-Z][a-z]+\.?\s+){1,3}(?:" + _STREET_SUFFIX + r")\b\.?")
_EMAIL = re.compile(r"[A-Za-z0-9._%+'-]+@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
_URL = re.compile(r"\b(?:https?|ftp|wss?|postgres(?:ql)?|mysql|mongodb(?:\+srv)?|redis|amqp)://[^\s\"'<>\\]+")
_URL_SECRET_PARAM = re.compile(r"(?i)(?:^|[?&;])((?:[a-z]+[_-])*(?:token|key|apikey|"
                               r"secret|password|passwd|pwd|sig|signature|auth|code|credential|session)[A-Za-z_]*)=([^&#;]+)")
_CARD = re.compile(r"(?<![\d.,-])\d(?:[ -]?\d){11,18}(?![\d])")
_SSN = re.compile(r"(?<![\d-])(\d{3})-(\d{2})-(\d{4})(?![\d-])")
_SSN_PLAIN = re.compile(r"(?i)\b(?:ssn|social security(?: number| no\.?)?)\s*(?:is|:|#|no\.?)?\s*(\d{9})\b")
_PHONE_NANP = re.compile(r"(?<![\w+])(?:\+?1[\s.-]?)?(?:\(\d{3}\)\s?|\d{3}[\s.-])\d{3}[\s.-]\d{4}(?![\w-])")
_PHONE_INTL = re.compile(r"(?<![\w+])\+\d{1,3}(?:[\s.-]?\(?\d{1,5}\)?){2,5}(?![\w-])")
_IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?\b")
_IPV4 = re.compile(r"(?<![\w.])(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?![\w]|\.\d)")
_IPV6 = re.compile(r"(?<![\w:.])(?:[0-9A-Fa-f]{1,4}:){1,7}(?::|(?::[0-9A-Fa-f]{1,4}){1,7}|[0-9A-Fa-f]{1,4})(?![\w:])"
                   r"|(?<![\w:])::(?:[0-9A-Fa-f]{1,4}:){0,6}[0-9A-Fa-f]{1,4}(?![\w:])")
_KEY_SHAPES = re.compile(
    r"\bsk-(?:proj-|ant-(?:api\d\d-)?|live-|test-|svcacct-)?[A-Za-z0-9_-]{20,}"
    r"|\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"
    r"|\bgh[pousr]_[A-Za-z0-9]{30,}\b|\bgithub_pat_[A-Za-z0-9_]{30,}"
    r"|\bxox[abposr]-[A-Za-z0-9-]{10,}"
    r"|\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{8,}"
    r"|\bAIza[0-9A-Za-z_-]{35}"
    r"|\b(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}"
    r"|\bhf_[A-Za-z0-9]{30,}|\bglpat-[A-Za-z0-9_-]{20,}|\bSG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}"
    r"|\bnpm_[A-Za-z0-9]{30,}|\bpypi-[A-Za-z0-9_-]{30,}")
_WEBHOOK = re.compile(r"(?i)hooks\.slack\.com/services/|discord(?:app)?\.com/api/webhooks/|/webhooks?/[\w-]{16,}|"
                      r"[?&](?:X-Amz-(?:Credential|Signature)|sig|signature)=")
_MAPPED_V4 = re.compile(r"(?i)(?<![\w:])::ffff:(?:\d{1,3}\.){3}\d{1,3}(?![\w.])")
_BEARER = re.compile(r"\b[Bb]earer\s+([A-Za-z0-9._~+/-]{12,}=*)")
_KV_SECRET = re.compile(r"(?i)(?:\b|_)(?:[a-z0-9]+_)*(?:token|api[_-]?key|secret(?:[_-]?(?:access[_-]?)?key)?|access[_-]?token|auth[_-]?token|"
                        r"client[_-]?secret|private[_-]?key|password|passwd|passphrase|pwd|pass)"
                        r"[\"']?\s*(?:[:=]|\bis\b)\s*[\"']?([^\s\"',;`]{6,})")
_PEM = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----")
_KEEP_PREFIX = re.compile(r"^(?:sk-(?:proj-|ant-(?:api\d\d-)?|live-|test-|svcacct-)?|AKIA|ASIA|gh[pousr]_|github_pat_|"
                          r"xox[abposr]-|eyJ|AIza|(?:sk|rk|pk)_(?:live|test)_)")

# Keys of tool definitions / JSON schemas whose string values are structure, never redacted.
STRUCTURAL_KEYS = frozenset({"type", "name", "$ref", "$schema", "$id", "format", "pattern", "required", "role",
                             "tool_call_id", "id", "strict", "additionalProperties"})


def luhn_valid(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


# Issuer prefixes by card length (ISO/IEC 7812 ranges of the major schemes): a Luhn-valid barcode
# or account number of another shape is not a card.
_CARD_IIN = {
    12: ("50", "56", "57", "58", "6"), 13: ("4", "50", "56", "57", "58", "6"),
    14: ("30", "36", "38", "39", "50", "56", "57", "58", "6"),
    15: ("34", "37", "2131", "1800", "50", "56", "57", "58", "6"),
    16: ("4", "2", "5", "6", "35"), 17: ("50", "56", "57", "58", "6"), 18: ("50", "56", "57", "58", "6"),
    19: ("4", "50", "56", "57", "58", "6", "35"),
}


def card_shaped(digits: str) -> bool:
    return digits.startswith(_CARD_IIN.get(len(digits), ("\x00",)))


def _entropy(s: str) -> float:
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values())


def _looks_secret(tok: str) -> bool:
    classes = (any(c.islower() for c in tok), any(c.isupper() for c in tok), any(c.isdigit() for c in tok))
    return sum(classes) >= 2 and any(c.isdigit() for c in tok) and _entropy(tok) >= 3.5


Span = tuple[int, int, str, str]  # start, end, type, normalized value


# Candidate regions: a detector's pattern runs only inside windows around cheap "hints" (a digit run,
# an "@", a keyword), found with str.find or with patterns that start with a character class (which
# the regex engine skips through quickly). The hints are necessary conditions of each pattern.
_DIGIT_RUN = re.compile(r"\d(?:[\d \t().+/-]{5,}\d|\d{0,2}\.\d)")
_SUFFIX_HINT = re.compile(_STREET_SUFFIX)
_IPV6_HINT = re.compile(r"[0-9A-Fa-f]:[0-9A-Fa-f]*:")
_CAP_PAIR = re.compile(r"([A-Z][a-z]+)\s+([A-Z][a-z]+(?:-[A-Z][a-z]+)?)\b")
# Hints that start with a capital letter are found in one pass of a literal alternation (the regex
# engine skips straight to capital letters); the few lower-case ones with str.find.
_HINT_GROUPS = {
    "honorific": ("Mrs", "Mr", "Ms", "Miss", "Mx", "Dr", "Prof", "Sir", "Madam", "Mme", "Herr", "Frau"),
    "intro": ("Name", "Signed", "name is", "all me", "igned"),
    "signature": ("Regards", "Thanks", "Thank you", "Cheers", "Best", "Sincerely", "Yours", "regards"),
    "greeting": ("Dear", "Hi", "Hello", "Hey", "Thank", "I am", "I'm", "This is"),
    "key": ("AKIA", "ASIA", "AIza", "sk-", "_", "xox", "eyJ", "glpat-", "SG.", "pypi-"),
    "bearer": ("earer",),
}
_UPPER_HINT_GROUPS: dict[str, list[str]] = {}
_LOWER_HINT_GROUPS: dict[str, list[str]] = {}
for _group, _hints in _HINT_GROUPS.items():
    for _h in _hints:
        (_UPPER_HINT_GROUPS if _h[0].isupper() else _LOWER_HINT_GROUPS).setdefault(_h, []).append(_group)
_UPPER_HINTS = re.compile("|".join(re.escape(h) for h in sorted(_UPPER_HINT_GROUPS, key=len, reverse=True)))


def _hint_positions(text: str) -> dict[str, list[int]]:
    """Offsets of each detector group's hints in ``text``."""
    out: dict[str, list[int]] = {}
    for m in _UPPER_HINTS.finditer(text):
        for g in _UPPER_HINT_GROUPS[m.group()]:
            out.setdefault(g, []).append(m.start())
    for h, groups in _LOWER_HINT_GROUPS.items():
        i = text.find(h)
        while i >= 0:
            for g in groups:
                out.setdefault(g, []).append(i)
            i = text.find(h, i + 1)
    return out


_KV_HINTS = ("key", "secret", "token", "pwd", "pass")
_LONG_TOKEN = re.compile(r"[A-Za-z0-9_+/-]{24,}={0,2}")
_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_+/=-")


def _find_all(text: str, needles: tuple[str, ...]) -> list[int]:
    out = []
    for n in needles:
        i = text.find(n)
        while i >= 0:
            out.append(i)
            i = text.find(n, i + 1)
    return out


def _windows(points: list[tuple[int, int]], before: int, after: int, n: int) -> list[tuple[int, int]]:
    """Merged [start, end) windows around (start, end) hits."""
    out: list[tuple[int, int]] = []
    for s0, e0 in sorted(points):
        s1, e1 = max(0, s0 - before), min(n, e0 + after)
        if out and s1 <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e1))
        else:
            out.append((s1, e1))
    return out


def _scan(rx: re.Pattern, text: str, windows: list[tuple[int, int]]) -> Iterator[re.Match]:
    for s0, e0 in windows:
        yield from rx.finditer(text, s0, e0)


def _near(text: str, hints: tuple[str, ...], before: int, after: int) -> list[tuple[int, int]]:
    return _windows([(i, i) for i in _find_all(text, hints)], before, after, len(text))


def _spans(text: str, ner: bool = True) -> list[Span]:
    """All candidate PII spans (start, end, type, normalized value), before overlap resolution
    (``ner=False``: all but the NER model's, which ``find_pii_many`` runs batched)."""
    out: list[Span] = []
    add = out.append
    n = len(text)
    if "://" in text:
        for m in _scan(_URL, text, _near(text, ("://",), 20, 2048)):
            url, base = m.group().rstrip("`.,;:!?)]}'"), m.start()
            scheme_end = url.index("://") + 3
            at = url.find("@", scheme_end, url.find("/", scheme_end) if url.find("/", scheme_end) > 0 else len(url))
            secret = False
            if at > scheme_end:
                add((base + scheme_end, base + at, "url_secret", url[scheme_end:at]))
                secret = True
            q = url.find("?")
            if q >= 0:
                for pm in _URL_SECRET_PARAM.finditer(url, q):
                    add((base + pm.start(2), base + pm.end(2), "url_secret", pm.group(2)))
                    secret = True
            path = url[scheme_end:q if q >= 0 else len(url)]
            if _WEBHOOK.search(url) or any(len(seg) >= 20 and _looks_secret(seg) for seg in path.split("/")[1:]):
                secret = True
            if secret:  # a URL that carries a credential is the credential: all of it goes
                add((base, base + len(url), "url_secret", url))
    hints = _hint_positions(text)

    def near(group: str, before: int, after: int) -> list[tuple[int, int]]:
        return _windows([(i, i) for i in hints.get(group, ())], before, after, n)

    for m in _scan(_KEY_SHAPES, text, near("key", 16, 4096)):
        add((m.start(), m.end(), "api_key", m.group()))
    for m in _scan(_BEARER, text, near("bearer", 1, 1024)):
        add((m.start(1), m.end(1), "api_key", m.group(1)))
    lower = text.lower()
    kv = _near(lower, _KV_HINTS, 24, 256)
    for m in _scan(_KV_SECRET, text, kv):
        add((m.start(1), m.end(1), "api_key", m.group(1)))
    if "@" in text:
        for m in _scan(_EMAIL, text, _near(text, ("@",), 128, 256)):
            add((m.start(), m.end(), "email", m.group().lower()))
    chars = set(text)
    if not chars.isdisjoint("0123456789"):
        digit_win = _windows([m.span() for m in _DIGIT_RUN.finditer(text)], 48, 48, n)
        for m in _scan(_IBAN, text, digit_win):
            if iban_valid(m.group()):
                add((m.start(), m.end(), "iban", m.group().replace(" ", "")))
        for m in _scan(_CARD, text, digit_win):
            digits = re.sub(r"\D", "", m.group())
            if card_shaped(digits) and luhn_valid(digits):
                add((m.start(), m.end(), "card", digits))
        if "-" in chars:
            for m in _scan(_SSN, text, digit_win):
                a, g, s = m.groups()
                if a not in ("000", "666") and a[0] != "9" and g != "00" and s != "0000":
                    add((m.start(), m.end(), "ssn", a + g + s))
        for m in _scan(_SSN_PLAIN, text, _windows([(i, i) for i in _find_all(lower, ("ssn", "social security"))],
                                                  2, 64, n)):
            add((m.start(1), m.end(1), "ssn", m.group(1)))
        for rx in ((_PHONE_NANP, _PHONE_INTL) if "+" in chars else (_PHONE_NANP,)):
            for m in _scan(rx, text, digit_win):
                digits = re.sub(r"\D", "", m.group())
                if 10 <= len(digits) <= 15:
                    add((m.start(), m.end(), "phone", digits))
        if "." in chars:
            for m in _scan(_IPV4, text, digit_win):
                add((m.start(), m.end(), "ipv4", m.group()))
            if "::" in text:
                for m in _MAPPED_V4.finditer(text):
                    add((m.start(), m.end(), "ipv6", m.group().lower()))
        for m in _scan(_ADDRESS, text, _windows([m.span() for m in _SUFFIX_HINT.finditer(text)], 96, 2, n)):
            add((m.start(), m.end(), "address", m.group().lower()))
    if ":" in chars:
        for m in _scan(_IPV6, text, _windows([m.span() for m in _IPV6_HINT.finditer(text)], 40, 40, n)):
            cand = m.group()
            if cand.count(":") >= 2:
                try:
                    ipaddress.IPv6Address(cand)
                except ValueError:
                    continue
                add((m.start(), m.end(), "ipv6", cand.lower()))
    if max(map(len, text.split()), default=0) >= 24:
        for m in _LONG_TOKEN.finditer(text):
            s0, e0 = m.start(), m.end()
            if (s0 == 0 or (text[s0 - 1] not in _TOKEN_CHARS and text[s0 - 1] != ".")) and \
                    (e0 == n or text[e0] not in _TOKEN_CHARS) and _looks_secret(m.group()):
                add((s0, e0, "api_key", m.group()))
    if "-----BEGIN" in text:
        for m in _PEM.finditer(text):
            add((m.start(), m.end(), "api_key", m.group()))
    if not chars.isdisjoint("0123456789"):
        out.extend(pii_detect.phone_spans(text))
        out.extend(pii_detect.id_spans(text))
        out.extend(pii_detect.address_spans(text))
    out.extend(pii_detect.gazetteer_person_spans(text))
    out.extend(pii_detect.context_spans(text))
    if ner and _ner_enabled():
        out.extend(pii_detect.ner_spans(text, found=list(out)))
    for rx, group, after in ((_HONORIFIC, "honorific", 48), (_INTRO, "intro", 64), (_SIGNATURE, "signature", 64)):
        for m in _scan(rx, text, near(group, 16, after)):
            add((m.start(1), m.end(1), "person", m.group(1)))
    for m in _scan(_GREETING, text, near("greeting", 1, 48)):
        if m.group(1).split()[0] in FIRST_NAMES:
            add((m.start(1), m.end(1), "person", m.group(1)))
    for m in _CAP_PAIR.finditer(text):
        s0 = m.start()
        if m.group(1) in FIRST_NAMES and (s0 == 0 or not text[s0 - 1].isalnum()):
            add((s0, m.end(), "person", m.group()))
    return out


# Where detections overlap they merge into one span; its kind is the highest-priority one, or
# "a+b" when several kinds met (such a span gets a class-preserving scramble, which keeps no digit
# or letter of any of them).
_PRIORITY = {t: i for i, t in enumerate(("url_secret", "api_key", "email", "iban", "card", "ssn", "national_id",
                                         "passport", "licence", "dob", "ipv6", "ipv4", "phone", "address", "person",
                                         "location", "organization"))}
_NER_ENV = "AUTORESEARCH_REDACTION_NER"


def _ner_enabled() -> bool:
    """spaCy NER runs unless AUTORESEARCH_REDACTION_NER=0 or its model package is not installed."""
    return os.environ.get(_NER_ENV, "1") != "0" and pii_detect.ner_available()


def load_models() -> None:
    """Load the NER model now (when enabled) rather than at the first text: a pool build calls it before
    it creates its temp dir, so a signal during the slow import (spaCy pulls in torch, whose import
    aborts the process when interrupted) meets a process that has nothing on disk yet."""
    if _ner_enabled():
        pii_detect.load_nlp()


def find_pii(text: str) -> list[Span]:
    """Non-overlapping PII spans in ``text``, in order (overlapping detections merged)."""
    return _resolve(text, _spans(text))


def find_pii_many(texts: list[str], batch_size: int = 256) -> list[list[Span]]:
    """``find_pii`` of each text, the NER model run over all their sentences in batches (faster
    than one text at a time)."""
    rules = [_spans(t, ner=False) for t in texts]
    ner = pii_detect.ner_spans_many(texts, batch_size, found=rules) if _ner_enabled() else [[] for _ in texts]
    return [_resolve(t, r + extra) for t, r, extra in zip(texts, rules, ner)]


def _resolve(text: str, found: list[Span]) -> list[Span]:
    spans = sorted(pii_detect.extend_addresses(text, found), key=lambda s: (s[0], -(s[1] - s[0])))
    out: list[Span] = []
    for s in spans:
        if out and s[0] < out[-1][1]:
            a, b, kind, norm = out[-1]
            if s[1] <= b:  # inside the span before: that one's kind stands, unless both are one extent
                if (s[0], s[1]) == (a, b) and "+" not in kind and _PRIORITY[s[2]] < _PRIORITY[kind]:
                    out[-1] = s
                continue
            kinds = set(kind.split("+")) | {s[2]}
            merged = "+".join(sorted(kinds, key=_PRIORITY.__getitem__))
            out[-1] = (a, s[1], merged, text[a:s[1]].lower())
        else:
            out.append(s)
    return out


class Redactor:
    """Redacts strings and request structures; keeps per-type counts of replaced occurrences."""

    def __init__(self, key: bytes | None = None, *, counter: Callable[[str], int] | None = None,
                 tries: int = 12, max_cache: int = 200_000):
        """``counter``: the serving tokenizer's count; when given, each surrogate is drawn (up to
        ``tries`` keyed candidates) to have the original value's token count, else the closest."""
        if key is None:
            env = os.environ.get(KEY_ENV)
            key = env.encode() if env else os.urandom(32)
        self._key = key
        self._counter = counter
        self._tries = tries
        self.counts: Counter[str] = Counter()
        self._sur: dict[tuple[str, str], str] = {}
        # long texts recur (shared system prompts, documents, earlier turns): cache their redaction
        self._text_cache: dict[str, tuple[str, tuple[tuple[str, int], ...]]] = {}
        self._cache_chars = 0
        self._max_cache = max_cache

    # --- surrogates -------------------------------------------------------------------------------
    def _stream(self, kind: str, norm: str, n: int) -> bytes:
        d = hmac.new(self._key, f"{kind}\x00{norm}".encode(), hashlib.sha256).digest()
        return d if n <= len(d) else hashlib.shake_256(d).digest(n)

    @staticmethod
    def _scramble(value: str, stream: bytes, *, hex_only: bool = False) -> str:
        out = []
        for i, ch in enumerate(value):
            b = stream[i % len(stream)] ^ (i // len(stream) * 131 & 0xFF)
            if ch.isdigit():
                out.append(chr(48 + b % 10))
            elif hex_only and ch in "abcdef":
                out.append(chr(97 + b % 6))
            elif hex_only and ch in "ABCDEF":
                out.append(chr(65 + b % 6))
            elif hex_only:
                out.append(ch)
            elif ch.isalpha():
                out.append(chr((65 if ch.isupper() else 97) + b % 26))
            else:
                out.append(ch)
        return "".join(out)

    @staticmethod
    def _pick(words: list[str], word: str, b: int) -> str:
        same = [w for w in words if len(w) == len(word) and w != word]
        if not same:
            return ""
        w = same[b % len(same)]
        return w.upper() if word.isupper() else w

    def surrogate(self, kind: str, value: str, norm: str) -> str:
        key = (kind, norm, value)
        hit = self._sur.get(key)
        if hit is not None:
            return hit
        s = self._candidate(kind, value, norm, 0)
        if self._counter is not None:  # counted after a space, as values mostly appear in running text
            target = self._counter(" " + value)
            best, best_d = s, abs(self._counter(" " + s) - target)
            for k in range(1, self._tries):
                if best_d == 0:
                    break
                cand = self._candidate(kind, value, norm, k)
                d = abs(self._counter(" " + cand) - target)
                if d < best_d:
                    best, best_d = cand, d
            s = best
        if len(self._sur) >= self._max_cache:
            self._sur.clear()
        self._sur[key] = s
        return s

    def _candidate(self, kind: str, value: str, norm: str, k: int) -> str:
        """The k-th keyed surrogate candidate for a value (k = 0 unless matching a tokenizer's count)."""
        st = self._stream(kind if k == 0 else f"{kind}#{k}", norm, max(32, 2 * len(value)))
        if "+" in kind:  # several kinds overlapped: no structure to keep but character classes
            s = self._scramble(value, st)
        elif kind == "card":
            s = value[0] + self._scramble(value[1:], st)
            digits = re.sub(r"\D", "", s)
            if luhn_valid(digits):  # deliberately invalid: flip the last digit
                last = s.rfind(digits[-1])
                s = s[:last] + str((int(digits[-1]) + 1) % 10) + s[last + 1:]
        elif kind == "iban":
            s = value[:2] + self._scramble(value[2:], st)
            if iban_valid(s):
                s = s[:2] + str((int(s[2]) + 1) % 10) + s[3:]
        elif kind == "ssn":
            s = self._scramble(value, st)
            s = "9" + s[1:]
        elif kind == "ipv4":
            octs = value.split(".")
            new = []
            for i, o in enumerate(octs):
                b = st[i] + 256 * st[i + 4]
                new.append(str([b % 10, 10 + b % 90, 100 + b % 156][len(o) - 1]))
            s = ".".join(new)
        elif kind == "ipv6":
            s = self._scramble(value, st, hex_only=True)
        elif kind == "api_key":
            m = _KEEP_PREFIX.match(value)
            keep = m.end() if m else 0
            s = value[:keep] + self._scramble(value[keep:], st)
        elif kind == "person":
            s = self._names(value, st, [_SUR_FIRST] + [_SUR_LAST] * 4)
        elif kind in ("location", "organization"):
            s = self._names(value, st, [_SUR_LAST])
        elif kind == "address":
            s = self._address(value, st)
        elif kind == "email":  # letter runs become words of the same length; the TLD stays
            local, _, domain = value.rpartition("@")
            host, _, tld = domain.rpartition(".")
            s = f"{self._wordy(local, st)}@{self._wordy(host, st[7:] + st[:7])}.{tld}"
        elif kind == "url_secret" and "://" in value:  # scheme kept, the rest word-shaped or scrambled
            scheme, _, rest = value.partition("://")
            s = scheme + "://" + self._wordy(rest, st)
        else:  # phone, url_secret: class-preserving
            s = self._scramble(value, st)
        if s == value:  # vanishingly rare; make sure nothing passes through unchanged
            s = self._scramble(value, self._stream(kind + "!", norm, max(32, 2 * len(value))))
        return s

    def _wordy(self, value: str, st: bytes) -> str:
        """Letter runs -> same-length common words (keeps case shape), digits scrambled, rest kept."""
        out = []
        for i, run in enumerate(re.split(r"([^\W\d_]+)", value)):
            if run and run[0].isalpha():
                w = self._pick(_SUR_WORDS, run.lower(), st[i % len(st)] * 256 + st[(i + 3) % len(st)])
                if not w:
                    out.append(self._scramble(run, st[i:] + st[:i]))
                    continue
                out.append(w.upper() if run.isupper() and len(run) > 1 else (w.capitalize() if run[0].isupper() else w))
            else:
                out.append(self._scramble(run, st[i:] + st[:i]))
        return "".join(out)

    def _names(self, value: str, st: bytes, lists: list[list[str]]) -> str:
        parts = re.split(r"([ \t\r\n-]+)", value)
        out, wi = [], 0
        for p in parts:
            if not p or not p[0].isalpha():
                out.append(p)
                continue
            choice = self._pick(lists[min(wi, len(lists) - 1)], p, st[wi % len(st)] * 256 + st[(wi + 7) % len(st)])
            out.append(choice or self._scramble(p, st[wi:] + st[:wi]))
            wi += 1
        return "".join(out)

    def _address(self, value: str, st: bytes) -> str:
        words = re.split(r"(\s+)", value)
        keep = pii_detect.street_type_words()
        out = []
        for i, w in enumerate(words):
            bare = w.strip(",.;:")
            if w[:1].isdigit():
                out.append(self._scramble(w, st[i:] + st[:i]))
            elif not bare or bare.lower() in keep or bare.islower() and len(bare) <= 3 or len(bare) <= 1:
                out.append(w)  # street types (Street, rue, Calle), connectors (de, la), spacing stay
            else:
                out.append(self._pick(_SUR_STREET, w, st[i % len(st)]) or self._scramble(w, st[i:] + st[:i]))
        return "".join(out)

    # --- text -------------------------------------------------------------------------------------
    def redact_text(self, text: str) -> str:
        if len(text) < 6:
            return text
        cached = self._text_cache.get(text)  # content-addressed: each distinct text is analysed once
        if cached is not None:
            for kind, n in cached[1]:
                self.counts[kind] += n
            return cached[0]
        spans = find_pii(text)
        if not spans:
            result, found = text, ()
        else:
            parts, pos = [], 0
            found_c: Counter[str] = Counter()
            for start, end, kind, norm in spans:
                parts.append(text[pos:start])
                parts.append(self.surrogate(kind, text[start:end], norm))
                for k in kind.split("+"):
                    found_c[k] += 1
                pos = end
            parts.append(text[pos:])
            result, found = "".join(parts), tuple(found_c.items())
            for kind, n in found:
                self.counts[kind] += n
        if self._cache_chars > 32_000_000:  # bounded memory: about 64 MB of cached text
            self._text_cache.clear()
            self._cache_chars = 0
        self._text_cache[text] = (result, found)
        self._cache_chars += len(text) + len(result)
        return result

    # --- structures -------------------------------------------------------------------------------
    def redact_json(self, obj: Any, skip: frozenset[str] = STRUCTURAL_KEYS) -> Any:
        """String values redacted, keys and structural keywords untouched; unchanged parts are the same objects."""
        if isinstance(obj, str):
            return self.redact_text(obj)
        if isinstance(obj, list):
            new = [self.redact_json(v, skip) for v in obj]
            return obj if all(a is b for a, b in zip(new, obj)) else new
        if isinstance(obj, dict):
            new_d = {k: (v if k in skip else self.redact_json(v, skip)) for k, v in obj.items()}
            return obj if all(new_d[k] is obj[k] for k in obj) else new_d
        return obj

    def redact_json_string(self, s: str) -> str:
        """A string that holds JSON (tool-call arguments, tool results): stays valid JSON."""
        out = self.redact_text(s)
        if out is s or out == s:
            return s
        try:
            json.loads(s)
        except ValueError:
            return out  # was not JSON; plain text redaction is what applies
        try:
            json.loads(out)
            return out
        except ValueError:
            return json.dumps(self.redact_json(json.loads(s), frozenset()), ensure_ascii=False)

    def redact_messages(self, messages: list[dict]) -> list[dict]:
        out = []
        for m in messages:
            nm = dict(m)
            c = m.get("content")
            if isinstance(c, str):
                nm["content"] = self.redact_json_string(c) if m.get("role") == "tool" else self.redact_text(c)
            elif isinstance(c, list):
                nm["content"] = [({**p, "text": self.redact_text(p["text"])}
                                  if p.get("type") == "text" and isinstance(p.get("text"), str) else p) for p in c]
            if isinstance(m.get("name"), str):
                nm["name"] = self.redact_text(m["name"])
            calls = m.get("tool_calls")
            if isinstance(calls, list):
                new_calls = []
                for call in calls:
                    fn = call.get("function") if isinstance(call, dict) else None
                    if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                        call = {**call, "function": {**fn, "arguments": self.redact_json_string(fn["arguments"])}}
                    new_calls.append(call)
                nm["tool_calls"] = new_calls
            out.append(nm)
        return out
