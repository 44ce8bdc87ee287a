"""Build the independent PII evaluation corpus (corpus.jsonl, hard_cases.jsonl, split.json).

Written by hand by the "corpus" helper session, without reading any detector, pool, redaction,
benchmark or test code of this project and without Faker or any project gazetteer. Every value list
and template below was typed from general knowledge. Structured identifiers are made valid where a
checksum exists (Luhn for cards, ISO 13616 mod-97 for IBANs, the 11-test for Dutch BSNs, the DNI
letter for Spanish ids).

Run from the repository root:  python benchmarks/data/pii_independent/build_corpus.py
The output is deterministic (fixed seed). The split is by template: sha256("template-<index>") for corpus
records (a template's wording lives in one half only), sha256(id) for hard cases; first byte even -> "dev".
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import string
import unicodedata
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEED = 20261206
R = random.Random(SEED)

TYPES = {
    "PERSON", "ADDRESS", "EMAIL", "PHONE", "CREDIT_CARD", "IBAN", "SSN", "IP_ADDRESS", "ORG",
    "LOCATION", "DATE_OF_BIRTH", "PASSPORT", "API_KEY", "URL_WITH_TOKEN",
}
STYLES = {"support_chat", "code_review", "agent_tool_call", "email", "sms", "form", "log_line"}
STRUCTURED = {"EMAIL", "PHONE", "CREDIT_CARD", "IBAN", "SSN", "IP_ADDRESS", "API_KEY", "PASSPORT"}

# --------------------------------------------------------------------------------------------
# Names, by culture: (given names, family names)
# --------------------------------------------------------------------------------------------
CULTURES = {
    "en": (["Oliver", "Amelia", "Harry", "Isla", "George", "Freya", "Callum", "Megan", "Tom",
            "Hannah", "Dylan", "Chloe", "Ethan", "Zoe", "Nathan", "Ruth", "Gareth", "Bethany"],
           ["Thompson", "Whitfield", "Ashworth", "Pemberton", "Hughes", "Clarke", "Fletcher",
            "Kershaw", "Doyle", "O'Connell", "McAllister", "Fitzgerald", "Braithwaite", "Nolan"]),
    "us": (["Tyler", "Madison", "Brandon", "Kayla", "Jamal", "Destiny", "Cody", "Brianna",
            "Marcus", "Shelby", "DeShawn", "Kristen"],
           ["Johnson", "Ramirez", "Washington", "Kowalski", "Henderson", "Delgado", "Brooks",
            "Sullivan", "Jefferson", "Nakamura-Hill"]),
    "de": (["Jörg", "Anneliese", "Lukas", "Friederike", "Maximilian", "Svenja", "Torsten",
            "Ursula", "Henrik", "Mareike", "Dieter", "Jana"],
           ["Schäfer", "Grünewald", "Hoffmann", "Krüger", "Weißmann", "Brandt", "Oberländer",
            "Zimmermann", "Kühn", "Fuchs", "Schmidt-Ahrens", "Wagner"]),
    "fr": (["Amélie", "Théo", "Céline", "Baptiste", "Élodie", "Mathis", "Margaux", "Yannick",
            "Solène", "Grégoire", "Anne-Sophie", "Jean-Baptiste"],
           ["Lefèvre", "Moreau", "Girard", "Dubois", "Fontaine", "Rousseau", "Chevalier",
            "Mercier", "Bonnet", "Lemaire", "Perrin"]),
    "es": (["Alejandro", "Lucía", "Javier", "Carmen", "Iñigo", "Nerea", "Santiago", "Ximena",
            "Rocío", "Álvaro", "Maite", "Joaquín"],
           ["García Márquez", "Fernández", "Etxeberria", "Martínez López", "Sánchez", "Ortega",
            "Navarro", "Castillo", "Muñoz", "Vidal i Puig"]),
    "nl": (["Daan", "Femke", "Joris", "Sanne", "Bram", "Lieke", "Sem", "Maartje", "Thijs", "Noor"],
           ["Bakker", "Visser", "Smit", "Mulder", "Dekker", "Jansen", "Hendriks", "Vermeulen",
            "Kuipers"]),
    "it": (["Giulia", "Matteo", "Chiara", "Lorenzo", "Francesca", "Alessandro", "Federica"],
           ["Bianchi", "Esposito", "Colombo", "Ricci", "Marino", "Greco", "Lombardi"]),
    "pl": (["Agnieszka", "Krzysztof", "Małgorzata", "Paweł", "Zofia", "Łukasz"],
           ["Wiśniewska", "Kowalczyk", "Zieliński", "Wójcik", "Szymański", "Dąbrowska"]),
    "tr": (["Emre", "Elif", "Mehmet", "Zeynep", "Burak", "Ayşe"],
           ["Yılmaz", "Demir", "Şahin", "Çelik", "Öztürk", "Kaya"]),
    "ar": (["Youssef", "Fatima", "Karim", "Leila", "Tariq", "Nour", "Hamza", "Rania"],
           ["Haddad", "El-Amin", "Mansour", "Khoury", "Nasser", "Benali", "Abdelrahman"]),
    "in": (["Priya", "Arjun", "Ananya", "Vikram", "Deepika", "Rohan", "Lakshmi", "Sanjay",
            "Kavya", "Aditya"],
           ["Raghunathan", "Iyer", "Chatterjee", "Patel", "Reddy", "Venkataraman", "Deshpande",
            "Gupta", "Banerjee", "Menon"]),
    "cn": (["Xiaoming", "Mei", "Jun", "Yuting", "Hao", "Jiayi", "Zihan"],
           ["Wang", "Liu", "Chen", "Zhao", "Huang", "Zhou", "Xu"]),
    "jp": (["Haruto", "Yui", "Sota", "Aoi", "Ren", "Sakura", "Kenji"],
           ["Takahashi", "Watanabe", "Yamamoto", "Nakamura", "Kobayashi", "Fujita"]),
    "kr": (["Minjun", "Seoyeon", "Jiwoo", "Hyun-woo", "Eun-ji"],
           ["Park", "Kim", "Choi", "Jung", "Kang"]),
    "vn": (["Linh", "Minh", "Thao", "Duc", "Phuong"],
           ["Nguyen", "Tran", "Pham", "Le", "Hoang"]),
    "ng": (["Chiamaka", "Oluwaseun", "Ngozi", "Emeka", "Adaeze", "Tunde", "Folake"],
           ["Okafor", "Adeyemi", "Eze", "Balogun", "Nwosu", "Obi", "Oyelaran"]),
    "ke": (["Wanjiru", "Otieno", "Achieng", "Kamau", "Njeri"],
           ["Mwangi", "Odhiambo", "Njoroge", "Wambui", "Kiprono"]),
    "br": (["João", "Thiago", "Larissa", "Beatriz", "Gonçalo", "Rafaela"],
           ["Oliveira", "Santos", "Carvalho", "Pereira", "Gonçalves", "Albuquerque"]),
    "ru": (["Dmitri", "Natalia", "Sergei", "Yekaterina", "Alexei", "Olga"],
           ["Ivanova", "Volkov", "Petrov", "Sokolova", "Kuznetsov", "Morozova"]),
    "gr": (["Nikos", "Eleni", "Giorgos", "Katerina"],
           ["Papadopoulos", "Georgiou", "Katsaros", "Antoniou"]),
    "ie": (["Siobhán", "Niamh", "Ciarán", "Aoife", "Oisín", "Pádraig"],
           ["Ó Briain", "Mac Giolla Phádraig", "Murphy", "Kavanagh", "Ní Dhonnchadha"]),
    "nordic": (["Bjørn", "Ingrid", "Sigrid", "Lars", "Åsa", "Mikael"],
               ["Lindqvist", "Håkansson", "Andersen", "Nyström", "Solberg", "Østergaard"]),
}
# Names that are also ordinary words.
WORD_NAMES = ["Will Hunter", "Rose May", "Bill Price", "Grace Field", "Mark Bishop", "Faith Lane",
              "Hope Baker", "Joy Cook", "Frank Church", "Amber Stone", "Dawn Summers", "Pat Little",
              "Jack Black", "Penny Lane", "Robin Banks", "Sandy Shore", "Rich Young", "Guy Green",
              "Ray Bright", "Daisy Hill", "Iris Marsh", "Lily White", "Victor Chase", "Hunter Wells",
              "Chase Carter", "Drew Cross", "Summer Brooks", "Crystal Waters", "Sterling Gold",
              "Autumn Reed", "Miles Long", "Storm Fisher", "Sky Turner", "Hazel Wood", "June Page"]
WORD_GIVEN = ["Will", "Rose", "Bill", "Grace", "Mark", "Faith", "Hope", "Joy", "Frank", "Amber",
              "Dawn", "Pat", "Jack", "Penny", "Robin", "Sandy", "Ray", "Daisy", "Iris", "Lily",
              "Hunter", "Chase", "Drew", "Summer", "June", "Sky", "Hazel", "Miles", "Art", "May"]
# Names with particles.
PARTICLE_NAMES = ["Ludwig van der Berg", "Annika von Falkenhausen", "Jean-Luc de la Fontaine",
                  "María del Carmen de los Ríos", "Pieter de Vries", "Jan van den Heuvel",
                  "Luca De Santis", "Omar bin Rashid", "Ahmad al-Farsi", "Sofie ter Horst",
                  "Leonardo da Silva", "Christoph zu Salm", "Anouk van 't Hek", "Charles d'Arcy",
                  "Hanna von der Leyen-Maier", "Rafael dos Santos", "Isabel de la Cruz",
                  "Ahmed Ould Abdallah", "Kwame Asante-Boateng", "Mariam bint Khalid",
                  "Diego de la Vega", "Saskia van Dijk", "Olivier Le Goff", "Marie-Claire du Pont"]


def _culture() -> tuple[list[str], list[str]]:
    return CULTURES[R.choice(list(CULTURES))]


def name_full() -> str:
    x = R.random()
    if x < 0.14:
        return R.choice(WORD_NAMES)
    if x < 0.24:
        return R.choice(PARTICLE_NAMES)
    g, f = _culture()
    if R.random() < 0.06:
        return f"{R.choice(g)} {R.choice(g)} {R.choice(f)}"
    return f"{R.choice(g)} {R.choice(f)}"


def name_given() -> str:
    if R.random() < 0.22:
        return R.choice(WORD_GIVEN)
    return R.choice(_culture()[0])


def name_family() -> str:
    return R.choice(_culture()[1])


def name_initial() -> str:
    g, f = _culture()
    return f"{R.choice(g)[0]}. {R.choice(f)}"


def name_word() -> str:
    return R.choice(WORD_NAMES)


def name_particle() -> str:
    return R.choice(PARTICLE_NAMES)


def name_lower() -> str:
    return (name_full() if R.random() < 0.5 else name_given()).lower()


def _ascii(s: str) -> str:
    s = s.replace("ß", "ss").replace("ł", "l").replace("ø", "o").replace("æ", "ae").replace("ı", "i")
    s = unicodedata.normalize("NFKD", s)
    return "".join(ch for ch in s if ch.isascii() and (ch.isalnum() or ch in "._")).lower()


# --------------------------------------------------------------------------------------------
# Email, phone
# --------------------------------------------------------------------------------------------
MAIL_DOMAINS = ["gmail.com", "outlook.com", "yahoo.co.uk", "web.de", "gmx.de", "orange.fr",
                "free.fr", "hotmail.es", "telefonica.net", "ziggo.nl", "kpnmail.nl", "libero.it",
                "icloud.com", "proton.me", "fastmail.fm", "rediffmail.com", "qq.com", "naver.com",
                "yandex.ru", "t-online.de", "btinternet.com", "bluewin.ch", "mail.ee",
                "harbourlogistics.co.uk", "kleinbau-gmbh.de", "studio-lumiere.fr", "norte-seguros.es",
                "brightpath.io", "quillfinance.com", "uni-potsdam.de", "student.tudelft.nl",
                "nhs.net", "helpdesk.meridian-health.org", "co-op-energy.coop"]


def email() -> str:
    g, f = _culture()
    a, b = _ascii(R.choice(g)), _ascii(R.choice(f))
    form = R.randrange(7)
    local = [f"{a}.{b}", f"{a[0]}{b}", f"{a}{R.randint(1, 99)}", f"{b}.{a}", f"{a}_{b}{R.randint(70, 99)}",
             f"{a}+{R.choice(['orders', 'news', 'work', 'spam'])}", f"{R.choice(['info', 'billing', 'support', 'hr', 'office'])}"][form]
    dom = R.choice(MAIL_DOMAINS)
    out = f"{local}@{dom}"
    return out.upper() if R.random() < 0.03 else out


def _d(n: int) -> str:
    return "".join(R.choice(string.digits) for _ in range(n))


def phone_us() -> str:
    area = R.choice(["415", "212", "617", "303", "512", "206", "773", "404", "718", "602"])
    ex = str(R.randint(201, 989))
    ln = _d(4)
    return R.choice([f"({area}) {ex}-{ln}", f"{area}-{ex}-{ln}", f"+1 {area} {ex} {ln}",
                     f"+1-{area}-{ex}-{ln}", f"{area}.{ex}.{ln}", f"1 ({area}) {ex}-{ln}"])


def phone_uk() -> str:
    return R.choice([f"07{R.randint(400, 999)} {_d(6)}", f"+44 7{R.randint(400, 999)} {_d(3)} {_d(3)}",
                     f"+44 (0)20 {_d(4)} {_d(4)}", f"020 {_d(4)} {_d(4)}", f"0161 {_d(3)} {_d(4)}",
                     f"+44 131 {_d(3)} {_d(4)}", f"01632 {_d(6)}"])


def phone_de() -> str:
    return R.choice([f"+49 30 {_d(8)}", f"030 {_d(4)} {_d(4)}", f"+49 151 {_d(8)}",
                     f"0171 {_d(7)}", f"+49 (0)89 {_d(3)} {_d(4)}", f"0221/{_d(6)}",
                     f"+49-40-{_d(7)}", f"0176-{_d(8)}"])


def phone_fr() -> str:
    p = lambda: " ".join(_d(2) for _ in range(4))  # noqa: E731
    return R.choice([f"+33 6 {p()}", f"06 {p()}", f"07 {p()}", f"+33 (0)1 {p()}", f"01.{_d(2)}.{_d(2)}.{_d(2)}.{_d(2)}",
                     f"+33{R.choice('67')}{_d(8)}"])


def phone_es() -> str:
    return R.choice([f"+34 6{_d(2)} {_d(3)} {_d(3)}", f"6{_d(2)} {_d(2)} {_d(2)} {_d(2)}",
                     f"91 {_d(3)} {_d(2)} {_d(2)}", f"+34 93 {_d(3)} {_d(4)}", f"+346{_d(8)}"])


def phone_nl() -> str:
    return R.choice([f"+31 6 {_d(8)}", f"06-{_d(8)}", f"06 {_d(4)} {_d(4)}", f"020-{_d(3)} {_d(4)}",
                     f"+31 (0)30 {_d(3)} {_d(4)}", f"+316{_d(8)}"])


def phone_other() -> str:
    return R.choice([f"+91 9{_d(4)} {_d(5)}", f"+91-{_d(5)}-{_d(5)}", f"+81 90-{_d(4)}-{_d(4)}",
                     f"+61 4{_d(2)} {_d(3)} {_d(3)}", f"(02) {_d(4)} {_d(4)}", f"+55 11 9{_d(4)}-{_d(4)}",
                     f"+86 138 {_d(4)} {_d(4)}", f"+234 803 {_d(3)} {_d(4)}", f"+254 7{_d(2)} {_d(6)}",
                     f"+39 3{_d(2)} {_d(3)} {_d(4)}", f"+48 {_d(3)} {_d(3)} {_d(3)}", f"+90 5{_d(2)} {_d(3)} {_d(2)} {_d(2)}",
                     f"+7 (9{_d(2)}) {_d(3)}-{_d(2)}-{_d(2)}", f"+82 10-{_d(4)}-{_d(4)}", f"+971 50 {_d(3)} {_d(4)}",
                     f"+41 79 {_d(3)} {_d(2)} {_d(2)}", f"+353 87 {_d(3)} {_d(4)}", f"+27 82 {_d(3)} {_d(4)}"])


def phone_any() -> str:
    return R.choice([phone_us, phone_uk, phone_de, phone_fr, phone_es, phone_nl, phone_other, phone_other])()


def phone_e164() -> str:
    return R.choice([f"+1{R.choice(['415', '646', '312'])}{R.randint(201, 989)}{_d(4)}", f"+447{_d(9)}",
                     f"+4915{_d(9)}", f"+336{_d(8)}", f"+346{_d(8)}", f"+316{_d(8)}", f"+919{_d(9)}",
                     f"+614{_d(8)}", f"+5511{_d(9)}", f"+2348{_d(9)}"])


def phone_digits() -> str:  # bare national number, as stored in a database column
    return R.choice([f"{R.choice(['415', '206', '917'])}{R.randint(201, 989)}{_d(4)}", f"07{_d(9)}",
                     f"0151{_d(8)}", f"06{_d(8)}", f"6{_d(8)}"])


# --------------------------------------------------------------------------------------------
# Checksummed identifiers
# --------------------------------------------------------------------------------------------
def luhn_ok(num: str) -> bool:
    ds = [int(c) for c in num if c.isdigit()]
    tot = 0
    for i, d in enumerate(reversed(ds)):
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        tot += d
    return tot % 10 == 0


def _luhn_complete(prefix: str, length: int) -> str:
    body = prefix + _d(length - len(prefix) - 1)
    for c in string.digits:
        if luhn_ok(body + c):
            return body + c
    raise AssertionError


def card() -> str:
    kind = R.choice(["visa", "visa", "mc", "mc2", "amex", "disc", "visa", "mc"])
    if kind == "amex":
        n = _luhn_complete(R.choice(["34", "37"]), 15)
        groups = [n[:4], n[4:10], n[10:]]
    else:
        pre = {"visa": "4", "mc": str(R.randint(51, 55)), "mc2": str(R.randint(2221, 2720)), "disc": "6011"}[kind]
        n = _luhn_complete(pre, 16)
        groups = [n[i:i + 4] for i in range(0, 16, 4)]
    sep = R.choice([" ", " ", "-", "", " "])
    out = sep.join(groups)
    assert luhn_ok(out)
    return out


IBAN_LAYOUT = {  # country: list of (kind, length) with kind "n" digits or "a" upper letters or "c" alnum
    "DE": [("n", 8), ("n", 10)], "GB": [("a", 4), ("n", 6), ("n", 8)], "FR": [("n", 5), ("n", 5), ("c", 11), ("n", 2)],
    "ES": [("n", 4), ("n", 4), ("n", 2), ("n", 10)], "NL": [("a", 4), ("n", 10)], "IT": [("a", 1), ("n", 5), ("n", 5), ("c", 12)],
    "BE": [("n", 12)], "CH": [("n", 5), ("c", 12)], "AT": [("n", 16)], "IE": [("a", 4), ("n", 6), ("n", 8)],
    "PT": [("n", 21)], "PL": [("n", 24)], "SE": [("n", 20)],
}
GB_BANKS = ["BARC", "NWBK", "HBUK", "LOYD", "MIDL", "MONZ"]
NL_BANKS = ["ABNA", "RABO", "INGB", "TRIO", "SNSB", "BUNQ"]
IE_BANKS = ["AIBK", "BOFI"]


def iban_check(country: str, bban: str) -> str:
    s = bban + country + "00"
    num = "".join(str(int(ch, 36)) for ch in s)
    return f"{98 - int(num) % 97:02d}"


def iban_valid(iban: str) -> bool:
    s = iban.replace(" ", "")
    s = s[4:] + s[:4]
    return int("".join(str(int(ch, 36)) for ch in s)) % 97 == 1


def iban(country: str | None = None) -> str:
    country = country or R.choice(["DE", "DE", "GB", "FR", "ES", "NL", "NL", "IT", "BE", "CH", "AT", "IE", "PT", "PL", "SE"])
    parts = []
    for kind, ln in IBAN_LAYOUT[country]:
        if kind == "n":
            parts.append(_d(ln))
        elif kind == "a":
            pool = {"GB": GB_BANKS, "NL": NL_BANKS, "IE": IE_BANKS}.get(country)
            parts.append(R.choice(pool) if pool and ln == 4 else "".join(R.choice(string.ascii_uppercase) for _ in range(ln)))
        else:
            parts.append("".join(R.choice(string.digits * 3 + string.ascii_uppercase) for _ in range(ln)))
    bban = "".join(parts)
    full = country + iban_check(country, bban) + bban
    assert iban_valid(full)
    if R.random() < 0.55:
        return " ".join(full[i:i + 4] for i in range(0, len(full), 4))
    return full


def ssn_us() -> str:
    while True:
        a = R.randint(1, 899)
        if a != 666:
            break
    s = f"{a:03d}-{R.randint(1, 99):02d}-{R.randint(1, 9999):04d}"
    return s if R.random() < 0.85 else s.replace("-", R.choice(["", " "]))


def nino() -> str:
    a = R.choice("ABCEGHJKLMNOPRSTWXYZ") + R.choice("ABCEGHJKLMNPRSTWXYZ")
    body = _d(6)
    suf = R.choice("ABCD")
    return R.choice([f"{a} {body[:2]} {body[2:4]} {body[4:]} {suf}", f"{a}{body}{suf}"])


def bsn() -> str:
    while True:
        ds = [R.randint(0, 9) for _ in range(8)]
        tot = sum(d * w for d, w in zip(ds, range(9, 1, -1)))
        last = tot % 11
        if last <= 9 and ds[0] != 0:
            return "".join(map(str, ds)) + str(last)


def dni() -> str:
    n = R.randint(10000000, 99999999)
    return f"{n}{'TRWAGMYFPDXBNJZSQVHLCKE'[n % 23]}"


def nir() -> str:  # French social security number with its key
    sex = R.choice("12")
    yy, mm = f"{R.randint(50, 99):02d}", f"{R.randint(1, 12):02d}"
    dep, com, ordre = f"{R.randint(1, 95):02d}", f"{R.randint(1, 999):03d}", f"{R.randint(1, 999):03d}"
    base = int(sex + yy + mm + dep + com + ordre)
    key = 97 - base % 97
    return f"{sex} {yy} {mm} {dep} {com} {ordre} {key:02d}"


def ssn_any() -> str:
    return R.choice([ssn_us, ssn_us, ssn_us, nino, bsn, dni, nir])()


def ipv4() -> str:
    first = R.choice([R.randint(11, 223), 10, 172, 192, 81, 185, 203, 62, 94])
    if first == 192:
        return f"192.168.{R.randint(0, 255)}.{R.randint(1, 254)}"
    if first == 172:
        return f"172.{R.randint(16, 31)}.{R.randint(0, 255)}.{R.randint(1, 254)}"
    return f"{first}.{R.randint(0, 255)}.{R.randint(0, 255)}.{R.randint(1, 254)}"


def ipv6() -> str:
    h = lambda: f"{R.randint(0, 0xffff):x}"  # noqa: E731
    return R.choice([f"2001:db8:{h()}:{h()}::{h()}", f"2a02:{h()}:{h()}:{h()}:{h()}:{h()}:{h()}:{h()}",
                     f"fe80::{h()}:{h()}:{h()}:{h()}", f"2600:1f18:{h()}:{h()}:{h()}:{h()}:{h()}:{h()}",
                     f"2a01:4f8:{h()}:{h()}::2", f"::ffff:{R.randint(11, 200)}.{R.randint(0, 255)}.{R.randint(0, 255)}.{R.randint(1, 254)}"])


def ip_any() -> str:
    return ipv4() if R.random() < 0.72 else ipv6()


def _rs(n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
    return "".join(R.choice(alphabet) for _ in range(n))


def api_key() -> str:
    return R.choice([
        lambda: "sk-" + _rs(48),
        lambda: "sk-proj-" + _rs(40) + "_" + _rs(20),
        lambda: "sk-ant-api03-" + _rs(60, string.ascii_letters + string.digits + "-_"),
        lambda: "AKIA" + _rs(16, string.ascii_uppercase + "234567"),
        lambda: "ghp_" + _rs(36),
        lambda: "github_pat_11" + _rs(20, string.ascii_uppercase + string.digits) + "_" + _rs(59),
        lambda: "xoxb-" + _d(12) + "-" + _d(13) + "-" + _rs(24),
        lambda: "AIza" + _rs(35, string.ascii_letters + string.digits + "-_"),
        lambda: "sk_live_" + _rs(24),
        lambda: "rk_live_" + _rs(24),
        lambda: "glpat-" + _rs(20, string.ascii_letters + string.digits + "-_"),
        lambda: "hf_" + _rs(34),
        lambda: "SG." + _rs(22) + "." + _rs(43),
        lambda: "npm_" + _rs(36),
    ])()


def aws_secret() -> str:
    return _rs(40, string.ascii_letters + string.digits + "/+")


def url_token() -> str:
    return R.choice([
        lambda: f"https://files.{R.choice(['dropshare', 'sendbox', 'cloudvault'])}.net/d/{_rs(10)}?token={_rs(32)}",
        lambda: f"https://hooks.slack.com/services/T{_rs(8, string.ascii_uppercase + string.digits)}/B{_rs(10, string.ascii_uppercase + string.digits)}/{_rs(24)}",
        lambda: f"https://{R.choice(['acme-exports', 'media-prod', 'invoices-eu'])}.s3.eu-west-1.amazonaws.com/{_rs(8).lower()}.pdf?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA{_rs(16, string.ascii_uppercase + '234567')}%2F20261104%2Feu-west-1%2Fs3%2Faws4_request&X-Amz-Signature={_rs(64, '0123456789abcdef')}",
        lambda: f"https://app.{R.choice(['billflow', 'payroll-hub', 'shiftly'])}.com/reset-password?uid={R.randint(1000, 99999)}&token={_rs(40)}",
        lambda: f"https://{R.choice(['deploy', 'ci'])}:{_rs(16)}@git.{R.choice(['internal', 'corp'])}.example.org/platform/api.git",
        lambda: f"https://api.{R.choice(['weatherly', 'geocodr', 'mapfinder'])}.io/v2/lookup?q=berlin&api_key={_rs(32, '0123456789abcdef')}",
        lambda: f"https://meet.{R.choice(['confera', 'talkroom'])}.com/j/{_d(10)}?pwd={_rs(32)}",
        lambda: f"https://discord.com/api/webhooks/{_d(18)}/{_rs(68, string.ascii_letters + string.digits + '-_')}",
        lambda: f"https://login.{R.choice(['portal', 'myaccount'])}.example.com/magic?email_token={_rs(48)}",
        lambda: f"postgres://app_user:{_rs(20)}@db-{R.randint(1, 9)}.prod.internal:5432/orders",
    ])()


def passport() -> str:
    return R.choice([
        lambda: _d(9),  # UK / US style
        lambda: R.choice("CFGHJK") + _rs(8, "CFGHJKLMNPRTVWXYZ0123456789"),  # German style
        lambda: _d(2) + "".join(R.choice(string.ascii_uppercase) for _ in range(2)) + _d(5),  # French style
        lambda: "".join(R.choice(string.ascii_uppercase) for _ in range(3)) + _d(6),  # Spanish style
        lambda: "".join(R.choice(string.ascii_uppercase) for _ in range(2)) + _rs(6, string.ascii_uppercase + string.digits) + _d(1),  # Dutch style
        lambda: R.choice("ZPKLM") + _d(7),  # Indian style
        lambda: R.choice(["E", "G"]) + _d(8),  # Chinese style
    ])()


# --------------------------------------------------------------------------------------------
# Addresses (many without a street-type suffix)
# --------------------------------------------------------------------------------------------
UK_STREETS = ["Harbour View", "Mill Lane", "Church Hill", "The Paddock", "Kingsway", "Orchard Rise",
              "Station Approach", "Broadwalk", "Priory Fields", "Hollybank", "The Crescent", "Marsh Side",
              "Waterloo Place", "Foxglove Close", "Cathedral Green", "Beacon Heights", "Larkspur"]
UK_TOWNS = [("Leeds", "LS6 2QT"), ("Bristol", "BS3 4EX"), ("Norwich", "NR2 1HL"), ("Ambleside", "LA22 9DN"),
            ("Cardiff", "CF10 3AT"), ("Glasgow", "G12 8QQ"), ("York", "YO1 7HH"), ("Brighton", "BN1 4GH"),
            ("London", "SE15 4QN"), ("London", "N1 9GU"), ("Belfast", "BT7 1NN"), ("Exeter", "EX4 3SR")]
US_STREETS = ["Maple Ave", "Oak Street", "Sunset Blvd", "Elm Ct", "Ridgecrest Dr", "Broadway", "Pinecrest",
              "Willow Bend", "Lakeshore", "Cedar Hollow Rd", "Magnolia Way", "Juniper Terrace", "W 34th St"]
US_TOWNS = [("Portland", "OR", "97205"), ("Austin", "TX", "78704"), ("Boise", "ID", "83702"),
            ("Columbus", "OH", "43215"), ("Asheville", "NC", "28801"), ("Madison", "WI", "53703"),
            ("Brooklyn", "NY", "11215"), ("Tucson", "AZ", "85719"), ("Savannah", "GA", "31401")]
DE_STREETS = ["Lindenstraße", "Am Weiher", "Hauptstr.", "Gartenweg", "Kastanienallee", "Zur Mühle",
              "Auf dem Berg", "Friedrichstraße", "Schillerplatz", "Im Winkel", "An der Alster", "Karl-Marx-Allee"]
DE_TOWNS = [("10969", "Berlin"), ("50667", "Köln"), ("80331", "München"), ("20095", "Hamburg"),
            ("04109", "Leipzig"), ("70173", "Stuttgart"), ("01067", "Dresden"), ("48143", "Münster")]
FR_STREETS = ["rue des Lilas", "avenue Jean Jaurès", "boulevard Voltaire", "impasse du Moulin",
              "place de la République", "chemin des Vignes", "allée des Tilleuls", "quai de la Loire",
              "rue du Faubourg Saint-Denis", "cours Mirabeau"]
FR_TOWNS = [("75011", "Paris"), ("69003", "Lyon"), ("13001", "Marseille"), ("31000", "Toulouse"),
            ("33000", "Bordeaux"), ("44000", "Nantes"), ("67000", "Strasbourg"), ("13100", "Aix-en-Provence")]
ES_STREETS = ["Calle Mayor", "Avda. de la Constitución", "C/ Alcalá", "Paseo de Gracia", "Plaza del Sol",
              "Calle de la Luna", "Rambla de Catalunya", "Camino Viejo", "Travesía del Carmen", "Gran Vía"]
ES_TOWNS = [("28013", "Madrid"), ("41004", "Sevilla"), ("08007", "Barcelona"), ("46002", "Valencia"),
            ("48001", "Bilbao"), ("29015", "Málaga"), ("50001", "Zaragoza")]
NL_STREETS = ["Keizersgracht", "Oudegracht", "Dorpsstraat", "Laan van Meerdervoort", "Prinsengracht",
              "Zeedijk", "Witte de Withstraat", "Kerkpad", "Havenkade", "Bloemgracht"]
NL_TOWNS = [("1016 DV", "Amsterdam"), ("3511 AP", "Utrecht"), ("2517 JK", "Den Haag"), ("3012 BL", "Rotterdam"),
            ("9711 LM", "Groningen"), ("5611 EM", "Eindhoven")]
IT_STREETS = ["Via Roma", "Corso Vittorio Emanuele II", "Viale dei Mille", "Piazza Navona", "Via della Spiga",
              "Vicolo del Cinque"]
IT_TOWNS = [("20121", "Milano"), ("00186", "Roma"), ("50122", "Firenze"), ("10121", "Torino"), ("80132", "Napoli")]


def addr_uk() -> str:
    st, (town, pc) = R.choice(UK_STREETS), R.choice(UK_TOWNS)
    n = R.randint(1, 180)
    return R.choice([f"Flat {R.randint(1, 24)}, {n} {st}, {town} {pc}", f"{n} {st}, {town} {pc}",
                     f"{n} {st}, {town}", f"{R.choice(['Rose Cottage', 'The Old Rectory', 'Ivy House', 'Hillcrest'])}, {st}, {town} {pc}",
                     f"{n}a {st}\n{town}\n{pc}", f"Apartment {R.randint(1, 60)}, {R.choice(['Wharf House', 'Albion Court', 'Meridian Point'])}, {n} {st}, {town} {pc}"])


def addr_us() -> str:
    st, (town, state, z) = R.choice(US_STREETS), R.choice(US_TOWNS)
    n = R.randint(10, 9800)
    return R.choice([f"{n} {st}, {town}, {state} {z}", f"{n} {st}, Apt {R.randint(1, 40)}{R.choice('ABCD')}, {town}, {state} {z}",
                     f"{n} {st} #{R.randint(100, 999)}, {town} {state} {z}", f"{n} {st}\n{town}, {state} {z}",
                     f"{n} {st}, Unit {R.randint(1, 30)}, {town}, {state} {z}-{_d(4)}"])


def addr_de() -> str:
    st, (pc, town) = R.choice(DE_STREETS), R.choice(DE_TOWNS)
    n = f"{R.randint(1, 140)}{R.choice(['', '', '', 'a', 'b'])}"
    return R.choice([f"{st} {n}, {pc} {town}", f"{st} {n}\n{pc} {town}", f"{st} {n}, {R.randint(1, 4)}. OG, {pc} {town}",
                     f"c/o {name_family()}, {st} {n}, {pc} {town}"])


def addr_fr() -> str:
    st, (pc, town) = R.choice(FR_STREETS), R.choice(FR_TOWNS)
    n = f"{R.randint(1, 120)}{R.choice(['', '', '', ' bis', ' ter'])}"
    return R.choice([f"{n} {st}, {pc} {town}", f"{n} {st}\n{pc} {town}",
                     f"Résidence {R.choice(['Les Pins', 'Le Parc', 'Les Cèdres'])}, Bât. {R.choice('ABC')}, {n} {st}, {pc} {town}",
                     f"{n}, {st}, {pc} {town}"])


def addr_es() -> str:
    st, (pc, town) = R.choice(ES_STREETS), R.choice(ES_TOWNS)
    n = R.randint(1, 200)
    return R.choice([f"{st} {n}, {R.randint(1, 9)}º{R.choice('ABCD')}, {pc} {town}", f"{st}, {n}, {pc} {town}",
                     f"{st} {n}, {R.randint(1, 6)}º {R.choice(['izq.', 'dcha.'])}, {pc} {town}", f"{st} {n}, {town}"])


def addr_nl() -> str:
    st, (pc, town) = R.choice(NL_STREETS), R.choice(NL_TOWNS)
    n = f"{R.randint(1, 400)}{R.choice(['', '', '-2', ' hs', 'A'])}"
    return R.choice([f"{st} {n}, {pc} {town}", f"{st} {n}\n{pc} {town}", f"{st} {n}, {town}"])


def addr_it() -> str:
    st, (pc, town) = R.choice(IT_STREETS), R.choice(IT_TOWNS)
    return R.choice([f"{st} {R.randint(1, 90)}, {pc} {town}", f"{st}, {R.randint(1, 90)} - {pc} {town}"])


def addr_po() -> str:
    return R.choice([f"PO Box {R.randint(100, 9999)}, {R.choice(US_TOWNS)[0]}, {R.choice(US_TOWNS)[1]} {R.choice(US_TOWNS)[2]}",
                     f"P.O. Box {R.randint(10, 999)}, {R.choice(UK_TOWNS)[0]} {R.choice(UK_TOWNS)[1]}",
                     f"Postfach {R.randint(10, 99)} {_d(2)}, {R.choice(DE_TOWNS)[0]} {R.choice(DE_TOWNS)[1]}",
                     f"BP {R.randint(10, 999)}, {R.choice(FR_TOWNS)[0]} {R.choice(FR_TOWNS)[1]} Cedex",
                     f"Postbus {R.randint(100, 9999)}, {R.choice(NL_TOWNS)[0]} {R.choice(NL_TOWNS)[1]}",
                     f"Apartado de Correos {R.randint(10, 999)}, {R.choice(ES_TOWNS)[0]} {R.choice(ES_TOWNS)[1]}",
                     f"PO Box {R.randint(100, 9999)}"])


def addr_world() -> str:
    return R.choice([
        lambda: f"Plot {R.randint(1, 90)}, Admiralty Way, Lekki Phase 1, Lagos",
        lambda: f"Flat {R.randint(101, 904)}, Sai Krupa Apartments, {R.randint(1, 20)}th Cross, Indiranagar, Bengaluru 5600{R.randint(10, 99)}",
        lambda: f"{R.randint(1, 9)}-{R.randint(1, 30)}-{R.randint(1, 20)} Jingumae, Shibuya-ku, Tokyo 150-0001",
        lambda: f"{R.randint(10, 900)} Queen St W, Toronto, ON M5H 2N2",
        lambda: f"Unit {R.randint(1, 20)}/{R.randint(1, 90)} Beach Rd, Bondi NSW 2026",
        lambda: f"Rua Augusta {R.randint(10, 900)}, 1100-053 Lisboa",
        lambda: f"ul. Marszałkowska {R.randint(1, 140)}/{R.randint(1, 30)}, 00-{R.randint(100, 999)} Warszawa",
        lambda: f"Bahnhofstrasse {R.randint(1, 90)}, 8001 Zürich",
        lambda: f"House {R.randint(1, 90)}, Road {R.randint(1, 27)}, Dhanmondi, Dhaka 1209",
        lambda: f"Ngong Road, Kilimani, P.O. Box {R.randint(1000, 99999)}-00100, Nairobi",
        lambda: f"Moda Mahallesi, Caferağa Sk. No:{R.randint(1, 60)}, 34710 Kadıköy/İstanbul",
        lambda: f"{R.randint(1, 99)} Nguyễn Huệ, Quận 1, Hồ Chí Minh",
        lambda: f"Av. Paulista, {R.randint(100, 2500)} - Bela Vista, São Paulo - SP, 01310-100",
        lambda: f"Storgatan {R.randint(1, 60)}, 114 55 Stockholm",
        lambda: f"Calle {R.randint(10, 150)} # {R.randint(1, 90)}-{R.randint(10, 99)}, Bogotá",
    ])()


def addr_short() -> str:  # street part only, often no suffix
    return R.choice([f"{R.randint(1, 99)} {R.choice(UK_STREETS)}", f"{R.choice(DE_STREETS)} {R.randint(1, 60)}",
                     f"{R.randint(1, 300)} {R.choice(US_STREETS)}", f"{R.choice(NL_STREETS)} {R.randint(1, 300)}",
                     f"Flat {R.randint(1, 12)}, {R.randint(1, 99)} {R.choice(UK_STREETS)}", f"{R.choice(ES_STREETS)} {R.randint(1, 90)}, {R.randint(1, 5)}º{R.choice('ABCD')}"])


def addr_any() -> str:
    return R.choice([addr_uk, addr_us, addr_de, addr_fr, addr_es, addr_nl, addr_it, addr_po, addr_world, addr_short])()


# --------------------------------------------------------------------------------------------
# Orgs, places, dates of birth
# --------------------------------------------------------------------------------------------
ORGS = ["Harbour Logistics Ltd", "Kleinbau GmbH", "Studio Lumière SARL", "Norte Seguros S.A.",
        "Brightpath Analytics", "Quill Finance", "Meridian Health Trust", "Van Leeuwen Transport B.V.",
        "Oakridge Dental Group", "Pfeiffer & Söhne KG", "Banco del Levante", "Crédit Mutuel de Bretagne",
        "Sparkasse Mittelfranken", "Nordlicht Energie AG", "Tamarind Foods Pvt Ltd", "Sakura Trading K.K.",
        "Mwangaza Solar Ltd", "St. Brigid's Primary School", "Riverside Veterinary Clinic",
        "Fondation Aurore", "Greenleaf Housing Association", "Atlas Freight Forwarding", "Okonkwo & Partners LLP",
        "Hollis Pharmacy", "Café Central Wien", "Linde Bakkerij", "Università di Bologna", "Barclays",
        "Deutsche Bahn", "Rabobank", "Santander", "Allianz", "Zurich Insurance", "the City Council"]
CITIES = ["Lyon", "Rotterdam", "Seville", "Bilbao", "Manchester", "Leipzig", "Kraków", "Porto", "Gdańsk",
          "Nairobi", "Lagos", "Pune", "Osaka", "Busan", "Da Nang", "Izmir", "Thessaloniki", "Cork",
          "Bergen", "Tampere", "Calgary", "Montevideo", "Cluj-Napoca", "Ghent", "Graz", "Brno", "Aarhus",
          "Marrakesh", "Haifa", "Perth", "Recife", "Medellín", "Chiang Mai", "Reading", "Bath", "Nice"]
COUNTRIES = ["Portugal", "Kenya", "the Netherlands", "Belgium", "Canada", "Mexico", "Vietnam", "Ireland",
             "Norway", "Poland", "Morocco", "New Zealand", "Argentina", "Switzerland", "Scotland"]
MONTHS = {"en": ["January", "February", "March", "April", "May", "June", "July", "August", "September",
                 "October", "November", "December"],
          "de": ["Januar", "Februar", "März", "April", "Mai", "Juni", "Juli", "August", "September", "Oktober",
                 "November", "Dezember"],
          "fr": ["janvier", "février", "mars", "avril", "mai", "juin", "juillet", "août", "septembre", "octobre",
                 "novembre", "décembre"],
          "es": ["enero", "febrero", "marzo", "abril", "mayo", "junio", "julio", "agosto", "septiembre", "octubre",
                 "noviembre", "diciembre"],
          "nl": ["januari", "februari", "maart", "april", "mei", "juni", "juli", "augustus", "september",
                 "oktober", "november", "december"]}


def _ymd() -> tuple[int, int, int]:
    return R.randint(1938, 2008), R.randint(1, 12), R.randint(1, 28)


def dob_en() -> str:
    y, m, d = _ymd()
    return R.choice([f"{d:02d}/{m:02d}/{y}", f"{m}/{d}/{y}", f"{MONTHS['en'][m - 1]} {d}, {y}", f"{d} {MONTHS['en'][m - 1]} {y}",
                     f"{y}-{m:02d}-{d:02d}", f"{d} {MONTHS['en'][m - 1][:3]} {y}"])


def dob_de() -> str:
    y, m, d = _ymd()
    return R.choice([f"{d:02d}.{m:02d}.{y}", f"{d}. {MONTHS['de'][m - 1]} {y}"])


def dob_fr() -> str:
    y, m, d = _ymd()
    return R.choice([f"{d:02d}/{m:02d}/{y}", f"{d} {MONTHS['fr'][m - 1]} {y}"])


def dob_es() -> str:
    y, m, d = _ymd()
    return R.choice([f"{d:02d}/{m:02d}/{y}", f"{d} de {MONTHS['es'][m - 1]} de {y}"])


def dob_nl() -> str:
    y, m, d = _ymd()
    return R.choice([f"{d:02d}-{m:02d}-{y}", f"{d} {MONTHS['nl'][m - 1]} {y}"])


def dob_iso() -> str:
    y, m, d = _ymd()
    return f"{y}-{m:02d}-{d:02d}"


# --------------------------------------------------------------------------------------------
# Look-alikes that are NOT PII (hard negatives)
# --------------------------------------------------------------------------------------------
def neg_version() -> str:
    return R.choice([f"v{R.randint(0, 9)}.{R.randint(0, 30)}.{R.randint(0, 99)}", f"{R.randint(1, 3)}.{R.randint(0, 12)}.{R.randint(0, 40)}-rc{R.randint(1, 5)}",
                     f"10.{R.randint(0, 9)}.{R.randint(0, 99)}.{R.randint(256, 9999)}", f"{R.randint(2019, 2026)}.{R.randint(1, 12)}.{R.randint(1, 9)}"])


def neg_sha() -> str:
    return _rs(40, "0123456789abcdef") if R.random() < 0.4 else _rs(R.choice([7, 8, 12]), "0123456789abcdef")


def neg_order() -> str:
    return R.choice([f"ORD-{_d(8)}", f"#{_d(7)}", f"INV-{R.randint(2020, 2026)}-{_d(5)}", f"{_d(3)}-{_d(7)}-{_d(7)}",
                     f"PO{_d(10)}", f"RMA{_d(6)}", f"CS-{_d(6)}"])


def neg_date() -> str:
    y, m, d = R.randint(2023, 2027), R.randint(1, 12), R.randint(1, 28)
    return R.choice([f"{y}-{m:02d}-{d:02d}", f"{d:02d}/{m:02d}/{y}", f"{MONTHS['en'][m - 1]} {d}", f"{d}.{m:02d}.{y}"])


def neg_uuid() -> str:
    h = lambda n: _rs(n, "0123456789abcdef")  # noqa: E731
    return f"{h(8)}-{h(4)}-4{h(3)}-{R.choice('89ab')}{h(3)}-{h(12)}"


def neg_product() -> str:
    return R.choice(["Galaxy S23 Ultra", "ThinkPad X1 Carbon Gen 11", "AirPods Pro", "PostgreSQL 15.4", "Kubernetes 1.29",
                     "Redis 7.2", "Raspberry Pi 5", "Model 3 Long Range", "Pixel 8a", "iPhone 15", "Kindle Paperwhite",
                     "MacBook Air M2", "Node 20 LTS", "Ubuntu 22.04.4", "Windows 11 23H2", "Dyson V15 Detect"])


def neg_ts() -> str:
    return f"2026-{R.randint(1, 11):02d}-{R.randint(1, 28):02d}T{R.randint(0, 23):02d}:{R.randint(0, 59):02d}:{R.randint(0, 59):02d}.{_d(3)}Z"


def neg_amount() -> str:
    return R.choice([f"€{R.randint(5, 900)},{_d(2)}", f"${R.randint(5, 4000)}.{_d(2)}", f"£{R.randint(5, 900)}.{_d(2)}",
                     f"{R.randint(1, 90)}.{_d(2)} EUR"])


def neg_number() -> str:  # long numbers that are not cards/phones: tracking, build, line counts
    return R.choice([f"1Z{_rs(6, string.ascii_uppercase + string.digits)}{_d(10)}", f"build {_d(5)}", f"{_d(4)} {_d(4)}",
                     f"{R.randint(1000, 99999)} rows", f"pid {R.randint(1000, 65000)}", f"port {R.choice([5432, 6379, 8080, 9092, 27017])}"])


# --------------------------------------------------------------------------------------------
# Placeholder registry: key -> (entity type or None, generator)
# --------------------------------------------------------------------------------------------
GEN = {
    "name": ("PERSON", name_full), "first": ("PERSON", name_given), "family": ("PERSON", name_family),
    "initial": ("PERSON", name_initial), "wname": ("PERSON", name_word), "pname": ("PERSON", name_particle),
    "lname": ("PERSON", name_lower),
    "email": ("EMAIL", email),
    "phone": ("PHONE", phone_any), "phone_us": ("PHONE", phone_us), "phone_uk": ("PHONE", phone_uk),
    "phone_de": ("PHONE", phone_de), "phone_fr": ("PHONE", phone_fr), "phone_es": ("PHONE", phone_es),
    "phone_nl": ("PHONE", phone_nl), "phone_e164": ("PHONE", phone_e164), "phone_digits": ("PHONE", phone_digits),
    "card": ("CREDIT_CARD", card),
    "iban": ("IBAN", iban), "iban_de": ("IBAN", lambda: iban("DE")), "iban_fr": ("IBAN", lambda: iban("FR")),
    "iban_es": ("IBAN", lambda: iban("ES")), "iban_nl": ("IBAN", lambda: iban("NL")), "iban_gb": ("IBAN", lambda: iban("GB")),
    "ssn": ("SSN", ssn_us), "nino": ("SSN", nino), "bsn": ("SSN", bsn), "dni": ("SSN", dni), "nir": ("SSN", nir),
    "natid": ("SSN", ssn_any),
    "ip": ("IP_ADDRESS", ip_any), "ip4": ("IP_ADDRESS", ipv4), "ip6": ("IP_ADDRESS", ipv6),
    "apikey": ("API_KEY", api_key), "awssecret": ("API_KEY", aws_secret), "urltok": ("URL_WITH_TOKEN", url_token),
    "passport": ("PASSPORT", passport),
    "addr": ("ADDRESS", addr_any), "addr_uk": ("ADDRESS", addr_uk), "addr_us": ("ADDRESS", addr_us),
    "addr_de": ("ADDRESS", addr_de), "addr_fr": ("ADDRESS", addr_fr), "addr_es": ("ADDRESS", addr_es),
    "addr_nl": ("ADDRESS", addr_nl), "addr_it": ("ADDRESS", addr_it), "addr_po": ("ADDRESS", addr_po),
    "addr_world": ("ADDRESS", addr_world), "addr_short": ("ADDRESS", addr_short),
    "org": ("ORG", lambda: R.choice(ORGS)), "city": ("LOCATION", lambda: R.choice(CITIES)),
    "country": ("LOCATION", lambda: R.choice(COUNTRIES)),
    "dob": ("DATE_OF_BIRTH", dob_en), "dob_de": ("DATE_OF_BIRTH", dob_de), "dob_fr": ("DATE_OF_BIRTH", dob_fr),
    "dob_es": ("DATE_OF_BIRTH", dob_es), "dob_nl": ("DATE_OF_BIRTH", dob_nl), "dob_iso": ("DATE_OF_BIRTH", dob_iso),
    # not PII
    "ver": (None, neg_version), "sha": (None, neg_sha), "order": (None, neg_order), "date": (None, neg_date),
    "uuid": (None, neg_uuid), "product": (None, neg_product), "ts": (None, neg_ts), "amount": (None, neg_amount),
    "num": (None, neg_number), "int": (None, lambda: str(R.randint(2, 500))),
}

# --------------------------------------------------------------------------------------------
# Hand-written templates. [[key]] is a placeholder; [[key#1]] repeats the same value in a record.
# --------------------------------------------------------------------------------------------
T = []


def t(style: str, lang: str, *texts: str) -> None:
    for x in texts:
        T.append((style, lang, x))


# support chat
t("support_chat", "en",
  "user: hi, my card [[card]] got charged twice for order [[order]]\nassistant: Sorry about that! Can you confirm the email on the account?\nuser: [[email]]",
  "user: hey its [[lname]] again, still no refund\nassistant: Hi! Let me check. Which phone number did you register with?\nuser: [[phone]]",
  "Customer: I moved to [[addr_uk]] last month, please update my delivery address.\nAgent: Done, [[first]]. Anything else?",
  "user: can u send the invoice to [[wname]] at [[email]]? she handles our accounts\nassistant: Sure, sent.",
  "user: My name is [[name]], DOB [[dob]], and I can't log in since the update to [[ver]].\nassistant: Thanks, I've reset the session.",
  "assistant: Hello [[first]], how can I help today?\nuser: the parcel for [[addr_us]] shows delivered but nothing arrived. tracking [[num]]",
  "user: i think someone used my account from [[ip4]], i'm in [[city]] and never been there\nassistant: I've locked the account and sent a code to [[phone]].",
  "user: Refund to IBAN [[iban]] please, account holder [[name]]\nassistant: Got it. Refunds take 3-5 working days.",
  "user: pls call me back on [[phone_uk]] after 5, ask for [[first]]",
  "agent: for verification, last four of your SSN?\ncustomer: whole thing is [[ssn]], whatever\nagent: Please never share the full number. I have masked it.",
  "user: hi, [[lname]] here, my son will pick up the repair, his name is [[wname]]\nassistant: Noted on ticket [[order]].",
  "user: upgrade to [[product]] failed with error 0x80070005 on build [[ver]]\nassistant: Known issue, fixed in [[ver]].",
  "user: can you tell [[first]] in billing that the transfer from [[org]] was sent on [[date]]?",
  "[10:02] [[lname]]: is the shop on [[addr_short]] still open?\n[10:03] support: yes until 8pm",
  "user: I need the statement sent to my PO box: [[addr_po]]\nagent: Updated, [[name]].",
  "user: my passport number is [[passport]] for the booking, flying with [[first]]\nassistant: Thanks, added to reservation [[order]].",
  "user: cancel everything and delete my data. [[name]], [[email]], [[phone]]",
)
t("support_chat", "de",
  "Kunde: Hallo, ich bin [[name]] und wohne jetzt in der [[addr_de]]. Bitte Adresse ändern.\nAgent: Erledigt!",
  "Kunde: Die Abbuchung von meinem Konto [[iban_de]] war doppelt.\nAgent: Das tut mir leid, [[first]]. Ich prüfe das.",
  "Nutzer: ruf mich bitte unter [[phone_de]] an, geht um Vertrag [[order]]\nSupport: Machen wir, Frau [[family]].",
  "Nutzer: Geburtsdatum [[dob_de]], Kundennummer [[order]], Name [[name]]",
)
t("support_chat", "fr",
  "client : Bonjour, je suis [[name]], né le [[dob_fr]]. Mon numéro est le [[phone_fr]].\nconseiller : Merci, je vérifie.",
  "client : Ma nouvelle adresse : [[addr_fr]]. Merci de mettre à jour la livraison.\nconseiller : C'est fait, [[first]].",
  "client : le prélèvement sur [[iban_fr]] a échoué, pourquoi ?",
)
t("support_chat", "es",
  "cliente: hola, soy [[name]], vivo en [[addr_es]] y el pedido [[order]] no ha llegado\nagente: Lo reviso ahora mismo.",
  "cliente: mi DNI es [[dni]] y mi móvil [[phone_es]]\nagente: Gracias, [[first]].",
)
t("support_chat", "nl",
  "klant: hoi, ik ben [[name]], mijn nieuwe adres is [[addr_nl]]\nmedewerker: Bedankt, aangepast!",
  "klant: graag terugstorten op [[iban_nl]], t.n.v. [[name]]\nmedewerker: Komt in orde.",
)

# code review
t("code_review", "en",
  "nit: don't hard-code the test user here (`\"[[email]]\"`), use a fixture. Also the phone `[[phone_e164]]` is a real number, please replace it.",
  "```python\nclient = OpenAI(api_key=\"[[apikey]]\")\n```\nPlease load this from the environment instead, this key is now in git history (commit [[sha]]).",
  "diff --git a/config/settings.py b/config/settings.py\n+AWS_ACCESS_KEY_ID = \"[[apikey]]\"\n+AWS_SECRET_ACCESS_KEY = \"[[awssecret]]\"\n+REGION = \"eu-west-1\"",
  "LGTM apart from the fixture in tests/test_billing.py: `card_number=\"[[card]]\"` is that a live card? It passes Luhn.",
  "Reviewed-by: [[name]] <[[email]]>\nSigned-off-by: [[name]] <[[email]]>",
  "@[[lname]] the webhook URL `[[urltok]]` is committed in plain text on line [[int]], rotate it please",
  "The seed data has `{\"name\": \"[[name]]\", \"phone\": \"[[phone]]\", \"iban\": \"[[iban]]\"}`. Can we use obviously fake values?",
  "Bumping [[product]] to [[ver]] (commit [[sha]]). No functional change; [[first]] ran the migrations on staging.",
  "why is `ALLOWED_HOSTS` including [[ip4]] and [[ip6]]? those are the office boxes, not prod",
  "```js\nconst user = { fullName: '[[name]]', dob: '[[dob_iso]]', ssn: '[[ssn]]' };\n```\nPlease don't log this object.",
  "+    # TODO([[lname]]): remove before merge\n+    DEFAULT_CONTACT = \"[[phone_digits]]\"",
  "Co-authored-by: [[name]] <[[email]]>",
  "The regex in validate_postcode() rejects `[[addr_uk]]` which is a valid address. Added it as a test case in [[sha]].",
  "hmm, `GITHUB_TOKEN=[[apikey]]` in .env.example? the example should use a placeholder",
  "Thanks [[first]]! Merged as [[sha]], released in [[ver]].",
  "```yaml\nsmtp:\n  user: [[email]]\n  host: [[ip4]]\n  port: 587\n```\nmove creds to the vault",
  "we store `dob` as `'[[dob_iso]]'` strings in the fixture for [[name]]; use date objects",
)
t("code_review", "de",
  "Bitte die Test-IBAN `[[iban_de]]` durch eine offensichtlich falsche ersetzen, die ist gültig. – [[first]]",
)

# agent tool calls
t("agent_tool_call", "en",
  "{\"tool\": \"send_sms\", \"arguments\": {\"to\": \"[[phone_e164]]\", \"body\": \"Your code is 482913\"}}",
  "{\"name\": \"crm.update_contact\", \"args\": {\"contact_id\": \"[[uuid]]\", \"full_name\": \"[[name]]\", \"email\": \"[[email]]\", \"mobile\": \"[[phone]]\"}}",
  "tool_call: lookup_customer(query=\"[[lname]]\")\nresult: {\"id\": [[int]], \"name\": \"[[name]]\", \"address\": \"[[addr]]\", \"tier\": \"gold\"}",
  "{\"function\": \"charge_card\", \"parameters\": {\"card\": \"[[card]]\", \"amount\": \"[[amount]]\", \"order\": \"[[order]]\"}}",
  "{\"tool\": \"bank_transfer\", \"input\": {\"beneficiary\": \"[[name]]\", \"iban\": \"[[iban]]\", \"reference\": \"[[order]]\"}}",
  "Action: http_get\nAction Input: [[urltok]]\nObservation: 200 OK (2.3 kB)",
  "{\"type\": \"tool_use\", \"name\": \"create_ticket\", \"input\": {\"reporter\": \"[[email]]\", \"summary\": \"Login fails after [[product]] update\", \"ip\": \"[[ip]]\"}}",
  "{\"tool\": \"verify_identity\", \"args\": {\"ssn\": \"[[ssn]]\", \"dob\": \"[[dob_iso]]\", \"last_name\": \"[[family]]\"}}",
  "call geocode({\"address\": \"[[addr]]\"}) -> {\"lat\": 51.5072, \"lng\": -0.1276}",
  "{\"tool\":\"book_flight\",\"args\":{\"passenger\":\"[[name]]\",\"passport\":\"[[passport]]\",\"dob\":\"[[dob_iso]]\",\"phone\":\"[[phone]]\"}}",
  "assistant -> tool `sql.query`: SELECT * FROM users WHERE email = '[[email]]' OR phone = '[[phone_digits]]';",
  "{\"tool\": \"set_secret\", \"args\": {\"name\": \"OPENAI_API_KEY\", \"value\": \"[[apikey]]\"}}",
  "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"[[city]]\", \"units\": \"metric\"}}",
  "{\"tool\": \"deploy\", \"args\": {\"service\": \"checkout\", \"version\": \"[[ver]]\", \"commit\": \"[[sha]]\", \"replicas\": 3}}",
  "tool result: [{\"employee\": \"[[name]]\", \"employer\": \"[[org]]\", \"nino\": \"[[nino]]\"}, {\"employee\": \"[[name]]\", \"employer\": \"[[org]]\", \"nino\": \"[[nino]]\"}]",
  "{\"tool\": \"send_email\", \"args\": {\"to\": [\"[[email]]\", \"[[email]]\"], \"subject\": \"Welcome [[first]]\", \"body\": \"See you on [[date]].\"}}",
  "<tool_call>{\"name\": \"ship_order\", \"arguments\": {\"recipient\": \"[[name]]\", \"street\": \"[[addr_short]]\", \"phone\": \"[[phone]]\"}}</tool_call>",
  "{\"tool\": \"firewall.block\", \"args\": {\"source\": \"[[ip]]\", \"reason\": \"credential stuffing\", \"ttl\": 3600}}",
)
t("agent_tool_call", "nl",
  "{\"tool\": \"klant_bijwerken\", \"args\": {\"naam\": \"[[name]]\", \"bsn\": \"[[bsn]]\", \"telefoon\": \"[[phone_nl]]\"}}",
)
t("agent_tool_call", "fr",
  "{\"outil\": \"creer_dossier\", \"args\": {\"assure\": \"[[name]]\", \"nir\": \"[[nir]]\", \"adresse\": \"[[addr_fr]]\"}}",
)

# email
t("email", "en",
  "Hi [[first]],\n\nThanks for your time today. As discussed, please wire the deposit to [[iban_gb]] and send the receipt to [[email]].\n\nBest,\n[[name]]\n[[org]]\n[[phone_uk]]",
  "Dear Mr [[family]],\n\nYour appointment is confirmed for [[date]] at our clinic. Please bring your referral letter.\n\nKind regards,\n[[first]]",
  "From: [[name]] <[[email]]>\nTo: [[email]]\nSubject: Re: lease renewal\n\nThe new tenant at [[addr]] is [[wname]]. Her mobile is [[phone]].",
  "Hello team,\n\n[[wname]] starts Monday in [[city]]. Her passport ([[passport]]) and date of birth ([[dob]]) are in the HR folder, do not forward.\n\n-- [[first]]",
  "Hi,\nplease find attached invoice [[order]] for [[amount]]. Payment by card ending in 4242 or transfer.\nThanks\n[[first]]",
  "Dear [[name]],\n\nWe received a login to your account from [[ip]] on [[date]]. If this wasn't you, reset your password here: [[urltok]]\n\nSecurity Team",
  "cheers [[lname]], see you at [[addr_short]] on friday. my number if you get lost: [[phone]]",
  "To whom it may concern,\n\nI, [[name]], born [[dob]], residing at [[addr_us]], SSN [[ssn]], authorize the release of my records.\n\nSigned, [[name]]",
  "Bonjour [[first]],\n\nJe vous confirme notre rendez-vous. Mon adresse : [[addr_fr]].\n\nCordialement,\n[[name]]\nTél. [[phone_fr]]",
  "Release notes [[ver]]: fixed crash on [[product]], improved sync (commit [[sha]]). Thanks to everyone who reported it.",
  "Hi [[first]] and [[first]],\n\nthe shared drive link is [[urltok]] - it expires on [[date]].\n\nx",
  "Sehr geehrte Frau [[family]],\n\nanbei die Unterlagen. Bitte überweisen Sie den Betrag auf [[iban_de]].\n\nMit freundlichen Grüßen\n[[name]]\n[[addr_de]]",
  "Estimado [[first]]:\n\nle escribo desde [[org]]. Puede llamarme al [[phone_es]] o escribirme a [[email]].\n\nUn saludo,\n[[name]]",
  "Beste [[first]],\n\nHierbij de gegevens van [[name]]: geboren [[dob_nl]], adres [[addr_nl]].\n\nGroet,\n[[first]]",
)

# sms
t("sms", "en",
  "hey its [[lname]] new number, save it: [[phone]]",
  "Your [[org]] verification code is 551204. Do not share it. Not you? Call [[phone_us]]",
  "running late, tell [[first]] to wait at [[addr_short]] x",
  "Delivery for [[name]] at [[addr]] today between 2-4pm. Reply STOP to opt out.",
  "[[first]] can u send me ur IBAN again? [[first]]: [[iban]]",
  "ok sent £40 to [[wname]], her card was [[card]] lol dont tell",
  "meet at [[city]] station 6pm? – [[first]]",
  "Ihr Paket für [[name]] wird heute an [[addr_de]] zugestellt.",
  "RDV confirmé le [[date]] à 14h. Pour annuler : [[phone_fr]]",
  "Tu cita está confirmada, [[first]]. Dirección: [[addr_es]]",
  "Order [[order]] shipped. Track: 1Z999AA10123456784. Est. [[date]]",
  "call [[lname]] on [[phone]] re the flat at [[addr_uk]]",
)

# forms
t("form", "en",
  "Full name: [[name]]\nDate of birth: [[dob]]\nAddress: [[addr]]\nPhone: [[phone]]\nEmail: [[email]]",
  "Applicant: [[name]] | SSN: [[ssn]] | DOB: [[dob]] | Employer: [[org]]",
  "Cardholder: [[name]]\nCard number: [[card]]\nExpiry: 09/28\nBilling address: [[addr_us]]",
  "name=[[name]]&email=[[email]]&phone=[[phone]]&plan=pro&coupon=SPRING24",
  "Passport No.: [[passport]]\nNationality: [[country]]\nSurname: [[family]]\nGiven names: [[first]]\nDate of birth: [[dob]]",
  "Emergency contact: [[wname]] (sister) – [[phone]]",
  "Bank details\nAccount holder: [[name]]\nIBAN: [[iban]]\nBIC: DEUTDEFFXXX",
  "National Insurance number: [[nino]]\nName: [[name]]\nPostcode address: [[addr_uk]]",
  "Order form – SKU [[order]], qty [[int]], version [[ver]], requested [[date]]",
)
t("form", "de",
  "Name: [[name]]\nGeburtsdatum: [[dob_de]]\nAnschrift: [[addr_de]]\nTelefon: [[phone_de]]\nIBAN: [[iban_de]]",
)
t("form", "fr",
  "Nom : [[family]]\nPrénom : [[first]]\nDate de naissance : [[dob_fr]]\nN° de sécurité sociale : [[nir]]\nAdresse : [[addr_fr]]",
)
t("form", "es",
  "Nombre y apellidos: [[name]]\nDNI: [[dni]]\nFecha de nacimiento: [[dob_es]]\nDomicilio: [[addr_es]]\nTeléfono: [[phone_es]]",
)
t("form", "nl",
  "Naam: [[name]]\nBSN: [[bsn]]\nGeboortedatum: [[dob_nl]]\nAdres: [[addr_nl]]\nIBAN: [[iban_nl]]",
)
t("form", "it",
  "Nome: [[name]]\nIndirizzo: [[addr_it]]\nCellulare: [[phone]]\nE-mail: [[email]]",
)

# log lines
t("log_line", "en",
  "[[ts]] INFO  sms.dispatch to=[[phone_e164]] template=otp status=queued",
  "[[ip4]] - - [06/Nov/2026:10:14:07 +0000] \"POST /api/v1/login HTTP/1.1\" 401 512 \"-\" \"Mozilla/5.0\"",
  "[[ts]] WARN auth failed user=[[email]] src=[[ip]] attempts=[[int]]",
  "level=error msg=\"payment declined\" card=[[card]] order=[[order]] amount=[[amount]]",
  "{\"ts\": \"[[ts]]\", \"level\": \"debug\", \"event\": \"profile.updated\", \"user\": {\"name\": \"[[name]]\", \"phone\": \"[[phone]]\"}}",
  "DEBUG request headers: {'Authorization': 'Bearer [[apikey]]', 'X-Request-Id': '[[uuid]]'}",
  "[[ts]] ERROR webhook POST [[urltok]] failed: timeout after 30s",
  "Nov 06 10:21:44 web-3 sshd[[[int]]]: Accepted publickey for deploy from [[ip]] port 52214 ssh2",
  "[[ts]] INFO kyc.check ssn=[[ssn]] result=match dob=[[dob_iso]]",
  "2026/11/06 10:22:01 [error] upstream timed out while connecting to upstream, client: [[ip4]], server: api.example.com",
  "[[ts]] INFO deploy finished version=[[ver]] commit=[[sha]] duration=42s pods=[[int]]",
  "[[ts]] INFO job=nightly-export rows=[[int]] id=[[uuid]] status=ok",
  "audit: user [[lname]] changed shipping address to \"[[addr]]\"",
  "[[ts]] INFO sepa.mandate.created iban=[[iban]] debtor=\"[[name]]\"",
  "WARN  env dump: OPENAI_API_KEY=[[apikey]] PATH=/usr/local/bin:/usr/bin",
  "[[ts]] TRACE contact.sync {\"given\":\"[[first]]\",\"family\":\"[[family]]\",\"tel\":\"[[phone_digits]]\",\"mail\":\"[[email]]\"}",
  "ALERT passport scan stored unencrypted: doc=[[passport]] holder=[[name]]",
)

# pure hard negatives (no PII at all)
t("log_line", "en",
  "[[ts]] INFO cache warmup complete keys=[[int]] version=[[ver]] commit=[[sha]]",
  "GET /orders/[[order]]/items?page=2 200 [[int]]ms",
  "[[ts]] DEBUG retrying [[uuid]] attempt=3 backoff=800ms",
)
t("code_review", "en",
  "Rebased on main ([[sha]]), bumped [[product]] to [[ver]]. The flaky test fails 1 in 40 runs; see run [[int]].",
  "This loop is O(n^2) for n=[[int]]; consider a dict. Also the fixture date [[date]] is in the past now.",
)
t("support_chat", "en",
  "user: my order [[order]] says shipped on [[date]] but the tracking [[num]] isn't found\nassistant: It can take 24h to appear.",
  "user: the [[product]] I bought for [[amount]] stopped charging\nassistant: Try a reset holding power for 10 s.",
)
t("email", "en",
  "Hi all,\n\nthe release of [[ver]] moves to [[date]]. Build [[sha]] is the candidate. Budget stays at [[amount]].\n\nThanks",
)
t("sms", "en",
  "Your code is 731 904. Valid 10 min. Ref [[order]]",
)
t("form", "en",
  "Ticket [[order]]\nPriority: high\nComponent: [[product]]\nFound in: [[ver]]\nDue: [[date]]",
)

# --------------------------------------------------------------------------------------------
# Hand-crafted hard cases: (style, lang, text, [(type, value), ...] in order of appearance)
# Card numbers / IBANs here are checked below (Luhn / mod-97).
# --------------------------------------------------------------------------------------------
HARD = [
    ("support_chat", "en", "user: will hunter here. will you hunt down my refund?\nassistant: Of course, Will.",
     [("PERSON", "will hunter"), ("PERSON", "Will")]),
    ("email", "en", "Hi Rose,\n\nthe roses arrive in May. Rose May from the nursery will call you.\n\nBill",
     [("PERSON", "Rose"), ("PERSON", "Rose May"), ("PERSON", "Bill")]),
    ("email", "en", "Please pay the bill by Friday; the price went up. Thanks, Bill Price",
     [("PERSON", "Bill Price")]),
    ("sms", "en", "grace said the field trip is off. grace field, 07700 900461",
     [("PERSON", "grace"), ("PERSON", "grace field"), ("PHONE", "07700 900461")]),
    ("form", "en", "Deliver to: Flat 3, 12 Harbour View, Whitby YO21 3PU",
     [("ADDRESS", "Flat 3, 12 Harbour View, Whitby YO21 3PU")]),
    ("support_chat", "es", "cliente: estoy en Calle Mayor 5, 2ºB, justo encima de la farmacia",
     [("ADDRESS", "Calle Mayor 5, 2ºB")]),
    ("agent_tool_call", "en", "{\"to\":\"+14155552671\",\"cc\":[\"0044 7700 900 123\"],\"retries\":3}",
     [("PHONE", "+14155552671"), ("PHONE", "0044 7700 900 123")]),
    ("log_line", "en", "phone=4915112345678 ok; version=4.15.1123 build=45678",
     [("PHONE", "4915112345678")]),
    ("code_review", "en", "The commit 4111111111111111abcdef0123456789abcdef01 reverts the cache change.",
     []),
    ("form", "en", "Card: 4111 1111 1111 1111   Exp 12/29   CVC ***",
     [("CREDIT_CARD", "4111 1111 1111 1111")]),
    ("form", "en", "Order number 4111 1111 1111 1112 (not a card: fails Luhn), shipped 2026-10-02",
     []),
    ("email", "de", "Bitte auf DE89 3704 0044 0532 0130 00 überweisen, Verwendungszweck RE-2026-0042.",
     [("IBAN", "DE89 3704 0044 0532 0130 00")]),
    ("log_line", "en", "iban=GB82WEST12345698765432 ref=INV-2026-00917",
     [("IBAN", "GB82WEST12345698765432")]),
    ("support_chat", "en", "user: ssn 078 05 1120, dob 4/1/1961. my name is mr. o'brien-smith",
     [("SSN", "078 05 1120"), ("DATE_OF_BIRTH", "4/1/1961"), ("PERSON", "o'brien-smith")]),
    ("log_line", "en", "release 2.14.0 deployed to 10.0.3.17; next version 192.168.1 is a typo for 1.92.168",
     [("IP_ADDRESS", "10.0.3.17")]),
    ("log_line", "en", "client=[2001:db8:85a3::8a2e:370:7334]:51234 GET /health 200",
     [("IP_ADDRESS", "2001:db8:85a3::8a2e:370:7334")]),
    ("code_review", "en", "Please rotate: export ANTHROPIC_KEY=sk-ant-api03-Xq9v2LmB7pR4tZ8wK1nJ6yH3cF5dG0sA-_e2Q9rT7uY4iO1pL8kJ5hG2fD6sA3zX0cV9bN7mM4qW1eR8tY5uI2oP",
     [("API_KEY", "sk-ant-api03-Xq9v2LmB7pR4tZ8wK1nJ6yH3cF5dG0sA-_e2Q9rT7uY4iO1pL8kJ5hG2fD6sA3zX0cV9bN7mM4qW1eR8tY5uI2oP")]),
    ("code_review", "en", "Use the placeholder sk-XXXXXXXXXXXXXXXX in docs, and the sha256 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855 is just the empty file.",
     []),
    ("agent_tool_call", "en", "{\"aws_access_key_id\": \"AKIAQ3EGRTXV7KPLM2WN\", \"region\": \"us-east-2\"}",
     [("API_KEY", "AKIAQ3EGRTXV7KPLM2WN")]),
    ("email", "en", "Join: https://meet.confera.com/j/8145523310?pwd=Tz8QmX2vLp9RkW4nYb7cJ1dF5gH3sA6e (no password needed)",
     [("URL_WITH_TOKEN", "https://meet.confera.com/j/8145523310?pwd=Tz8QmX2vLp9RkW4nYb7cJ1dF5gH3sA6e")]),
    ("sms", "nl", "hoi, met sanne. bel me op 06-12345678 of kom langs op Oudegracht 158",
     [("PERSON", "sanne"), ("PHONE", "06-12345678"), ("ADDRESS", "Oudegracht 158")]),
    ("email", "fr", "Cordialement,\nJean-Luc de la Fontaine\nBP 37, 84000 Avignon",
     [("PERSON", "Jean-Luc de la Fontaine"), ("ADDRESS", "BP 37, 84000 Avignon")]),
    ("form", "en", "Mailing address: PO Box 8812, Anchorage, AK 99508",
     [("ADDRESS", "PO Box 8812, Anchorage, AK 99508")]),
    ("support_chat", "en", "user: my birthday is 1990-07-14 and the outage started 2026-07-14, coincidence?",
     [("DATE_OF_BIRTH", "1990-07-14")]),
    ("form", "en", "Passport: 533380006 (UK), issued 2021-03-02, expires 2031-03-02",
     [("PASSPORT", "533380006")]),
    ("log_line", "en", "user_id=533380006 plan=free region=eu",
     []),
    ("agent_tool_call", "en", "{\"name\": \"Paris\", \"type\": \"hotel\", \"guest\": \"Paris Hilton-Jones\"}",
     [("PERSON", "Paris Hilton-Jones")]),
    ("support_chat", "en", "user: I live on Church Street in Reading, above the church\nassistant: Thanks, Ms Church.",
     [("ADDRESS", "Church Street"), ("LOCATION", "Reading"), ("PERSON", "Church")]),
    ("code_review", "en", "`git blame` says lines 40-52 are from ngozi.okafor (ngozi.okafor@brightpath.io), ask her",
     [("PERSON", "ngozi.okafor"), ("EMAIL", "ngozi.okafor@brightpath.io")]),
    ("log_line", "en", "2026-11-06T09:00:00Z INFO mailer sent to \"Okafor, Ngozi\" <n.okafor@web.de>",
     [("PERSON", "Okafor, Ngozi"), ("EMAIL", "n.okafor@web.de")]),
    ("sms", "en", "text me: four one five, five five five, two six seven one. its dawn",
     [("PHONE", "four one five, five five five, two six seven one"), ("PERSON", "dawn")]),
    ("email", "en", "My email is priya dot iyer at gmail dot com, phone +91 98450 12345.",
     [("EMAIL", "priya dot iyer at gmail dot com"), ("PHONE", "+91 98450 12345")]),
    ("agent_tool_call", "en", "{\"card\": \"5425-2334-3010-9903\", \"cvv\": \"***\", \"holder\": \"HUANG MEI\"}",
     [("CREDIT_CARD", "5425-2334-3010-9903"), ("PERSON", "HUANG MEI")]),
    ("form", "en", "Amex: 3782 822463 10005  Name on card: Chase Carter",
     [("CREDIT_CARD", "3782 822463 10005"), ("PERSON", "Chase Carter")]),
    ("code_review", "en", "Chase the carter bug in the cart service; it's in version 3.4.1-rc2, not in 3.4.0.",
     []),
    ("log_line", "en", "Mark as read: 4 items; Will retry in 30s; Grace period 7d; Hope this helps",
     []),
    ("support_chat", "de", "Kunde: Ich heiße Frank Weiß, wohne Am Markt 1, 99423 Weimar, Tel. 03643 / 81 24 00",
     [("PERSON", "Frank Weiß"), ("ADDRESS", "Am Markt 1, 99423 Weimar"), ("PHONE", "03643 / 81 24 00")]),
    ("form", "nl", "BSN: 111222333  Postbus 20018, 2500 EA Den Haag",
     [("SSN", "111222333"), ("ADDRESS", "Postbus 20018, 2500 EA Den Haag")]),
    ("email", "en", "Signed,\n—K.\nKwame Asante-Boateng | Atlas Freight Forwarding | +233 24 412 7788",
     [("PERSON", "K."), ("PERSON", "Kwame Asante-Boateng"), ("ORG", "Atlas Freight Forwarding"), ("PHONE", "+233 24 412 7788")]),
    ("log_line", "en", "ghp_ prefix check passed for token=ghp_R8xK2mQ9vL4tW7nB1cY5dF3gH6jS0aE2zP4u",
     [("API_KEY", "ghp_R8xK2mQ9vL4tW7nB1cY5dF3gH6jS0aE2zP4u")]),
    ("agent_tool_call", "en", "{\"url\": \"postgres://svc_orders:Wq7%40pL9zK2m@10.20.0.5:5432/orders\"}",
     [("URL_WITH_TOKEN", "postgres://svc_orders:Wq7%40pL9zK2m@10.20.0.5:5432/orders")]),
    ("form", "es", "Titular: María del Carmen de los Ríos · IBAN ES91 2100 0418 4502 0005 1332",
     [("PERSON", "María del Carmen de los Ríos"), ("IBAN", "ES91 2100 0418 4502 0005 1332")]),
]


def render(tpl: str) -> tuple[str, list[dict]]:
    out, ents, pos, memo = [], [], 0, {}
    cur = 0
    for m in re.finditer(r"\[\[(\w+)(#\d+)?\]\]", tpl):
        lit = tpl[pos:m.start()]
        out.append(lit)
        cur += len(lit)
        key, tag = m.group(1), m.group(2)
        typ, gen = GEN[key]
        if tag and (key, tag) in memo:
            val = memo[(key, tag)]
        else:
            val = gen()
            if tag:
                memo[(key, tag)] = val
        out.append(val)
        if typ:
            ents.append({"start": cur, "end": cur + len(val), "type": typ, "value": val})
        cur += len(val)
        pos = m.end()
    out.append(tpl[pos:])
    text = "".join(out)
    for e in ents:
        assert text[e["start"]:e["end"]] == e["value"], (e, text)
    return text, ents


def hard_records() -> list[dict]:
    recs = []
    for i, (style, lang, text, spans) in enumerate(HARD, 1):
        ents, at = [], 0
        for typ, val in spans:
            s = text.index(val, at)
            ents.append({"start": s, "end": s + len(val), "type": typ, "value": val})
            at = s + len(val)
            if typ == "CREDIT_CARD":
                assert luhn_ok(val), val
            if typ == "IBAN":
                assert iban_valid(val), val
        recs.append({"id": f"hard-{i:03d}", "style": style, "lang": lang, "text": text, "entities": ents})
    return recs


def split_of(rec_id: str) -> str:
    return "dev" if hashlib.sha256(rec_id.encode()).digest()[0] % 2 == 0 else "report"


def validate(rec: dict) -> None:
    assert rec["style"] in STYLES, rec
    last = -1
    for e in rec["entities"]:
        assert e["type"] in TYPES, e
        assert rec["text"][e["start"]:e["end"]] == e["value"], e
        assert e["start"] >= last, ("overlap", rec)
        last = e["end"]


def main() -> None:
    per_template = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    recs, seen = [], set()
    n = 0
    for ti, (style, lang, tpl) in enumerate(T):
        made = 0
        tries = 0
        while made < per_template and tries < per_template * 5:
            tries += 1
            text, ents = render(tpl)
            if text in seen:
                continue
            seen.add(text)
            n += 1
            rec = {"id": f"ind-{n:05d}", "style": style, "lang": lang, "text": text, "entities": ents,
                   "template": ti}
            validate(rec)
            recs.append(rec)
            made += 1
    hard = hard_records()
    for h in hard:
        validate(h)
    with open(HERE / "corpus.jsonl", "w", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    with open(HERE / "hard_cases.jsonl", "w", encoding="utf-8") as f:
        for r in hard:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    split = {r["id"]: split_of(f"template-{r['template']}" if "template" in r else r["id"]) for r in recs + hard}
    with open(HERE / "split.json", "w", encoding="utf-8") as f:
        json.dump(split, f, indent=0, sort_keys=True)
        f.write("\n")
    # counts
    for name, rs in (("corpus", recs), ("hard_cases", hard)):
        for half in ("dev", "report", "all"):
            sub = [r for r in rs if half == "all" or split[r["id"]] == half]
            c = Counter(e["type"] for r in sub for e in r["entities"])
            struct = sum(v for k, v in c.items() if k in STRUCTURED)
            print(f"{name} {half}: records={len(sub)} no_pii={sum(1 for r in sub if not r['entities'])} "
                  f"structured={struct} " + " ".join(f"{k}={c[k]}" for k in sorted(c)))
    print(f"templates={len(T)} styles={dict(Counter(s for s, _, _ in T))} langs={dict(Counter(r['lang'] for r in recs))}")


if __name__ == "__main__":
    main()
