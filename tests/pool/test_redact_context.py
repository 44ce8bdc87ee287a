"""The detector beyond its gazetteers: names that are common words, addresses with no street-type
word, values the chat structure (a tool call's JSON field, a sign-off, a greeting) says are PII, and
the independent-corpus loader the benchmark reports from."""
import json

import pytest

from autoresearch_dagster.pool import pii_detect
from autoresearch_dagster.pool.pii_eval import load_independent, score
from autoresearch_dagster.pool.redact import Redactor, find_pii, find_pii_many

from .conftest import ROOT

FIXTURE = ROOT / "tests" / "pool" / "data" / "pii_fixture"


def _covered(text: str, value: str) -> bool:
    a = text.index(value)
    cov = bytearray(len(text))
    for s, e, _, _ in find_pii(text):
        cov[s:e] = b"\x01" * (e - s)
    return all(cov[i] for i in range(a, a + len(value)) if text[i].isalnum())


@pytest.mark.parametrize("text,name", [
    ("Hi Rose,\nthe refund went through yesterday.", "Rose"),
    ("Thanks for the quick fix.\n\nRegards,\nGrace Mbeki", "Grace Mbeki"),
    ("Cheers,\nWill Summer", "Will Summer"),
    ("Hello Hope! Your ticket is closed.", "Hope"),
    ("my name is Dawn Fairweather and I can't log in", "Dawn Fairweather"),
    ('{"customer_name": "Faith Okonkwo", "plan": "pro"}', "Faith Okonkwo"),
    ("Bonjour Élodie, merci pour votre message.", "Élodie"),
])
def test_names_that_are_common_words_are_found_by_their_place(text, name):
    assert _covered(text, name), find_pii(text)


@pytest.mark.parametrize("text,address", [
    ("Please send the replacement to 14 Larkfield, Kilkenny and text me.", "14 Larkfield, Kilkenny"),
    ("I live at 3 Orchard Rise, Harrogate HG1 2AB since May.", "3 Orchard Rise, Harrogate HG1 2AB"),
    ('{"shipping_address": "Kanalweg 12, 3512 Utrecht"}', "Kanalweg 12, 3512 Utrecht"),
    ("Address: Quinta do Lago, Loulé", "Quinta do Lago, Loulé"),
])
def test_addresses_without_a_street_suffix(text, address):
    assert _covered(text, address), find_pii(text)


@pytest.mark.parametrize("text,phone", [
    ('{"name": "Bill Hope", "phone": "0412 889 301"}', "0412 889 301"),
    ('client.update(contact_id=7, mobile="5550192837")', "5550192837"),
    ('{"tel": 4155550199, "ok": true}', "4155550199"),
])
def test_phone_numbers_in_json_and_code(text, phone):
    r = Redactor(b"k")
    out = r.redact_text(text)
    assert phone not in out and r.counts["phone"] >= 1, find_pii(text)


def test_structure_words_are_not_taken_for_names():
    # a tool's name, a greeting to everyone, a sign-off with no name, schema type names stay
    for text in ('{"name": "get_weather", "type": "function"}', "Hi team, the deploy is done.",
                 "Thanks,\nthe build is green now.", '{"name": "string", "address": null}'):
        assert not [s for s in find_pii(text) if s[2] in ("person", "address")], (text, find_pii(text))
    r = Redactor(b"k")
    schema = {"name": "lookup_customer", "parameters": {"type": "object",
                                                        "properties": {"name": {"type": "string"}}}}
    assert r.redact_json(schema) is schema


def test_batched_detection_equals_one_text_at_a_time():
    texts = [json.loads(line)["text"] for line in (FIXTURE / "corpus.jsonl").read_text().splitlines()]
    texts += ["nothing here", "Then Maria Lopez called from Leipzig."]
    assert find_pii_many(texts, batch_size=2) == [find_pii(t) for t in texts]


def test_ner_is_the_primary_person_detector():
    """A surname and first name in no list and at no cue are found by the model."""
    if not pii_detect.ner_available():
        pytest.skip("spaCy model not installed")
    text = "Yesterday I spoke with Tendai Mukamuri about the outage in Nairobi."
    kinds = {text[a:b]: k for a, b, k, _ in pii_detect.ner_spans(text)}
    assert kinds.get("Tendai Mukamuri") == "person" and kinds.get("Nairobi") == "location"
    assert "Tendai" not in pii_detect.first_names()


def test_independent_corpus_loads_by_its_committed_split():
    dev_c, dev_h = load_independent(FIXTURE, "dev")
    rep_c, rep_h = load_independent(FIXTURE, "report")
    assert len(dev_c) == 2 and not dev_h and len(rep_c) == 2 and len(rep_h) == 1
    s = rep_c[0]
    assert [(s.text[a:b], k) for a, b, k in s.entities] == [
        ("Bill Hope", "person"), ("0412 889 301", "phone"), ("bill.hope@quokka.example", "email")]
    sc = score(rep_c + rep_h, lambda t: [(a, b) for a, b, _, _ in find_pii(t)])
    assert sc.total["iban"] == 1 and sc.total["secret"] == 1


def test_independent_corpus_rejects_bad_records(tmp_path):
    (tmp_path / "split.json").write_text(json.dumps({"a": "dev"}))
    rec = {"id": "a", "style": "x", "lang": "en", "text": "hi", "entities": [{"start": 0, "end": 2,
                                                                               "type": "NICKNAME", "value": "hi"}]}
    (tmp_path / "corpus.jsonl").write_text(json.dumps(rec) + "\n")
    with pytest.raises(ValueError, match="unknown entity type 'NICKNAME'"):
        load_independent(tmp_path, "dev")
    (tmp_path / "corpus.jsonl").write_text(json.dumps({**rec, "id": "b", "entities": []}) + "\n")
    with pytest.raises(ValueError, match="in no half"):
        load_independent(tmp_path, "dev")
