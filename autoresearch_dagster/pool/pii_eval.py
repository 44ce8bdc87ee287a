"""Owns the labelled PII evaluation: corpora (Faker-templated support chat in several locales, and
hand-written hard cases) and the scoring of any detector against them.

Labels are character spans with a kind. A labelled entity counts as caught only when detected spans
cover every letter and digit of it (a surname left in place is a leak, not a partial success);
"any-overlap" recall is reported beside it. Detected spans that touch no labelled entity are
over-redaction (precision). Scoring is type-agnostic: what matters for privacy is that the value
is gone, whatever the detector called it.

Two template sets exist so that nothing is tuned on one corpus: set ``"dev"`` is what detector
work is checked against while building, set ``"heldout"`` (different templates, sentence shapes,
seeds and locales) plus the hand-written cases are what reports are made on.
"""
from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

# entity kinds of the corpora; "structured" ones have a 99% recall target and must never leak
STRUCTURED = ("email", "phone", "card", "iban", "ssn", "national_id", "ip", "secret", "dob", "passport", "licence")
KINDS = STRUCTURED + ("person", "address", "location", "organization")
NEVER_LEAK = ("email", "card", "iban", "ssn", "ip", "secret")


@dataclass
class Sample:
    text: str
    entities: list[tuple[int, int, str]]  # start, end, kind
    locale: str = "en_US"
    source: str = ""


_MARK = re.compile(r"\[\[(\w+):(.+?)\]\]", re.S)


def parse_marked(text: str, locale: str = "en_US", source: str = "hard") -> Sample:
    """``"Call [[phone:020 7946 0958]] now"`` -> the plain text and its labelled spans."""
    out, ents, pos = [], [], 0
    n = 0
    for m in _MARK.finditer(text):
        out.append(text[pos:m.start()])
        n += len(text[pos:m.start()])
        kind, value = m.group(1), m.group(2)
        if kind not in KINDS:
            raise ValueError(f"unknown entity kind {kind!r} in {text!r}")
        ents.append((n, n + len(value), kind))
        out.append(value)
        n += len(value)
        pos = m.end()
    out.append(text[pos:])
    return Sample("".join(out), ents, locale, source)


def load_marked(path: str | Path) -> list[Sample]:
    """Hand-written cases: one JSON object per line, ``{"text": "...[[kind:value]]...", "locale": ...}``."""
    out = []
    for line in Path(path).read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            d = json.loads(line)
            out.append(parse_marked(d["text"], d.get("locale", "en_US"), d.get("source", "hard")))
    return out


# --- Faker-templated corpora ---------------------------------------------------------------------------
LOCALES = ("en_US", "en_GB", "de_DE", "fr_FR", "es_ES", "it_IT", "nl_NL", "en_IN", "en_AU", "pt_BR", "en_CA", "en_IE")

_DEV_TEMPLATES = [
    "Hi, this is {person}. My order hasn't arrived yet.",
    "Please update my email to {email}, the old one bounces.",
    "You can reach me at {phone} after 5pm.",
    "My card {card} was charged twice for order #{order}.",
    "Refund to my account {iban} please.",
    "For verification my SSN is {ssn}.",
    "The login came from {ip} which wasn't me.",
    "I moved to {address}, can you change the shipping address?",
    "My date of birth is {dob}.",
    "Passport number {passport} for the booking.",
    "Driver's license number: {licence}",
    "{person} from {organization} asked about invoice {order}.",
    "I accidentally pasted my key {secret} into the chat, can you delete it?",
    "Thanks {person}, that fixed it!",
    "Ship it to {person}, {address}, {location}.",
    "Contact: {person} <{email}>, tel. {phone}",
    "my national insurance number is {national_id}",
    "Version 3.11.2 crashed at 14:03 on 2025-06-01 with error E1234.",
    "Tracking number 1Z999AA10123456784 shows delayed in {location}.",
    "We were billed $1,299.00 on invoice INV-2025-00417.",
]

_HELDOUT_TEMPLATES = [
    "hello again - {person} here, still waiting on ticket {order}",
    "Could someone call {phone}? It's my mobile. {person}",
    "new address: {address}. Thank you!",
    "Payment details: card number {card}, billing name {person}.",
    "wire it to IBAN {iban} (account holder: {person})",
    "Please confirm you've removed {email} from the mailing list.",
    "Customer {person} (DOB {dob}) requests account deletion.",
    "Identity check: {national_id} / passport {passport}",
    "ssn {ssn} - please don't store it",
    "Our VPN gateway is {ip}; the staging box is {ip2}.",
    "config: {secret}",
    "License # {licence} was rejected by the rental desk.",
    "{person} and {person2} share the account, both at {address}.",
    "Forwarding from {person} ({email}): the parcel to {location} is lost.",
    "I spoke to {person} yesterday; ref {order}. Sent from my iPhone",
    "The 2 GB plan costs 9.99 EUR per month since March 2024.",
    "Build 7.4.1 fails on node 20 with exit code 137.",
    "Ping me on {phone} or {phone2}.",
    "Regards,\n{person}\n{organization}",
    "Born {dob}, member since 2019, card ending 4821.",
]


def _secret(fk, rng: random.Random) -> str:
    alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
    up = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

    def r(chars: str, n: int) -> str:
        return "".join(rng.choice(chars) for _ in range(n))
    choices = [
        lambda: "AKIA" + r(up, 16),
        lambda: "aws_secret_access_key=" + r(alnum + "/+", 40),
        lambda: "ghp_" + r(alnum, 36),
        lambda: "sk-proj-" + r(alnum, 40),
        lambda: "sk_live_" + r(alnum, 24),
        lambda: "xoxb-" + r("0123456789", 11) + "-" + r(alnum, 24),
        lambda: "password=" + fk.password(length=rng.randint(8, 14), special_chars=False),
        lambda: "DB_PASSWORD: " + fk.password(length=12, special_chars=False),
        lambda: "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOi" + r(alnum, 20) + "." + r(alnum + "_-", 43),
        lambda: "AIza" + r(alnum + "_-", 35),
    ]
    return rng.choice(choices)()


def _card(fk, rng: random.Random) -> str:
    kind = rng.choice(["visa16", "mastercard", "amex", "discover", "jcb16", "diners", "maestro", "visa13", "visa19"])
    num = fk.credit_card_number(card_type=kind)
    style = rng.random()
    if style < 0.4:
        return num
    sep = " " if style < 0.8 else "-"
    if len(num) == 15:
        return sep.join((num[:4], num[4:10], num[10:]))
    return sep.join(num[i:i + 4] for i in range(0, len(num), 4))


def _iban(fk, rng: random.Random) -> str:
    v = fk.iban()
    s = rng.random()
    if s < 0.35:
        v = " ".join(v[i:i + 4] for i in range(0, len(v), 4))
    if rng.random() < 0.2:
        v = v.lower()
    return v


def _phone(fk, rng: random.Random, locale: str) -> str:
    import phonenumbers
    v = fk.phone_number()
    if rng.random() < 0.35:  # an international rendering of a valid number of the locale's region
        region = locale.split("_")[1]
        ex = phonenumbers.example_number_for_type(region, phonenumbers.PhoneNumberType.MOBILE) or \
            phonenumbers.example_number(region)
        if ex is not None:
            nat = str(ex.national_number)
            digits = nat[:2] + "".join(str(rng.randrange(10)) for _ in nat[2:])
            num = phonenumbers.parse(f"+{ex.country_code}{digits}")
            fmt = rng.choice([phonenumbers.PhoneNumberFormat.INTERNATIONAL, phonenumbers.PhoneNumberFormat.NATIONAL,
                              phonenumbers.PhoneNumberFormat.E164])
            v = phonenumbers.format_number(num, fmt)
            if fmt == phonenumbers.PhoneNumberFormat.INTERNATIONAL and rng.random() < 0.3:
                v = "00" + v[1:]
    return v


def _national_id(fk, locale: str) -> str:
    return fk.aadhaar_id() if locale == "en_IN" else fk.ssn()


def _person(fk, rng: random.Random) -> str:
    """A name as people write it: first and last name, sometimes only one of them or a middle name."""
    r = rng.random()
    if r < 0.08:
        return fk.last_name()
    if r < 0.14:
        return f"{fk.first_name()} {fk.first_name()} {fk.last_name()}"
    return f"{fk.first_name()} {fk.last_name()}"


def _title(fk) -> str:
    try:
        return fk.prefix().strip()
    except AttributeError:
        return ""


def _dob(fk, rng: random.Random) -> str:
    d = fk.date_of_birth(minimum_age=18, maximum_age=90)
    return d.strftime(rng.choice(["%Y-%m-%d", "%d/%m/%Y", "%m/%d/%Y", "%d.%m.%Y", "%B %d, %Y", "%d %B %Y", "%b %d %Y"]))


def _passport(fk, rng: random.Random) -> str:
    try:
        return fk.passport_number()
    except AttributeError:
        return rng.choice("ABCDEFGHJKLMNPRSTUVWXYZ") + "".join(str(rng.randrange(10)) for _ in range(8))


def _licence(fk, rng: random.Random, locale: str) -> str:
    if locale == "en_GB":  # DVLA shape: 5 surname letters, 6 digits (birth), 2 initials, digit, 2 check chars
        last = re.sub(r"[^A-Z]", "", fk.last_name().upper())[:5].ljust(5, "9")
        return f"{last}{rng.randrange(10**6):06d}{fk.first_name()[0].upper()}{rng.choice('ABCDEFGHJKLMNPRSTW9')}" \
               f"{rng.randrange(10)}{rng.choice('ABCDEFGHJKLMNPRSTUVWXYZ')}{rng.choice('ABCDEFGHJKLMNPRSTUVWXYZ')}"
    shape = rng.choice(["A#######", "A############", "########", "A##-###-##-###-#", "AA######"])
    return "".join(rng.choice("ABCDEFGHJKLMNPRSTUVWXYZ") if c == "A" else str(rng.randrange(10)) if c == "#" else c
                   for c in shape)


def _fill(template: str, fk, rng: random.Random, locale: str) -> Sample:
    makers: dict[str, Callable[[], tuple[str, str | None]]] = {
        "person": lambda: (_person(fk, rng), "person"),
        "person2": lambda: (_person(fk, rng), "person"),
        "email": lambda: (fk.email(), "email"),
        "phone": lambda: (_phone(fk, rng, locale), "phone"),
        "phone2": lambda: (_phone(fk, rng, locale), "phone"),
        "card": lambda: (_card(fk, rng), "card"),
        "iban": lambda: (_iban(fk, rng), "iban"),
        "ssn": lambda: (_us_ssn(rng), "ssn"),
        "national_id": lambda: (_national_id(fk, locale), "national_id"),
        "ip": lambda: (fk.ipv4() if rng.random() < 0.8 else fk.ipv6(), "ip"),
        "ip2": lambda: (fk.ipv4_private(), "ip"),
        "address": lambda: (fk.street_address().replace("\n", ", "), "address"),
        "location": lambda: (fk.city(), "location"),
        "organization": lambda: (fk.company(), "organization"),
        "dob": lambda: (_dob(fk, rng), "dob"),
        "passport": lambda: (_passport(fk, rng), "passport"),
        "licence": lambda: (_licence(fk, rng, locale), "licence"),
        "secret": lambda: (_secret(fk, rng), "secret"),
        "order": lambda: (f"{rng.choice(['A', 'ORD-', '#', ''])}{rng.randrange(10**5, 10**7)}", None),
    }
    out, ents, n, pos = [], [], 0, 0
    for m in re.finditer(r"\{(\w+)\}", template):
        if m.group(1) in ("person", "person2") and rng.random() < 0.15:  # a title before the name, not labelled
            title = _title(fk)
            if title:
                lit = template[pos:m.start()] + title + " "
                out.append(lit)
                n += len(lit)
                pos = m.start()
        lit = template[pos:m.start()]
        out.append(lit)
        n += len(lit)
        value, kind = makers[m.group(1)]()
        if kind == "secret":
            # the assignment's name is not the secret; its value is
            for prefix in ("aws_secret_access_key=", "password=", "DB_PASSWORD: "):
                if value.startswith(prefix):
                    out.append(prefix)
                    n += len(prefix)
                    value = value[len(prefix):]
        if kind is not None:
            ents.append((n, n + len(value), kind))
        out.append(value)
        n += len(value)
        pos = m.end()
    out.append(template[pos:])
    return Sample("".join(out), ents, locale, "faker")


def _us_ssn(rng: random.Random) -> str:
    area = rng.choice([a for a in range(1, 900) if a != 666])
    return f"{area:03d}-{rng.randrange(1, 100):02d}-{rng.randrange(1, 10000):04d}"


def faker_corpus(n: int, *, split: str = "heldout", seed: int = 0, locales: Iterable[str] = LOCALES) -> list[Sample]:
    """``n`` labelled support-chat messages from one template set, locales in turn."""
    from faker import Faker

    templates = {"dev": _DEV_TEMPLATES, "heldout": _HELDOUT_TEMPLATES}[split]
    locales = list(locales)
    fakers = {}
    for i, loc in enumerate(locales):
        fk = Faker(loc)
        fk.seed_instance(seed * 1000 + i + (0 if split == "dev" else 500))
        fakers[loc] = fk
    rng = random.Random(f"{split}:{seed}")
    out = []
    for i in range(n):
        loc = locales[i % len(locales)]
        out.append(_fill(templates[rng.randrange(len(templates))], fakers[loc], rng, loc))
    return out


# --- scoring ----------------------------------------------------------------------------------------
@dataclass
class Score:
    total: dict[str, int] = field(default_factory=dict)
    caught: dict[str, int] = field(default_factory=dict)   # fully covered
    touched: dict[str, int] = field(default_factory=dict)  # any overlap
    leaks: dict[str, list[str]] = field(default_factory=dict)
    detected: int = 0
    false_spans: int = 0
    # every leak: (kind, the sample's text, start, end), so a report can show it in its context
    leak_sites: list[tuple[str, str, int, int]] = field(default_factory=list)

    def recall(self, kind: str) -> float | None:
        return self.caught.get(kind, 0) / self.total[kind] if self.total.get(kind) else None

    def any_overlap(self, kind: str) -> float | None:
        return self.touched.get(kind, 0) / self.total[kind] if self.total.get(kind) else None

    @property
    def precision(self) -> float | None:
        return (self.detected - self.false_spans) / self.detected if self.detected else None


def score(samples: Iterable[Sample], detect: Callable[[str], list[tuple[int, int]]]) -> Score:
    """Type-agnostic coverage of labelled entities by ``detect``'s spans."""
    sc = Score()
    for s in samples:
        spans = detect(s.text)
        covered = bytearray(len(s.text))
        for a, b in spans:
            covered[a:b] = b"\x01" * (b - a)
        for a, b, kind in s.entities:
            sc.total[kind] = sc.total.get(kind, 0) + 1
            need = [i for i in range(a, b) if s.text[i].isalnum()]
            hit = [i for i in need if covered[i]]
            if need and len(hit) == len(need):
                sc.caught[kind] = sc.caught.get(kind, 0) + 1
            else:
                sc.leaks.setdefault(kind, []).append(s.text[a:b])
                sc.leak_sites.append((kind, s.text, a, b))
            if hit:
                sc.touched[kind] = sc.touched.get(kind, 0) + 1
        for a, b in spans:
            sc.detected += 1
            if not any(a < e and s0 < b for s0, e, _ in s.entities):
                sc.false_spans += 1
    return sc


# --- an independent labelled corpus (written apart from every detector list and rule) ----------------
# its upper-case types -> the kinds above (scoring is type-agnostic; the kind only groups the figures)
INDEPENDENT_TYPES = {
    "PERSON": "person", "ADDRESS": "address", "EMAIL": "email", "PHONE": "phone", "CREDIT_CARD": "card",
    "IBAN": "iban", "SSN": "ssn", "IP_ADDRESS": "ip", "ORG": "organization", "LOCATION": "location",
    "DATE_OF_BIRTH": "dob", "PASSPORT": "passport", "API_KEY": "secret", "URL_WITH_TOKEN": "secret",
}


def _independent_sample(d: dict, source: str) -> Sample:
    text = d["text"]
    ents = []
    for e in d.get("entities") or ():
        kind = INDEPENDENT_TYPES.get(e["type"])
        if kind is None:
            raise ValueError(f"{source} record {d.get('id')!r}: unknown entity type {e['type']!r}")
        a, b = int(e["start"]), int(e["end"])
        if not (0 <= a < b <= len(text)):
            raise ValueError(f"{source} record {d.get('id')!r}: span {a}..{b} outside its text")
        ents.append((a, b, kind))
    return Sample(text, ents, d.get("lang", "en"), f"{source}:{d.get('style', '')}")


def load_independent(corpus_dir: str | Path, half: str) -> tuple[list[Sample], list[Sample]]:
    """(corpus records of ``half`` ("dev" or "report") by the committed ``split.json``, the hard cases
    of that half) from ``corpus.jsonl``, ``split.json`` and ``hard_cases.jsonl`` in ``corpus_dir``.
    Hard cases follow the split too when it names them, else they all count as report-half."""
    d = Path(corpus_dir)
    split = json.loads((d / "split.json").read_text())
    if isinstance(split.get("split"), dict):  # {"split": {...}} or a flat {id: half}
        split = split["split"]
    out: dict[str, list[Sample]] = {"corpus.jsonl": [], "hard_cases.jsonl": []}
    for name in out:
        path = d / name
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            rec = json.loads(line)
            h = split.get(str(rec.get("id")), "report" if name == "hard_cases.jsonl" else None)
            if h is None:
                raise ValueError(f"{path}: record {rec.get('id')!r} is in no half of split.json")
            if h == half:
                out[name].append(_independent_sample(rec, name.split(".")[0]))
    return out["corpus.jsonl"], out["hard_cases.jsonl"]
