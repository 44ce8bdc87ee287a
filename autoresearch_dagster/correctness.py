"""Owns the output-correctness gate for lossy changes, measured through the OpenAI logprobs interface.

Method (``docs/correctness.md``; ``reference/methods.md`` §3):
1. A fixed, versioned prompt set (``prompt_set``) is continued greedily by the baseline once, so
   one token sequence per prompt serves every comparison.
2. Teacher forcing: the baseline and the candidate score the SAME text (``/v1/completions`` with
   ``echo=true, logprobs=k, max_tokens=1``). When a server returns no prompt logprobs, the gate
   falls back to scoring each generated position with a prefix request (``method="prefix"``).
3. Per position: top-1 agreement, KL(baseline‖candidate) and total variation on the union of both
   top-k sets plus the forced token plus one "rest" bucket (tail treatment below), and the change
   of the forced token's logprob.
4. Calibration: the baseline scores the same sequences a second time at a different concurrency
   (A/A). Thresholds are ``max(floor, multiplier × A/A)``; statistics use a cluster bootstrap over
   prompts. An optional positive control (a known-bad server) must fail, else the gate is invalid.

Tail treatment: a token in the union that one side did not list has probability at most that
side's k-th listed probability; it is imputed as ``min(p_k, unlisted_mass / n_missing)``, and what
is left of the side's unlisted mass forms the rest bucket, so both vectors sum to 1.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import random
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Sequence

import aiohttp
import numpy as np

from autoresearch_dagster.tokens import synth_text

PROMPT_SET_VERSION = "correctness-v1"
Tolerance = Literal["strict", "near_lossless"]


class GateError(RuntimeError):
    """The gate could not measure (a server failed, or the two sides tokenized the text differently)."""


# ---------------------------------------------------------------- prompt set

@dataclass(frozen=True)
class Prompt:
    id: str
    bucket: str
    text: str


@dataclass(frozen=True)
class PromptSet:
    version: str
    prompts: tuple[Prompt, ...]

    @property
    def hash(self) -> str:
        blob = json.dumps([[p.id, p.bucket, p.text] for p in self.prompts], ensure_ascii=False)
        return hashlib.sha256(f"{self.version}\n{blob}".encode()).hexdigest()[:16]

    def __len__(self) -> int:
        return len(self.prompts)


_WORDS = {
    "en": "the river carried light past quiet houses while children counted boats and stones".split(),
    "de": "der fluss trug das licht an stillen häusern vorbei während kinder boote zählten".split(),
    "fr": "la rivière portait la lumière devant des maisons calmes où les enfants comptaient".split(),
    "es": "el río llevaba la luz junto a casas tranquilas mientras los niños contaban barcos".split(),
    "pt": "o rio levava a luz por casas quietas enquanto as crianças contavam barcos".split(),
    "ru": "река несла свет мимо тихих домов пока дети считали лодки и камни".split(),
    "zh": "河 水 带 着 光 流 过 安 静 的 房 子 孩 子 们 数 着 船 和 石 头".split(),
    "ja": "川 は 静 か な 家 の 前 を 光 を 運 び 子 供 た ち は 船 を 数 え た".split(),
}


def _multilingual(rng: random.Random) -> str:
    lang = rng.choice(sorted(_WORDS))
    words = _WORDS[lang]
    sep = "" if lang in ("zh", "ja") else " "
    sentences = [sep.join(rng.choice(words) for _ in range(rng.randint(6, 12))) for _ in range(rng.randint(2, 4))]
    return f"[{lang}] " + (". " if sep else "。").join(sentences)


def _code(rng: random.Random) -> str:
    name = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(4, 9)))
    args = ", ".join(f"x{i}" for i in range(rng.randint(1, 3)))
    body = "\n".join(f"    y{i} = x0 * {rng.randint(2, 99)} + {rng.randint(0, 9)}" for i in range(rng.randint(2, 5)))
    return f"def {name}({args}):\n{body}\n    return "


def _json_tool(rng: random.Random) -> str:
    call = {"name": rng.choice(["get_weather", "search_docs", "book_table", "convert_units"]),
            "arguments": {"city": rng.choice(["Lyon", "Osaka", "Lima", "Oslo"]), "limit": rng.randint(1, 20),
                          "units": rng.choice(["metric", "imperial"])}}
    return "Tool call as JSON:\n" + json.dumps(call)[: rng.randint(30, 70)]


def _chat(rng: random.Random) -> str:
    q = synth_text(rng.randint(12, 30), rng.randint(0, 10**6))
    return f"<|user|>\n{q}\n<|assistant|>\n"


def prompt_set(n_per_bucket: int = 8, *, long_chars: int = 1500, version: str = PROMPT_SET_VERSION) -> PromptSet:
    """The fixed prompt set: prose, multilingual, code, JSON tool calls, chat template, long context.

    Deterministic for a given (version, n_per_bucket, long_chars); its ``hash`` is recorded with
    every gate result. ``long_chars`` sizes the long-context bucket (raise it for real endpoints
    so chunked prefill and the prefix cache are exercised).
    """
    if version != PROMPT_SET_VERSION:
        raise ValueError(f"unknown prompt set version {version!r}; this build has {PROMPT_SET_VERSION!r}")
    if n_per_bucket < 1:
        raise ValueError("n_per_bucket must be at least 1")
    rng = random.Random(f"{version}:{n_per_bucket}:{long_chars}")
    makers = {
        "prose": lambda r: synth_text(r.randint(20, 60), r.randint(0, 10**6)),
        "multilingual": _multilingual,
        "code": _code,
        "json": _json_tool,
        "chat": _chat,
        "long": lambda r: synth_text(long_chars, r.randint(0, 10**6))[:long_chars],
    }
    prompts = [Prompt(f"{bucket}-{i}", bucket, make(rng)) for bucket, make in makers.items() for i in range(n_per_bucket)]
    return PromptSet(version, tuple(prompts))


# ---------------------------------------------------------------- thresholds and result

@dataclass(frozen=True)
class Thresholds:
    """Decision rule constants (methods.md §3.4); ``for_tolerance`` gives the two documented modes."""
    kl_floor: float  # nats: the KL threshold never goes below this
    aa_multiplier: float = 2.0  # ... and is at least this many times the A/A mean KL
    top1_margin: float = 0.005  # allowed extra top-1 disagreement over A/A (fraction)
    delta_logprob: float = 0.01  # nats: a systematic shift of the forced token's logprob beyond this fails
    tv_catastrophic: float = 0.5  # any position with TV above this fails
    bootstrap: int = 2000

    @classmethod
    def for_tolerance(cls, tolerance: Tolerance) -> "Thresholds":
        if tolerance == "strict":
            return cls(kl_floor=1e-3, top1_margin=0.005, delta_logprob=0.01)
        if tolerance == "near_lossless":
            return cls(kl_floor=5e-3, top1_margin=0.02, delta_logprob=0.05)
        raise ValueError(f"tolerance must be 'strict' or 'near_lossless', got {tolerance!r}")


@dataclass
class GateResult:
    passed: bool
    top1_agreement: float
    kl_mean: float
    kl_p99: float
    tv_mean: float
    threshold: float  # the KL threshold the upper CI of mean KL was held to
    calibration: dict[str, Any]
    n_positions: int
    reasons: list[str]
    kl_ci: tuple[float, float] = (math.nan, math.nan)
    tv_max: float = math.nan
    delta_logprob_mean: float = math.nan
    delta_logprob_ci: tuple[float, float] = (math.nan, math.nan)
    buckets: dict[str, dict[str, float]] = field(default_factory=dict)
    method: str = "echo"
    tolerance: str = "near_lossless"
    top_k: int = 5
    prompt_set: dict[str, Any] = field(default_factory=dict)
    greedy_match: float | None = None  # share of prompts whose greedy continuation equals the baseline's
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["kl_ci"], d["delta_logprob_ci"] = list(self.kl_ci), list(self.delta_logprob_ci)
        return json.loads(json.dumps(d, default=float, allow_nan=True))


# ---------------------------------------------------------------- per-position comparison

@dataclass
class Scored:
    """One side's teacher-forced view of one sequence: per position, top-k and the forced token."""
    tokens: list[str]  # forced tokens, one per scored position
    forced_lp: list[float | None]  # logprob of the forced token (None when the side did not report it)
    top: list[dict[str, float]]


def _side_vector(top: dict[str, float], forced: str, forced_lp: float | None, union: list[str]) -> np.ndarray:
    known = dict(top)
    if forced_lp is not None:
        known[forced] = forced_lp
    p_known = {t: math.exp(lp) for t, lp in known.items()}
    unlisted = max(1.0 - sum(p_known.values()), 0.0)
    floor = min((math.exp(lp) for lp in top.values()), default=unlisted)
    missing = [t for t in union if t not in p_known]
    imputed = min(floor, unlisted / len(missing)) if missing else 0.0
    vec = [p_known.get(t, imputed) for t in union]
    vec.append(max(unlisted - imputed * len(missing), 0.0))
    return np.asarray(vec, dtype=np.float64)


def compare_position(ref_top: dict[str, float], cand_top: dict[str, float], forced: str,
                     ref_lp: float | None, cand_lp: float | None) -> tuple[bool, float, float]:
    """(top-1 agrees, KL(ref‖cand), TV) for one position, with the module's tail treatment."""
    union = sorted(set(ref_top) | set(cand_top) | {forced})
    p = np.clip(_side_vector(ref_top, forced, ref_lp, union), 1e-12, None)
    q = np.clip(_side_vector(cand_top, forced, cand_lp, union), 1e-12, None)
    p, q = p / p.sum(), q / q.sum()
    kl = float(np.sum(p * (np.log(p) - np.log(q))))
    tv = 0.5 * float(np.abs(p - q).sum())
    agree = bool(ref_top) and bool(cand_top) and max(ref_top, key=ref_top.get) == max(cand_top, key=cand_top.get)
    return agree, max(kl, 0.0), tv


@dataclass
class Divergence:
    """Per-prompt arrays of per-position metrics between two scorings."""
    agree: list[np.ndarray]
    kl: list[np.ndarray]
    tv: list[np.ndarray]
    dlp: list[np.ndarray]  # candidate minus reference logprob of the forced token (known on both sides)
    buckets: list[str]

    @property
    def n_positions(self) -> int:
        return int(sum(len(a) for a in self.kl))

    def flat(self, name: str) -> np.ndarray:
        arrs = getattr(self, name)
        return np.concatenate(arrs) if arrs else np.zeros(0)


def divergence(ref: list[Scored], cand: list[Scored], buckets: list[str]) -> Divergence:
    agree, kls, tvs, dlps = [], [], [], []
    for i, (r, c) in enumerate(zip(ref, cand)):
        if r.tokens != c.tokens:
            first = next((j for j, (a, b) in enumerate(zip(r.tokens, c.tokens)) if a != b), min(len(r.tokens), len(c.tokens)))
            raise GateError(f"prompt #{i}: the two servers tokenized the scored text differently (first difference "
                            f"at position {first}); the gate needs the same tokenizer on both sides")
        a_, k_, t_, d_ = [], [], [], []
        for j, tok in enumerate(r.tokens):
            ag, kl, tv = compare_position(r.top[j], c.top[j], tok, r.forced_lp[j], c.forced_lp[j])
            a_.append(ag), k_.append(kl), t_.append(tv)
            if r.forced_lp[j] is not None and c.forced_lp[j] is not None:
                d_.append(c.forced_lp[j] - r.forced_lp[j])
        agree.append(np.asarray(a_, dtype=float)), kls.append(np.asarray(k_)), tvs.append(np.asarray(t_))
        dlps.append(np.asarray(d_))
    return Divergence(agree, kls, tvs, dlps, list(buckets))


def _cluster_ci(values: list[np.ndarray], *, n_boot: int, seed: int) -> tuple[float, float]:
    """95% CI of the pooled per-position mean, resampling prompts (clusters) with replacement."""
    sums = np.array([v.sum() for v in values])
    counts = np.array([len(v) for v in values], dtype=float)
    keep = counts > 0
    sums, counts = sums[keep], counts[keep]
    if len(sums) == 0:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(sums), size=(n_boot, len(sums)))
    means = sums[idx].sum(1) / counts[idx].sum(1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def decide(div: Divergence, aa: Divergence, th: Thresholds, *, seed: int = 0) -> tuple[bool, dict[str, Any], list[str]]:
    """Apply the decision rule; returns (passed, statistics, reasons for failure)."""
    kl, tv, agree, dlp = div.flat("kl"), div.flat("tv"), div.flat("agree"), div.flat("dlp")
    aa_kl, aa_agree = aa.flat("kl"), aa.flat("agree")
    if len(kl) == 0:
        return False, {}, ["no positions were scored"]
    aa_kl_mean = float(aa_kl.mean()) if len(aa_kl) else 0.0
    aa_top1 = float(aa_agree.mean()) if len(aa_agree) else 1.0
    kl_threshold = max(th.kl_floor, th.aa_multiplier * aa_kl_mean)
    top1_min = aa_top1 - th.top1_margin
    kl_ci = _cluster_ci(div.kl, n_boot=th.bootstrap, seed=seed)
    dlp_ci = _cluster_ci(div.dlp, n_boot=th.bootstrap, seed=seed + 1)
    stats = {
        "top1_agreement": float(agree.mean()), "kl_mean": float(kl.mean()), "kl_p99": float(np.quantile(kl, 0.99)),
        "tv_mean": float(tv.mean()), "tv_max": float(tv.max()), "kl_ci": kl_ci,
        "delta_logprob_mean": float(dlp.mean()) if len(dlp) else math.nan, "delta_logprob_ci": dlp_ci,
        "kl_threshold": kl_threshold, "top1_min": top1_min,
        "aa": {"kl_mean": aa_kl_mean, "kl_p99": float(np.quantile(aa_kl, 0.99)) if len(aa_kl) else 0.0,
               "tv_mean": float(aa.flat("tv").mean()) if len(aa_kl) else 0.0, "top1_agreement": aa_top1,
               "n_positions": aa.n_positions},
    }
    reasons: list[str] = []
    if kl_ci[1] > kl_threshold:
        reasons.append(f"mean KL {stats['kl_mean']:.3g} nats (95% CI upper {kl_ci[1]:.3g}) exceeds the threshold "
                       f"{kl_threshold:.3g} = max({th.kl_floor:g}, {th.aa_multiplier:g} x A/A {aa_kl_mean:.3g})")
    if stats["top1_agreement"] < top1_min:
        reasons.append(f"top-1 agreement {stats['top1_agreement']:.4f} is below A/A {aa_top1:.4f} minus "
                       f"{th.top1_margin:.3f}")
    if dlp_ci[0] > th.delta_logprob or dlp_ci[1] < -th.delta_logprob:
        reasons.append(f"the forced token's logprob shifts systematically: mean {stats['delta_logprob_mean']:+.4f} "
                       f"nats, 95% CI [{dlp_ci[0]:+.4f}, {dlp_ci[1]:+.4f}] outside ±{th.delta_logprob:g}")
    n_cat = int((tv > th.tv_catastrophic).sum())
    if n_cat:
        reasons.append(f"{n_cat} position(s) with total variation above {th.tv_catastrophic:g} (max {stats['tv_max']:.3f})")
    buckets: dict[str, dict[str, float]] = {}
    for b in sorted(set(div.buckets)):
        sel = [i for i, x in enumerate(div.buckets) if x == b]
        bkl = np.concatenate([div.kl[i] for i in sel])
        bag = np.concatenate([div.agree[i] for i in sel])
        if len(bkl) == 0:
            continue
        buckets[b] = {"kl_mean": float(bkl.mean()), "top1_agreement": float(bag.mean()), "n_positions": int(len(bkl))}
        if bkl.mean() > kl_threshold:
            reasons.append(f"bucket {b!r}: mean KL {bkl.mean():.3g} exceeds {kl_threshold:.3g}")
    stats["buckets"] = buckets
    return not reasons, stats, reasons


# ---------------------------------------------------------------- HTTP scoring

def _completions_url(base_url: str) -> str:
    base = base_url.rstrip("/")
    return base + ("/completions" if base.endswith("/v1") else "/v1/completions")


class _Client:
    def __init__(self, session: aiohttp.ClientSession, base_url: str, model: str | None, timeout_s: float,
                 headers: dict[str, str]):
        self.session, self.url, self.model = session, _completions_url(base_url), model
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.headers = headers

    async def post(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.model:
            body = {**body, "model": self.model}
        try:
            async with self.session.post(self.url, json=body, timeout=self.timeout, headers=self.headers) as resp:
                text = await resp.text()
                if resp.status != 200:
                    raise GateError(f"{self.url} answered HTTP {resp.status}: {text[:300]}")
                return json.loads(text)
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            raise GateError(f"{self.url} failed: {type(e).__name__}: {e}") from None

    async def generate(self, prompt: str, max_tokens: int, k: int) -> tuple[str, list[str], list[dict[str, float]], list[float | None]]:
        out = await self.post({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "logprobs": k})
        choice = out["choices"][0]
        lp = choice.get("logprobs") or {}
        return (choice.get("text", ""), list(lp.get("tokens") or []), [t or {} for t in lp.get("top_logprobs") or []],
                list(lp.get("token_logprobs") or []))

    async def score_echo(self, text: str, k: int) -> Scored | None:
        """Teacher-forced prompt logprobs; None when the server does not return them."""
        out = await self.post({"prompt": text, "max_tokens": 1, "temperature": 0.0, "echo": True, "logprobs": k})
        choice = out["choices"][0]
        lp = choice.get("logprobs") or {}
        tokens, tops, tlps = lp.get("tokens") or [], lp.get("top_logprobs") or [], lp.get("token_logprobs") or []
        n_prompt = (out.get("usage") or {}).get("prompt_tokens") or max(len(tokens) - 1, 0)
        if len(tokens) < n_prompt or len(tops) < n_prompt or n_prompt < 2 or not any(tops[1:n_prompt]):
            return None
        return Scored(tokens=list(tokens[1:n_prompt]), forced_lp=list(tlps[1:n_prompt]),
                      top=[t or {} for t in tops[1:n_prompt]])

    async def score_prefixes(self, prompt: str, cont_tokens: list[str], k: int) -> Scored:
        """Fallback: one request per generated position, prompt = text so far, next-token top-k."""
        tops: list[dict[str, float]] = []
        lps: list[float | None] = []
        for j, tok in enumerate(cont_tokens):
            _, _, top, _ = await self.generate(prompt + "".join(cont_tokens[:j]), 1, k)
            t = top[0] if top else {}
            tops.append(t)
            lps.append(t.get(tok))
        return Scored(tokens=list(cont_tokens), forced_lp=lps, top=tops)


async def _gather_limited(coros: list, concurrency: int) -> list:
    sem = asyncio.Semaphore(concurrency)

    async def one(c):
        async with sem:
            return await c
    return await asyncio.gather(*(one(c) for c in coros))


async def _gate_async(baseline_url: str, candidate_url: str, texts: list[str], *, model: str | None, top_k: int,
                      gen_tokens: int, concurrency: int, timeout_s: float, headers: dict[str, str],
                      positive_control_url: str | None, free_running: bool) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        base = _Client(session, baseline_url, model, timeout_s, headers)
        cand = _Client(session, candidate_url, model, timeout_s, headers)
        gens = await _gather_limited([base.generate(t, gen_tokens, top_k) for t in texts], concurrency)
        full = [t + g[0] for t, g in zip(texts, gens)]
        ref = await _gather_limited([base.score_echo(f, top_k) for f in full], concurrency)
        method = "echo" if all(r is not None for r in ref) else "prefix"
        if method == "echo":
            # A/A at concurrency 1: a different batch composition, which is where real servers' noise comes from
            aa = await _gather_limited([base.score_echo(f, top_k) for f in full], 1)
            sides = {"candidate": cand}
            if positive_control_url:
                sides["positive_control"] = _Client(session, positive_control_url, model, timeout_s, headers)
            scored = {name: await _gather_limited([c.score_echo(f, top_k) for f in full], concurrency)
                      for name, c in sides.items()}
            for name, rows in [("baseline (A/A)", aa)] + list(scored.items()):
                if any(r is None for r in rows):
                    raise GateError(f"{name} returned no prompt logprobs while the baseline did; both sides need echo")
        else:
            ref = [Scored(tokens=g[1], forced_lp=g[3], top=g[2]) for g in gens]
            aa = await _gather_limited([base.score_prefixes(t, g[1], top_k) for t, g in zip(texts, gens)], 1)
            sides = {"candidate": cand}
            if positive_control_url:
                sides["positive_control"] = _Client(session, positive_control_url, model, timeout_s, headers)
            scored = {name: await _gather_limited([c.score_prefixes(t, g[1], top_k) for t, g in zip(texts, gens)],
                                                  concurrency) for name, c in sides.items()}
        greedy = None
        if free_running:
            cgens = await _gather_limited([cand.generate(t, gen_tokens, 0) for t in texts], concurrency)
            greedy = float(np.mean([c[0] == g[0] for c, g in zip(cgens, gens)]))
        return {"ref": ref, "aa": aa, "scored": scored, "method": method, "greedy": greedy}


def _run_coro(coro):
    """Run a coroutine to completion even when the caller already runs an event loop in this thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["v"] = asyncio.run(coro)
        except BaseException as e:  # re-raised in the caller's thread
            box["e"] = e
    t = threading.Thread(target=target)
    t.start()
    t.join()
    if "e" in box:
        raise box["e"]
    return box["v"]


def gate(baseline_url: str, candidate_url: str, prompts: PromptSet | Sequence[str] | None = None, *,
         model: str | None = None, top_k: int = 5, gen_tokens: int = 32, tolerance: Tolerance = "near_lossless",
         thresholds: Thresholds | None = None, concurrency: int = 8, timeout_s: float = 120.0,
         api_key_env: str | None = None, positive_control_url: str | None = None, free_running: bool = True,
         seed: int = 0) -> GateResult:
    """Compare a candidate server's output distributions with the baseline's on the same token sequences.

    ``prompts`` defaults to ``prompt_set()``. ``positive_control_url``: a server known to be wrong;
    if the gate passes it, the result fails with the reason that the gate has no power.
    """
    t0 = time.monotonic()
    if top_k < 1:
        raise ValueError("top_k must be at least 1")
    pset = prompts if isinstance(prompts, PromptSet) else None
    if prompts is None:
        pset = prompt_set()
    if pset is not None:
        texts, buckets = [p.text for p in pset.prompts], [p.bucket for p in pset.prompts]
        pinfo = {"version": pset.version, "hash": pset.hash, "n_prompts": len(pset)}
    else:
        texts, buckets = [str(p) for p in prompts], ["custom"] * len(prompts)
        blob = json.dumps(texts, ensure_ascii=False).encode()
        pinfo = {"version": "custom", "hash": hashlib.sha256(blob).hexdigest()[:16], "n_prompts": len(texts)}
    if not texts:
        raise ValueError("the gate needs at least one prompt")
    headers = {}
    if api_key_env:
        key = os.environ.get(api_key_env)
        if not key:
            raise GateError(f"environment variable {api_key_env} (the endpoint's API key) is not set")
        headers["Authorization"] = f"Bearer {key}"
    th = thresholds or Thresholds.for_tolerance(tolerance)
    raw = _run_coro(_gate_async(baseline_url, candidate_url, texts, model=model, top_k=top_k, gen_tokens=gen_tokens,
                                concurrency=concurrency, timeout_s=timeout_s, headers=headers,
                                positive_control_url=positive_control_url, free_running=free_running))
    aa = divergence(raw["ref"], raw["aa"], buckets)
    div = divergence(raw["ref"], raw["scored"]["candidate"], buckets)
    passed, stats, reasons = decide(div, aa, th, seed=seed)
    calibration: dict[str, Any] = {**stats.pop("aa"), "kl_floor": th.kl_floor, "aa_multiplier": th.aa_multiplier,
                                   "top1_min": stats.pop("top1_min"), "top1_margin": th.top1_margin,
                                   "delta_logprob_tolerance": th.delta_logprob, "tv_catastrophic": th.tv_catastrophic}
    if "positive_control" in raw["scored"]:
        pc = divergence(raw["ref"], raw["scored"]["positive_control"], buckets)
        pc_passed, pc_stats, pc_reasons = decide(pc, aa, th, seed=seed)
        calibration["positive_control"] = {"passed": pc_passed, "kl_mean": pc_stats.get("kl_mean"),
                                           "top1_agreement": pc_stats.get("top1_agreement"), "reasons": pc_reasons}
        if pc_passed:
            passed = False
            reasons.append("invalid: the positive control passed, so the gate has no power on this prompt set")
    return GateResult(
        passed=passed, top1_agreement=stats.get("top1_agreement", math.nan), kl_mean=stats.get("kl_mean", math.nan),
        kl_p99=stats.get("kl_p99", math.nan), tv_mean=stats.get("tv_mean", math.nan),
        threshold=stats.pop("kl_threshold", math.nan), calibration=calibration, n_positions=div.n_positions,
        reasons=reasons, kl_ci=stats.get("kl_ci", (math.nan, math.nan)), tv_max=stats.get("tv_max", math.nan),
        delta_logprob_mean=stats.get("delta_logprob_mean", math.nan),
        delta_logprob_ci=stats.get("delta_logprob_ci", (math.nan, math.nan)), buckets=stats.get("buckets", {}),
        method=raw["method"], tolerance=tolerance if thresholds is None else "custom", top_k=top_k, prompt_set=pinfo,
        greedy_match=raw["greedy"], elapsed_s=time.monotonic() - t0)


# ---------------------------------------------------------------- the emulator's gate

def emulated_gate(baseline_config: dict[str, Any], candidate_config: dict[str, Any], *, seed: int = 0,
                  prompts: PromptSet | Sequence[str] | None = None, tolerance: Tolerance = "near_lossless",
                  positive_control: bool = True, **gate_kwargs: Any) -> GateResult:
    """Run ``gate`` over HTTP against the tiny torch model served with each config's numerics.

    The numerics follow ``quantization`` and ``kv_cache_dtype`` (``tinymodel.numerics_from_config``);
    every other knob, speculative decoding included, computes like the baseline and must pass.
    The positive control is the tiny model with a dropped layer.
    """
    from autoresearch_dagster.tinymodel import numerics_for, numerics_from_config, serve_tiny_model_in_thread

    base_n, cand_n = numerics_from_config(baseline_config), numerics_from_config(candidate_config)
    prompts = prompts if prompts is not None else prompt_set(3, long_chars=600)
    servers = []
    try:
        servers.append(serve_tiny_model_in_thread(base_n, seed))
        servers.append(serve_tiny_model_in_thread(cand_n, seed))
        pc_url = None
        if positive_control:
            servers.append(serve_tiny_model_in_thread(numerics_for("broken_layer"), seed))
            pc_url = servers[2].base_url
        result = gate(servers[0].base_url, servers[1].base_url, prompts, tolerance=tolerance,
                      positive_control_url=pc_url, seed=seed, **gate_kwargs)
    finally:
        for s in servers:
            s.stop()
    result.calibration["emulated"] = {"model": "tinymodel", "seed": seed, "baseline_numerics": base_n.label(),
                                      "candidate_numerics": cand_n.label()}
    return result
