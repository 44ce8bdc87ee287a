import json
import random
import sys

import pyarrow.parquet as pq
import pytest

from autoresearch_dagster.pool.schema import read_pool
from autoresearch_dagster.pool.redact import Redactor, find_pii, iban_valid, luhn_valid
from autoresearch_dagster.tokens import count_tokens

from .conftest import DEMO, ROOT

CASES = {
    "email": "Write to jane.doe+news@mail.example.org today.",
    "phone": "Call +1 (415) 555-0132 or 212-555-0199 tonight.",
    "card": "Card 4111 1111 1111 1111 expires soon.",
    "iban": "Pay DE89 3704 0044 0532 0130 00 now.",
    "ssn": "My SSN is 123-45-6789 ok.",
    "ipv4": "Seen from 192.168.10.44 at noon.",
    "ipv6": "Seen from 2001:db8:85a3::8a2e:370:7334 too.",
    "url_secret": "Clone https://bob:hunter2pass@git.example.com/x.git and https://x.io/a?access_token=abcDEF123456",
    "api_key": "Keys: sk-proj-abcdefghijklmnopqrstuvwx1234 AKIAIOSFODNN7EXAMPLE ghp_abcdefghijklmnopqrstuvwxyz0123456789 "
               "xoxb-1234567890-abcdefghijkl eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTYifQ.dozjgNryP4J3jVmNHl0w5N "
               "Authorization: Bearer AbCdEf0123456789xyzXYZ",
    "person": "Hi, my name is Laura Bennett. Dr. Okafor agreed.\nRegards,\nSamuel Price",
    "address": "Ship to 742 Evergreen Terrace, Springfield.",
}
ORIGINALS = {
    "email": ["jane.doe+news@mail.example.org"], "phone": ["(415) 555-0132", "212-555-0199"],
    "card": ["4111 1111 1111 1111"], "iban": ["DE89 3704 0044 0532 0130 00"], "ssn": ["123-45-6789"],
    "ipv4": ["192.168.10.44"], "ipv6": ["2001:db8:85a3::8a2e:370:7334"],
    "url_secret": ["hunter2pass", "abcDEF123456"],
    "api_key": ["abcdefghijklmnopqrstuvwx1234", "IOSFODNN7EXAMPLE", "abcdefghijklmnopqrstuvwxyz0123456789",
                "1234567890-abcdefghijkl", "dozjgNryP4J3jVmNHl0w5N", "AbCdEf0123456789xyzXYZ"],
    "person": ["Laura Bennett", "Okafor", "Samuel Price"], "address": ["742 Evergreen"],
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_each_type_found_replaced_and_token_count_kept(kind):
    r = Redactor(b"k1")
    text = CASES[kind]
    out = r.redact_text(text)
    assert r.counts[kind] >= 1, (kind, find_pii(text))
    for original in ORIGINALS[kind]:
        assert original not in out
    assert len(out) == len(text) and count_tokens(out) == count_tokens(text)


def test_surrogate_formats():
    r = Redactor(b"k1")
    card = r.redact_text("4111 1111 1111 1111")
    assert len(card) == 19 and card[4] == " " and not luhn_valid(card.replace(" ", ""))
    iban = r.redact_text("DE89 3704 0044 0532 0130 00")
    assert iban.startswith("DE") and not iban_valid(iban)
    assert r.redact_text("SSN 123-45-6789").split()[-1].startswith("9")
    email = r.redact_text("jane.doe@example.org")
    assert email.endswith(".org") and "@" in email
    ip = r.redact_text("at 10.0.0.1 now").split()[1]
    assert all(0 <= int(o) <= 255 for o in ip.split("."))


def test_consistent_within_key_and_keyed():
    a, b, c = Redactor(b"k1"), Redactor(b"k1"), Redactor(b"k2")
    t = "Contact jane.doe@example.org or 212-555-0199."
    assert a.redact_text(t) == a.redact_text("x " + t)[2:] == b.redact_text(t)
    assert a.redact_text(t) != c.redact_text(t)


def test_no_false_positives_on_ordinary_text_and_tables():
    r = Redactor(b"k")
    text = ("The batch grew to 128 requests at 09:30:15 on 2025-03-02; latency p99 was 1,234.5 ms. "
            "region,month,orders\nemea,2025-01,12345\nVersion 3.11 is fine. The Quick Fox ran.")
    assert r.redact_text(text) == text and not r.counts


def test_structure_preserved_tools_schema_identical_and_json_valid():
    tools = [{"type": "function", "function": {"name": "lookup", "description": "Look up an order.",
                                               "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}}}]
    r = Redactor(b"k")
    assert r.redact_json(tools) is tools  # PII-free: the very same object, hence byte-identical JSON
    msgs = [{"role": "system", "content": "You help."},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {
                "name": "lookup", "arguments": json.dumps({"email": "jane.doe@example.org", "note": "Jos\u00e9 Garcia"},
                                                          ensure_ascii=True)}}]},
            {"role": "tool", "tool_call_id": "c", "content": json.dumps({"phone": "212-555-0199"})},
            {"role": "user", "content": "thanks"}]
    out = r.redact_messages(msgs)
    assert [m["role"] for m in out] == [m["role"] for m in msgs] and out[0] == msgs[0]
    args = json.loads(out[1]["tool_calls"][0]["function"]["arguments"])
    assert set(args) == {"email", "note"} and args["email"] != "jane.doe@example.org"
    assert json.loads(out[2]["content"])["phone"] != "212-555-0199"
    with_pii = [{"type": "function", "function": {"name": "f", "description": "Escalate to ops@example.com",
                                                  "parameters": {"type": "object"}}}]
    red = r.redact_json(with_pii)
    assert "ops@example.com" not in json.dumps(red) and red[0]["function"]["name"] == "f"


def _demo_book():
    sys.path.insert(0, str(ROOT / "examples"))
    from make_demo_logs import PIIBook

    return PIIBook(random.Random(7))  # make_demo_chat's first draw with the default seed


def test_demo_pool_redacts_every_planted_value(demo_pool):
    book = _demo_book()
    planted = set(book.secrets) | {book.bearer.split()[1], book.url.split("//")[1].split("@")[0].split(":")[1],
                                   book.url_token.rsplit("=", 1)[1]}
    for p in book.people:
        planted |= {p["email"], p["phone"], p["card"], p["iban"], p["ssn"], p["ipv4"], p["ipv6"], p["address"],
                    f"{p['first']} {p['last']}"}
    source = DEMO.read_text()
    present = {v for v in planted if v in source}
    assert len(present) > 100  # the demo log really carries them
    s = demo_pool.summary
    assert all(s["redactions"].get(k, 0) > 0 for k in CASES), s["redactions"]
    pool_dir = demo_pool.pool_path.parent
    texts = []
    for f in pool_dir.iterdir():
        raw = f.read_bytes()
        texts.append(raw.decode("utf-8", "replace"))
        if f.suffix == ".parquet":
            texts.append(json.dumps(pq.read_table(f).to_pylist(), default=str))
            texts.append(json.dumps(pq.read_metadata(f).metadata.get(b"autoresearch.pool", b"").decode()))
    blob = "\n".join(texts)
    leaked = sorted(v for v in present if v in blob)
    assert not leaked, leaked[:5]


def test_demo_pool_token_change_below_one_percent_and_schemas_kept(demo_pool):
    s = demo_pool.summary
    assert abs(s["prompt_token_change"]) < 0.01
    assert demo_pool.fidelity["checks"]["redaction.prompt_token_change"]["passed"]
    pool = read_pool(demo_pool.pool_path)
    src = [json.loads(l) for l in DEMO.read_text().splitlines()[:400]]
    src_tools = {json.dumps(r["request"]["tools"]) for r in src if "tools" in r["request"]}
    src_rf = {json.dumps(r["request"]["response_format"]) for r in src if "response_format" in r["request"]}
    pool_tools = {json.dumps(pool.request(i).tools) for i in range(len(pool)) if pool.request(i).tools}
    pool_rf = {json.dumps(pool.request(i).response_format) for i in range(len(pool)) if pool.request(i).response_format}
    assert src_tools and src_tools <= pool_tools and src_rf and src_rf <= pool_rf


def test_demo_pii_free_system_prompts_stay_byte_identical(demo_pool):
    source_systems = {json.loads(l)["request"]["messages"][0]["content"] for l in DEMO.read_text().splitlines()}
    pool = read_pool(demo_pool.pool_path)
    pool_systems = {pool.request(i).messages[0]["content"] for i in range(len(pool))}
    assert len(source_systems) == 5 and pool_systems == source_systems


def test_single_pass_count_and_hashes_equal_the_token_contract():
    from autoresearch_dagster.pool.chat import count_and_hashes
    from autoresearch_dagster.tokens import block_hashes

    for line in DEMO.read_text().splitlines()[:40]:
        text = json.dumps(json.loads(line)["request"]["messages"])
        assert count_and_hashes(text, None) == (count_tokens(text), block_hashes(text, 64))
