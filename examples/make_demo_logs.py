"""Generates the demo endpoint's sample logs and the public-format trace samples (deterministic, seeded).

Outputs (committed): examples/logs/demo_chat.jsonl (OpenAI chat-completions request logs, nested
shape, with planted fake PII of every detected type, and what the production server reported:
usage with cached tokens, TTFT and latency, see ``production_fields``), examples/logs/bad_records.jsonl (the
quarantine demo), examples/traces/{mooncake_sample.jsonl, azure_sample.csv, burstgpt_sample.csv}.

Usage: python examples/make_demo_logs.py [--out-dir examples] [--requests 1600] [--seed 7]
"""
from __future__ import annotations

import argparse
import json
import math
import random
from collections import OrderedDict
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

from autoresearch_dagster.tokens import block_hashes, count_tokens, render_prompt

BASE_TIME = datetime(2026, 3, 2, 9, 0, 0, tzinfo=timezone.utc)
MODEL = "gemma-moe-26b-a4b"
# The production server (production_fields): its KV pool in tokens (max_total_num_tokens of the demo
# endpoint's config), radix-cache page size, and service times at the logged rate.
KV_TOKENS = 348_713
PAGE_TOKENS = 16
TTFT_BASE_MS = 49.68
TTFT_MS_PER_TOKEN = 0.01038
TTFT_TAIL_MS = 3.0
TPOT_BASE_MS = 4.992
TPOT_MS_PER_REQUEST = 0.716  # each other request in flight
TPOT_SIGMA = 0.076

_PROSE = (
    "the service should keep latency low while the batch grows and each request waits in the queue "
    "before the scheduler admits it into the next step of the engine we measured throughput across "
    "several runs and found that memory pressure rises when prompts share long prefixes the cache "
    "keeps those blocks resident so later turns reuse them please summarize the main findings and "
    "list the risks for the quarterly review include the revenue numbers and explain any gaps in "
    "coverage our customers asked about refunds shipping delays account access and billing errors "
    "describe how the policy applies when an order arrives damaged or late and what the agent "
    "should offer as compensation given the contract terms below"
).split()
_FIRST = ["James", "Mary", "Robert", "Patricia", "John", "Jennifer", "Michael", "Linda", "David",
          "Elizabeth", "William", "Barbara", "Richard", "Susan", "Joseph", "Jessica", "Thomas", "Sarah",
          "Maria", "Daniel", "Emma", "Olivia", "Liam", "Noah", "Sophia", "Lucas", "Mateo", "Amelia"]
_LAST = ["Smith", "Johnson", "Williams", "Brown", "Jones", "Garcia", "Miller", "Davis", "Rodriguez",
         "Martinez", "Hernandez", "Lopez", "Wilson", "Anderson", "Thomas", "Taylor", "Moore", "Jackson"]
_STREETS = ["Maple", "Oak", "Cedar", "Elm", "Pine", "Washington", "Lake", "Hill", "Park", "Sunset"]
_SUFFIX = ["Street", "Avenue", "Road", "Lane", "Drive", "Boulevard", "Court"]


def prose(rng: random.Random, n_words: int) -> str:
    words, out = [rng.choice(_PROSE) for _ in range(n_words)], []
    for i, w in enumerate(words):
        if i == 0 or out[-1].endswith("."):
            w = w.capitalize()
        out.append(w + ("." if rng.random() < 0.08 else ("," if rng.random() < 0.05 else "")))
    return " ".join(out) + "."


def table_doc(rng: random.Random, rows: int, title: str) -> str:
    lines = [f"# {title}", "region,month,orders,revenue,refunds,latency_ms,nps"]
    for _ in range(rows):
        lines.append(f"{rng.choice(['emea', 'amer', 'apac'])},2025-{rng.randint(1, 12):02d},{rng.randint(100, 99999)},"
                     f"{rng.randint(1000, 999999)}.{rng.randint(0, 99):02d},{rng.randint(0, 999)},"
                     f"{rng.randint(20, 900)},{rng.randint(-50, 90)}")
    return "\n".join(lines)


def luhn_complete(prefix: str) -> str:
    digits = [int(c) for c in prefix]
    total = 0
    for i, d in enumerate(reversed(digits)):
        if i % 2 == 0:
            d *= 2
            d -= 9 if d > 9 else 0
        total += d
    return prefix + str((10 - total % 10) % 10)


def _group4(s: str) -> str:
    return " ".join(s[i:i + 4] for i in range(0, len(s), 4))


def iban(rng: random.Random, country: str, bban_len: int) -> str:
    bban = "".join(str(rng.randint(0, 9)) for _ in range(bban_len))
    num = int("".join(str(int(c, 36)) for c in bban + country + "00"))
    check = 98 - num % 97
    return _group4(f"{country}{check:02d}{bban}")


class PIIBook:
    """A fixed pool of fake identities, reused across turns so consistency of surrogates is visible."""

    def __init__(self, rng: random.Random, n: int = 40):
        self.people = []
        for _ in range(n):
            first, last = rng.choice(_FIRST), rng.choice(_LAST)
            self.people.append({
                "first": first, "last": last,
                "email": f"{first.lower()}.{last.lower()}{rng.randint(1, 99)}@{rng.choice(['example.com', 'mail.test', 'corp.example.org'])}",
                "phone": rng.choice([f"+1 ({rng.randint(200, 989)}) {rng.randint(200, 999)}-{rng.randint(0, 9999):04d}",
                                     f"+44 20 {rng.randint(1000, 9999)} {rng.randint(1000, 9999)}",
                                     f"{rng.randint(200, 989)}-{rng.randint(200, 999)}-{rng.randint(0, 9999):04d}"]),
                "card": _group4(luhn_complete(rng.choice("45") + "".join(str(rng.randint(0, 9)) for _ in range(14)))),
                "iban": iban(rng, rng.choice(["DE", "FR", "GB", "NL"]), 18),
                "ssn": f"{rng.randint(100, 665):03d}-{rng.randint(10, 99):02d}-{rng.randint(1000, 9999):04d}",
                "ipv4": f"{rng.randint(11, 223)}.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}",
                "ipv6": f"2001:db8:{rng.randint(0, 65535):x}::{rng.randint(1, 65535):x}",
                "address": f"{rng.randint(10, 9999)} {rng.choice(_STREETS)} {rng.choice(_SUFFIX)}",
            })
        alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
        rnd = lambda k, alphabet=alnum: "".join(rng.choice(alphabet) for _ in range(k))  # noqa: E731
        self.secrets = [
            ("sk-proj-" + rnd(40)), ("AKIA" + rnd(16, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567")), ("ghp_" + rnd(36)),
            ("xoxb-" + rnd(11, "0123456789") + "-" + rnd(24)),
            ("eyJhbGciOiJIUzI1NiJ9." + "eyJzdWIiOiI" + rnd(30) + "." + rnd(43)),
        ]
        self.bearer = "Bearer " + rnd(32)
        self.url = f"https://deploy:{rnd(14)}@git.example.internal/repo.git"
        self.url_token = f"https://api.example.com/v2/export?format=csv&access_token={rnd(28)}"

    def snippet(self, rng: random.Random) -> str:
        p = rng.choice(self.people)
        kind = rng.randrange(12)
        return [
            f"My name is {p['first']} {p['last']} and my email is {p['email']}.",
            f"You can call me at {p['phone']} after five.",
            f"Please charge the card {p['card']} for the renewal.",
            f"Send the refund to IBAN {p['iban']} please.",
            f"For the tax form my SSN is {p['ssn']}.",
            f"The login came from {p['ipv4']} and later {p['ipv6']} which looks odd.",
            f"I cloned it with {self.url} yesterday.",
            f"Our export link is {self.url_token} if that helps.",
            f"Here is the key I used: {rng.choice(self.secrets)} in the header.",
            f"The request had Authorization: {self.bearer} set.",
            f"Ship it to {p['address']}, Springfield. Thanks,\n{p['first']} {p['last']}",
            f"Dr. {p['last']} said to contact Ms. {rng.choice(self.people)['last']} about it.",
        ][kind]


_TOOLS = [
    {"type": "function", "function": {
        "name": "lookup_order", "description": "Look up an order by its id and return status and items.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"},
                                                        "include_items": {"type": "boolean"}},
                       "required": ["order_id"]}}},
    {"type": "function", "function": {
        "name": "issue_refund", "description": "Refund part or all of an order.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"},
                                                        "amount": {"type": "number"},
                                                        "reason": {"type": "string", "enum": ["damaged", "late", "other"]}},
                       "required": ["order_id", "amount", "reason"]}}},
]
_SCHEMA = {"type": "json_schema", "json_schema": {"name": "ticket_triage", "strict": True, "schema": {
    "type": "object", "properties": {"category": {"type": "string", "enum": ["billing", "shipping", "account", "other"]},
                                     "priority": {"type": "integer", "minimum": 1, "maximum": 5},
                                     "summary": {"type": "string"}},
    "required": ["category", "priority", "summary"], "additionalProperties": False}}}


def make_demo_chat(n_requests: int, seed: int, duration_s: float = 900.0) -> list[dict]:
    rng = random.Random(seed)
    book = PIIBook(rng)
    systems = [f"You are assistant #{i} for Example Corp support. " + prose(rng, rng.randint(120, 450))
               for i in range(5)]
    docs = ([table_doc(rng, rng.randint(70, 150), f"Quarterly metrics table {i}") for i in range(3)]
            + [prose(rng, rng.randint(600, 1100)) for _ in range(2)])
    # Bursty arrivals: a two-state modulated Poisson process for conversation starts.
    starts, t, hot = [], 0.0, False
    while t < duration_s * 0.85:
        rate = 3.2 if hot else 0.9
        t += rng.expovariate(rate)
        if rng.random() < (0.05 if hot else 0.02):
            hot = not hot
        starts.append(t)
    records: list[dict] = []
    conv_i = 0
    for start in starts:
        if len(records) >= n_requests:
            break
        conv_i += 1
        conv_id = f"conv-{conv_i:05d}"
        system = rng.choice(systems)
        messages: list[dict] = [{"role": "system", "content": system}]
        doc = rng.choice(docs) if rng.random() < 0.3 else None
        use_tools = rng.random() < 0.15
        use_schema = (not use_tools) and rng.random() < 0.1
        turns = rng.choice([1, 1, 1, 2, 2, 3, 4, 5])
        ts = start
        for turn in range(1, turns + 1):
            text = prose(rng, rng.randint(15, 120))
            if rng.random() < 0.55:
                text += " " + book.snippet(rng)
            if turn == 1 and doc:
                text = "Use this document:\n" + doc + "\n\nQuestion: " + text
            if rng.random() < 0.1:
                messages.append({"role": "user", "content": [{"type": "text", "text": text}]})
            else:
                messages.append({"role": "user", "content": text})
            long_out = rng.random() < 0.3
            completion = rng.randint(300, 1400) if long_out else rng.randint(12, 120)
            max_tokens = rng.choice([256, 1024, 2048]) if not long_out else 2048
            completion = min(completion, max_tokens)
            body: dict = {"model": MODEL, "messages": json.loads(json.dumps(messages)),
                          "temperature": rng.choice([0.0, 0.2, 0.7, 1.0]), "top_p": rng.choice([1.0, 0.95, 0.9]),
                          "max_tokens": max_tokens, "stream": rng.random() < 0.8}
            if rng.random() < 0.2:
                body["stop"] = ["\n\nUser:"]
            if rng.random() < 0.1:
                body["seed"] = rng.randint(0, 2**31)
            if rng.random() < 0.05:
                body["logprobs"] = True
                body["top_logprobs"] = 2
            if use_tools:
                body["tools"] = _TOOLS
                body["tool_choice"] = "auto"
            if use_schema:
                body["response_format"] = _SCHEMA
            prompt_chars = sum(len(json.dumps(m)) for m in messages)
            # the user's pause before the next turn: the answer arriving at their client's pace, then reading
            pause_s = (40 + prompt_chars * 0.004 + rng.expovariate(1 / 30) + completion * rng.uniform(30, 45)) / 1000
            records.append({
                "timestamp": (BASE_TIME + timedelta(seconds=ts)).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                "request_id": f"req-{len(records):06d}", "conversation_id": conv_id,
                "request": body,
                "response": {"id": f"chatcmpl-{len(records):06d}", "finish_reason": "stop" if not long_out else "length",
                             "usage": {"completion_tokens": completion}},  # the rest: production_fields
            })
            if len(records) >= n_requests:
                break
            # The next turn extends this one: the assistant reply (possibly a tool call), then a user turn.
            if use_tools and rng.random() < 0.5:
                call_id = f"call_{rng.randrange(10**8):08d}"
                messages.append({"role": "assistant", "content": None, "tool_calls": [{
                    "id": call_id, "type": "function", "function": {
                        "name": "lookup_order", "arguments": json.dumps({"order_id": f"A{rng.randrange(10**6):06d}",
                                                                          "include_items": True})}}]})
                messages.append({"role": "tool", "tool_call_id": call_id,
                                 "content": json.dumps({"status": "shipped", "items": rng.randint(1, 5)})})
            else:
                messages.append({"role": "assistant", "content": prose(rng, min(completion, 90))})
            ts += pause_s + rng.uniform(5, 60)
    records.sort(key=lambda r: r["timestamp"])
    production_fields(records, seed)
    return records


def others_in_flight(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Each request's time-averaged count of other requests in flight over its life [start, end)."""
    times = np.concatenate([start, end])
    order = np.argsort(times, kind="stable")
    level = np.cumsum(np.where(order < len(start), 1, -1))
    integral = np.concatenate([[0.0], np.cumsum(level[:-1] * np.diff(times[order]))])
    return (np.interp(end, times[order], integral) - np.interp(start, times[order], integral)) / (end - start) - 1


def production_fields(records: list[dict], seed: int) -> None:
    """Add what the production server reported, in arrival order: usage (prompt, total and cached tokens)
    and timings (TTFT, latency). The server is the demo endpoint's (gemma-moe-26b-a4b on one H200,
    SGLang's defaults), modelled:

    - prompt tokens: the model's tokenizer on the rendered chat (the project's approx counter stands
      in for it, as it does for the emulated model);
    - cached tokens: SGLang's radix prefix cache over prompt tokens in pages of ``PAGE_TOKENS``,
      least recently used pages evicted beyond the server's KV capacity. A prompt matches the pages
      earlier prompts left, never generated tokens: this client re-renders the assistant turns (the
      logged reply is not the generated text), so a conversation's next turn reuses its previous
      prompt, and conversations share their system prompts and documents;
    - TTFT: a base plus the prefill of the uncached tokens, with a queueing tail; TPOT: a base plus a
      share for every other request decoding alongside (averaged over the request's life, solved
      as a fixed point: latencies set the in-flight counts that set latencies), with a per-request
      jitter. ``TTFT_*``/``TPOT_*`` are the demo server's, fitted on a replay of this log on the demo
      endpoint as it runs, its hidden efficiency factors included (the demo's production is that engine; TPOT
      against the other requests in flight, least squares; TTFT against uncached tokens on the fastest 90%).
      Refitted whenever the emulator's defaults change (scripts/refit_demo_production.py).
    """
    rng = random.Random(f"production-{seed}")
    cache: OrderedDict[int, None] = OrderedDict()
    n_prompt, n_cached = [], []
    for r in records:
        body = r["request"]
        text = render_prompt(body["messages"], body.get("tools"))
        n = count_tokens(text)
        pages = block_hashes(text, PAGE_TOKENS)
        hit = next((i for i, h in enumerate(pages) if h not in cache), len(pages))
        n_prompt.append(n)
        n_cached.append(min(hit * PAGE_TOKENS, n - 1))
        for h in reversed(pages):  # deepest first: a prefix's pages outlive the pages extending it
            cache[h] = None
            cache.move_to_end(h)
        while len(cache) * PAGE_TOKENS > KV_TOKENS:
            cache.popitem(last=False)
    start = np.array([datetime.fromisoformat(r["timestamp"]).timestamp() for r in records])
    start -= start[0]
    decode = np.array([max(0, r["response"]["usage"]["completion_tokens"] - 1) for r in records])
    ttft = np.array([TTFT_BASE_MS + TTFT_MS_PER_TOKEN * (n - c) + rng.expovariate(1 / TTFT_TAIL_MS)
                     for n, c in zip(n_prompt, n_cached)]) / 1000
    jitter = np.array([rng.lognormvariate(0, TPOT_SIGMA) for _ in records])
    latency = ttft + decode * TPOT_BASE_MS / 1000
    for _ in range(20):
        others = others_in_flight(start, start + latency)
        latency = ttft + decode * (TPOT_BASE_MS + TPOT_MS_PER_REQUEST * np.maximum(others, 0)) * jitter / 1000
    ends: dict[str, float] = {}
    for i, r in enumerate(records):
        usage = r["response"]["usage"]
        usage.update({"prompt_tokens": n_prompt[i], "total_tokens": n_prompt[i] + usage["completion_tokens"],
                      "prompt_tokens_details": {"cached_tokens": n_cached[i]}})
        r["timings"] = {"ttft_ms": round(1000 * ttft[i], 1), "latency_ms": round(1000 * latency[i], 1)}
        conv = r["conversation_id"]
        if start[i] < ends.get(conv, start[i]):
            raise AssertionError(f"{r['request_id']} arrives before its conversation's previous answer ended")
        ends[conv] = start[i] + latency[i]


def make_bad_records(seed: int) -> bytes:
    rng = random.Random(seed)
    good = lambda i, ts: json.dumps({  # noqa: E731
        "timestamp": ts, "request_id": f"ok-{i}",
        "request": {"model": MODEL, "messages": [{"role": "user", "content": prose(rng, 20)}], "max_tokens": 64},
        "response": {"usage": {"prompt_tokens": 30, "completion_tokens": 20}}}).encode()
    lines = [good(0, 1772442000.0), good(1, 1772442001.0),
             b'{"timestamp": 1772442002.0, "request": {"model": "m", "messages": [',  # malformed JSON
             json.dumps({"timestamp": 1772442003.0, "request": {"model": "m"}}).encode(),  # missing messages
             json.dumps({"timestamp": "yesterday", "request": {"model": "m", "messages": []}}).encode(),
             json.dumps({"timestamp": 1772442004.0, "request": {"model": "m", "messages": "hi"}}).encode(),
             json.dumps({"timestamp": -5.0, "request": {"model": "m", "messages": [{"role": "user", "content": "x"}]}}).encode(),
             json.dumps({"timestamp": 1772442005.0, "request": {"model": "m", "messages": [{"role": "user", "content": "x"}],
                                                                 "max_tokens": 10**9}}).encode(),
             b'{"timestamp": 1772442006.0, "request": {"model": "m", "messages": [{"role": "user", "content": "caf\xe9 \xff"}]}}',
             good(2, 1772442007.0), good(4, 1772442300.0),  # later than the reorder window: older records are released
             json.dumps({"timestamp": 1772440000.0, "request": {"model": "m", "messages": [{"role": "user", "content": "late"}]}}).encode(),
             b"", good(3, 1772442008.0)]
    return b"\n".join(lines) + b"\n"


def make_mooncake(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out, t, next_id = [], 0.0, 0
    roots: list[list[int]] = []
    for _ in range(n):
        t += rng.expovariate(1 / 0.8) * 1000
        if roots and rng.random() < 0.6:
            base = list(rng.choice(roots))[:rng.randint(1, 6)]
        else:
            base = []
        extra = rng.randint(1, 12)
        ids = base + list(range(next_id, next_id + extra))
        next_id += extra
        if len(roots) < 30:
            roots.append(ids)
        length = (len(ids) - 1) * 512 + rng.randint(1, 512)
        out.append({"timestamp": int(t), "input_length": length, "output_length": rng.randint(5, 800), "hash_ids": ids})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", default=str(Path(__file__).parent))
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    out = Path(args.out_dir)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    (out / "traces").mkdir(parents=True, exist_ok=True)
    recs = make_demo_chat(args.requests, args.seed)
    with open(out / "logs" / "demo_chat.jsonl", "w") as f:
        for r in recs:
            f.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n")
    (out / "logs" / "bad_records.jsonl").write_bytes(make_bad_records(args.seed))
    with open(out / "traces" / "mooncake_sample.jsonl", "w") as f:
        for r in make_mooncake(300, args.seed):
            f.write(json.dumps(r) + "\n")
    rng = random.Random(args.seed + 1)
    with open(out / "traces" / "azure_sample.csv", "w") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        t = datetime(2023, 11, 16, 18, 15, 46, tzinfo=timezone.utc)
        for _ in range(300):
            t += timedelta(seconds=rng.expovariate(2.0))
            f.write(f"{t.strftime('%Y-%m-%d %H:%M:%S.%f')}0,{int(math.exp(rng.gauss(7, 1)))},{rng.randint(1, 600)}\n")
    with open(out / "traces" / "burstgpt_sample.csv", "w") as f:
        f.write("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n")
        t = 5.0
        for _ in range(300):
            t += rng.gammavariate(0.5, 2.0)
            req, resp = int(math.exp(rng.gauss(6, 1))), rng.randint(0, 900)
            f.write(f"{t:.0f},{rng.choice(['ChatGPT', 'GPT-4'])},{req},{resp},{req + resp},"
                    f"{rng.choice(['Conversation log', 'API log'])}\n")
    size = (out / "logs" / "demo_chat.jsonl").stat().st_size
    span = (datetime.fromisoformat(recs[-1]["timestamp"]) - datetime.fromisoformat(recs[0]["timestamp"])).total_seconds()
    print(f"demo_chat.jsonl: {len(recs)} requests over {span:.0f} s, {size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
