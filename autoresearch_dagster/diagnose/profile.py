"""Owns profile analysis: PyTorch-profiler Chrome traces (SGLang's per-rank .trace.json.gz or the emulator's) → ProfileSummary.

Two readings of one trace, as the diagnosis needs them: a time breakdown by category (attention,
GEMM/MoE, communication, sampling, memory copies, other GPU work, CPU scheduling) from
kernel-name rules, and the timeline (GPU idle fraction, gaps between kernels, whether prefill
steps interrupt decode, whether CPU work overlaps GPU work). Traces without GPU events (a
CPU-only ``torch.profiler`` run) are broken down by their top-level CPU operators instead.
"""
from __future__ import annotations

import gzip
import json
import re
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import numpy as np

CATEGORIES = ("attention", "gemm_moe", "communication", "sampling", "memory", "other_gpu", "cpu_scheduling")

# Ordered: the first matching rule wins. MoE routing ("topkGating", "moe_align") must win over sampling's topk.
_RULES: list[tuple[str, re.Pattern[str]]] = [
    ("memory", re.compile(r"^(memcpy|memset)|memcpy|memset|copy_kernel|CatArrayBatchedCopy|store_kvcache|"
                          r"set_kv_buffer|aten::(copy_|to|_to_copy|cat|index_put_|fill_|zero_|empty)", re.I)),
    ("communication", re.compile(r"nccl|cross_device_reduce|custom_?all_?reduce|all_?reduce|all_?gather|"
                                 r"reduce_?scatter|all_?to_?all|deepep|one_shot|two_shot|c10d::|mscclpp|"
                                 r"symm_mem|lamport", re.I)),
    ("attention", re.compile(r"flash_fwd|flash::|flashattn|fmha|BatchPrefillWith|BatchDecodeWith|"
                             r"PersistentVariableLength|MergeState|paged_?attention|attention|_attn|attn_|"
                             r"mla|xqa|decode_grouped_att|extend_attention|scaled_dot_product|"
                             r"_fwd_kernel_stage|fwd_grouped_kernel", re.I)),
    ("gemm_moe", re.compile(r"moe|expert|topkGating|gemm|xmma|nvjet|cutlass|cublas|gemv|matmul|"
                            r"wgmma|sm90_|sm80_|ampere_|hopper_|splitKreduce|deep_?gemm|"
                            r"aten::(addmm|mm|bmm|linear|matmul|baddbmm)$", re.I)),
    ("sampling", re.compile(r"sampling|sample|top_?k|top_?p|softmax|argmax|multinomial|logits|"
                            r"penalt|aten::sort|radix_?sort", re.I)),
]

_GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
_CPU_CATS = {"cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver"}
_STAGE_NAMES = {"prefill": re.compile(r"prefill|extend|EXTEND|PREFILL", re.I),
                "decode": re.compile(r"decode|DECODE", re.I)}
# attention kernels name the phase they serve; GEMMs do not.
_PREFILL_KERNEL = re.compile(r"BatchPrefillWith|prefill|extend_attention|flash_fwd_kernel(?!.*splitkv)|fmha", re.I)
_DECODE_KERNEL = re.compile(r"BatchDecodeWith|decode|splitkv|xqa", re.I)

GAP_BINS_US = (0.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 5000.0, float("inf"))
LAUNCH_GAP_US = 100.0  # gaps shorter than this are kernel-launch overhead rather than scheduling stalls

_FILE_RE = re.compile(
    r"^(?:(?P<prefix>.+)-)?(?P<profile_id>[^-]+)-TP-(?P<tp>\d+)(?:-DP-(?P<dp>\d+))?(?:-PP-(?P<pp>\d+))?"
    r"(?:-EP-(?P<ep>\d+))?(?:-(?P<stage>[A-Z_]+))?\.trace\.json(?:\.gz)?$")


class ProfileError(ValueError):
    """A trace that cannot be read; the message names the file and what is wrong."""


@lru_cache(maxsize=8192)
def classify_kernel(name: str) -> str:
    """Category of a GPU kernel (or CPU operator) name by the ordered rules; 'other_gpu' if none match."""
    for cat, rx in _RULES:
        if rx.search(name):
            return cat
    return "other_gpu"


def parse_trace_filename(name: str) -> dict[str, Any] | None:
    """Fields of SGLang's trace file name ``{prefix-}{profile_id}-TP-{tp}[-DP-..][-PP-..][-EP-..][-STAGE].trace.json.gz``."""
    m = _FILE_RE.match(Path(name).name)
    if not m:
        return None
    d = m.groupdict()
    return {k: (int(v) if k in ("tp", "dp", "pp", "ep") and v is not None else v) for k, v in d.items()}


@dataclass
class ProfileStep:
    kind: str  # prefill | decode | mixed | unknown
    start_us: float
    dur_us: float
    n_kernels: int


@dataclass
class RankProfile:
    source: str  # file name or "<object>"
    rank: dict[str, Any]
    has_gpu: bool
    window_us: float
    breakdown_us: dict[str, float]
    gpu_busy_us: float
    gpu_idle_fraction: float | None
    gap_hist: list[int]
    launch_gap_share: float | None  # share of the window spent in short (launch-overhead) gaps
    cpu_gpu_overlap: float | None  # share of CPU busy time that overlaps GPU work
    steps: list[ProfileStep]
    n_kernels: int
    top_kernels: list[tuple[str, str, float]]  # (name, category, total us)


@dataclass
class ProfileSummary:
    """Aggregate over the ranks of one profile (medians of the timeline figures, sums of the breakdown)."""
    files: list[str]
    has_gpu: bool
    breakdown_us: dict[str, float]
    breakdown_share: dict[str, float]
    gpu_idle_fraction: float | None
    gap_bins_us: list[float]
    gap_hist: list[int]
    launch_gap_share: float | None
    cpu_gpu_overlap: float | None
    n_steps: dict[str, int]
    prefill_interruptions: int  # prefill steps run between two decode steps
    prefill_interrupts_decode: bool
    decode_step_us_p50: float | None
    interrupting_prefill_us_mean: float | None
    decode_stall_ratio: float | None  # interrupting prefill step / median decode step
    prefill_time_share: float | None  # share of step time in prefill steps
    top_kernels: list[tuple[str, str, float]]
    ranks: list[RankProfile] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ranks"] = [{k: v for k, v in asdict(r).items() if k != "steps"} for r in self.ranks]
        d["gap_bins_us"] = [b if b != float("inf") else None for b in self.gap_bins_us]
        return d


# ---------------------------------------------------------------- reading


def _load(path: Path) -> dict:
    try:
        raw = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
        obj = json.loads(raw)
    except FileNotFoundError:
        raise ProfileError(f"profile trace {path} does not exist") from None
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise ProfileError(f"profile trace {path} is not readable gzip/JSON: {e}") from None
    except json.JSONDecodeError as e:
        raise ProfileError(f"profile trace {path} is not valid JSON: {e}") from None
    return obj


def _events(obj: Any, source: str) -> list[dict]:
    if isinstance(obj, list):
        return obj
    if isinstance(obj, dict) and isinstance(obj.get("traceEvents"), list):
        return obj["traceEvents"]
    raise ProfileError(f"profile {source}: expected a Chrome trace (an object with 'traceEvents' or a list of events)")


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    iv = list(intervals)
    if not iv:
        return []
    st, en = _union_arrays(np.array([x[0] for x in iv]), np.array([x[1] for x in iv]))
    return list(zip(st.tolist(), en.tolist()))


def _union_arrays(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merged busy intervals of possibly overlapping [start, end) intervals (vectorized)."""
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], np.maximum.accumulate(ends[order])
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > e[:-1]
    idx = np.flatnonzero(new)
    last = np.append(idx[1:] - 1, len(s) - 1)
    return s[idx], e[last]


def _length(iv: list[tuple[float, float]]) -> float:
    return float(sum(e - s for s, e in iv))


def _intersection_length(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total overlap of two sets of disjoint sorted intervals: busy time of ``b`` inside each interval of ``a``."""
    if not a or not b:
        return 0.0
    bs = np.array([x[0] for x in b])
    be = np.array([x[1] for x in b])
    cum = np.concatenate([[0.0], np.cumsum(be - bs)])

    def busy_until(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(bs, t, side="right") - 1
        kc = np.clip(k, 0, len(bs) - 1)
        part = np.clip(np.minimum(t, be[kc]) - bs[kc], 0.0, None)
        return np.where(k >= 0, cum[kc] + part, 0.0)

    a_s = np.array([x[0] for x in a])
    a_e = np.array([x[1] for x in a])
    return float(np.sum(busy_until(a_e) - busy_until(a_s)))


def _top_level(events: list[dict]) -> list[dict]:
    """Events not contained in another event of the same thread (avoids double counting nested ops)."""
    out: list[dict] = []
    by_tid: dict[Any, list[dict]] = {}
    for e in events:
        by_tid.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    for evs in by_tid.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        end = -float("inf")
        for e in evs:
            if e["ts"] >= end:
                out.append(e)
                end = e["ts"] + e["dur"]
    return out


@lru_cache(maxsize=4096)
def _name_phase(name: str) -> tuple[bool, bool]:
    """(marks prefill, marks decode) for an annotation or kernel name."""
    if _STAGE_NAMES["prefill"].search(name) or _PREFILL_KERNEL.search(name):
        return True, False
    if _STAGE_NAMES["decode"].search(name) or _DECODE_KERNEL.search(name):
        return False, True
    return False, False


def _kind(pre: bool, dec: bool) -> str:
    return "mixed" if pre and dec else "prefill" if pre else "decode" if dec else "unknown"


def _step_kind(names: Iterable[str]) -> str:
    pre = dec = False
    for n in names:
        p, d = _name_phase(n)
        pre, dec = pre or p, dec or d
    return _kind(pre, dec)


@dataclass
class _Kernels:
    """GPU events of one rank as arrays (sorted by start)."""
    ts: np.ndarray
    end: np.ndarray
    name_idx: np.ndarray
    names: list[str]
    is_kernel: np.ndarray  # False for memcpy/memset

    @classmethod
    def build(cls, events: list[dict]) -> "_Kernels":
        events = sorted(events, key=lambda e: e["ts"])
        names: dict[str, int] = {}
        idx = np.array([names.setdefault(e["name"], len(names)) for e in events], dtype=np.int64)
        ts = np.array([e["ts"] for e in events], dtype=float)
        dur = np.array([e["dur"] for e in events], dtype=float)
        is_kernel = np.array([e.get("cat") == "kernel" for e in events], dtype=bool)
        return cls(ts, ts + dur, idx, list(names), is_kernel)

    def phase_flags(self) -> tuple[np.ndarray, np.ndarray]:
        flags = [_name_phase(n) for n in self.names]
        pre = np.array([f[0] for f in flags], dtype=bool)[self.name_idx]
        dec = np.array([f[1] for f in flags], dtype=bool)[self.name_idx]
        return pre & self.is_kernel, dec & self.is_kernel


def _steps(k: _Kernels, annotations: list[dict]) -> list[ProfileStep]:
    """Forward steps: annotated ranges when the trace has them, else kernels split at long gaps."""
    pre, dec = k.phase_flags()
    cpre = np.concatenate([[0], np.cumsum(pre)])
    cdec = np.concatenate([[0], np.cumsum(dec)])
    if annotations:
        steps = []
        for a in sorted(annotations, key=lambda e: e["ts"]):
            lo, hi = np.searchsorted(k.ts, a["ts"]), np.searchsorted(k.ts, a["ts"] + a["dur"])
            kind = _step_kind([a["name"]])
            if kind == "unknown":
                kind = _kind(bool(cpre[hi] - cpre[lo]), bool(cdec[hi] - cdec[lo]))
            steps.append(ProfileStep(kind, float(a["ts"]), float(a["dur"]), int(hi - lo)))
        return steps
    if k.ts.size == 0:
        return []
    ends = np.maximum.accumulate(k.end)
    gaps = k.ts[1:] - ends[:-1]
    positive = gaps[gaps > 0]
    cut = max(LAUNCH_GAP_US, 5.0 * float(np.median(positive))) if positive.size else float("inf")
    bounds = np.concatenate([[0], np.flatnonzero(gaps > cut) + 1, [k.ts.size]])
    out = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        kind = _kind(bool(cpre[hi] - cpre[lo]), bool(cdec[hi] - cdec[lo]))
        out.append(ProfileStep(kind, float(k.ts[lo]), float(ends[hi - 1] - k.ts[lo]), int(hi - lo)))
    return out


def _rank_profile(events: list[dict], source: str, rank: dict[str, Any]) -> RankProfile:
    complete = []
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        try:
            e = {"name": str(e["name"]), "cat": e.get("cat"), "ts": float(e["ts"]), "dur": float(e.get("dur", 0.0)),
                 "pid": e.get("pid"), "tid": e.get("tid")}
        except (KeyError, TypeError, ValueError):
            continue
        complete.append(e)
    gpu = [e for e in complete if e["cat"] in _GPU_CATS]
    annotations = [e for e in complete if e["cat"] == "gpu_user_annotation"
                   or (e["cat"] == "user_annotation" and _step_kind([e["name"]]) != "unknown")]
    # The GPU-side copy of an annotation marks the step on the device timeline; prefer it when present.
    gpu_ann = [e for e in annotations if e["cat"] == "gpu_user_annotation"]
    annotations = gpu_ann or annotations
    breakdown = {c: 0.0 for c in CATEGORIES}
    kernel_totals: dict[str, float] = {}
    if gpu:
        k = _Kernels.build(gpu)
        per_name = np.bincount(k.name_idx, weights=k.end - k.ts, minlength=len(k.names))
        memcpy_names = {e["name"] for e in gpu if e["cat"] != "kernel"}
        for i, name in enumerate(k.names):
            cat = "memory" if name in memcpy_names else classify_kernel(name)
            breakdown[cat] += float(per_name[i])
            kernel_totals[name] = float(per_name[i])
        us, ue = _union_arrays(k.ts, k.end)
        window = float(ue[-1] - us[0])
        busy_us = float(np.sum(ue - us))
        gaps = us[1:] - ue[:-1]
        idle = window - busy_us
        breakdown["cpu_scheduling"] = idle  # GPU idle inside the active window: the host was not feeding it
        hist = np.histogram(gaps, bins=np.array(GAP_BINS_US))[0].tolist()
        launch = float(gaps[gaps < LAUNCH_GAP_US].sum()) / window if window > 0 else 0.0
        # Host work: operators and scheduler annotations; step annotations span the GPU work and are left out.
        host = [e for e in complete if e["cat"] in ("cpu_op", "python_function")
                or (e["cat"] == "user_annotation" and _step_kind([e["name"]]) == "unknown")]
        cpu_busy = _union((e["ts"], e["ts"] + e["dur"]) for e in _top_level(host))
        cpu_len = _length(cpu_busy)
        overlap = (_intersection_length(cpu_busy, list(zip(us.tolist(), ue.tolist()))) / cpu_len
                   if cpu_len > 0 else None)
        idle_frac = idle / window if window > 0 else 0.0
        steps = _steps(k, annotations)
    else:
        ops = _top_level([e for e in complete if e["cat"] == "cpu_op"])
        for e in ops:
            cat = classify_kernel(e["name"])
            breakdown["cpu_scheduling" if cat == "other_gpu" else cat] += e["dur"]
            kernel_totals[e["name"]] = kernel_totals.get(e["name"], 0.0) + e["dur"]
        spans = [e for e in complete if e["cat"] in _CPU_CATS]
        window = (max(e["ts"] + e["dur"] for e in spans) - min(e["ts"] for e in spans)) if spans else 0.0
        busy_us, idle_frac, hist, launch, overlap = 0.0, None, [0] * (len(GAP_BINS_US) - 1), None, None
        steps = [ProfileStep(_step_kind([a["name"]]), a["ts"], a["dur"], 0) for a in annotations]
    top = sorted(kernel_totals.items(), key=lambda kv: -kv[1])[:10]
    return RankProfile(
        source=source, rank=rank, has_gpu=bool(gpu), window_us=float(window), breakdown_us=breakdown,
        gpu_busy_us=float(busy_us), gpu_idle_fraction=idle_frac, gap_hist=[int(x) for x in hist],
        launch_gap_share=launch, cpu_gpu_overlap=overlap, steps=steps, n_kernels=len(gpu),
        top_kernels=[(n, classify_kernel(n), float(t)) for n, t in top])


def _interruptions(steps: list[ProfileStep]) -> tuple[int, list[ProfileStep]]:
    seq = [s for s in steps if s.kind in ("prefill", "decode", "mixed")]
    out = []
    for i, s in enumerate(seq):
        if s.kind == "prefill" and any(p.kind == "decode" for p in seq[:i]) and any(n.kind == "decode" for n in seq[i + 1:]):
            out.append(s)
    return len(out), out


def _summarize(ranks: list[RankProfile]) -> ProfileSummary:
    breakdown = {c: float(sum(r.breakdown_us[c] for r in ranks)) for c in CATEGORIES}
    total = sum(breakdown.values())
    share = {c: (v / total if total > 0 else 0.0) for c, v in breakdown.items()}

    def med(vals: list[float | None]) -> float | None:
        vs = [v for v in vals if v is not None]
        return float(np.median(vs)) if vs else None

    steps = [s for r in ranks for s in r.steps]
    n_steps = {k: sum(1 for s in steps if s.kind == k) for k in ("prefill", "decode", "mixed", "unknown")}
    n_int, interrupting = 0, []
    for r in ranks:
        n, ss = _interruptions(r.steps)
        n_int += n
        interrupting += ss
    dec = [s.dur_us for s in steps if s.kind == "decode"]
    dec_p50 = float(np.median(dec)) if dec else None
    int_mean = float(np.mean([s.dur_us for s in interrupting])) if interrupting else None
    step_total = sum(s.dur_us for s in steps if s.kind != "unknown")
    pre_share = (sum(s.dur_us for s in steps if s.kind in ("prefill", "mixed")) / step_total) if step_total > 0 else None
    kernel_totals: dict[str, float] = {}
    for r in ranks:
        for n, _, t in r.top_kernels:
            kernel_totals[n] = kernel_totals.get(n, 0.0) + t
    top = sorted(kernel_totals.items(), key=lambda kv: -kv[1])[:10]
    return ProfileSummary(
        files=[r.source for r in ranks], has_gpu=any(r.has_gpu for r in ranks),
        breakdown_us=breakdown, breakdown_share=share,
        gpu_idle_fraction=med([r.gpu_idle_fraction for r in ranks]),
        gap_bins_us=list(GAP_BINS_US), gap_hist=[int(sum(h)) for h in zip(*[r.gap_hist for r in ranks])],
        launch_gap_share=med([r.launch_gap_share for r in ranks]),
        cpu_gpu_overlap=med([r.cpu_gpu_overlap for r in ranks]),
        n_steps=n_steps, prefill_interruptions=n_int, prefill_interrupts_decode=n_int > 0,
        decode_step_us_p50=dec_p50, interrupting_prefill_us_mean=int_mean,
        decode_stall_ratio=(int_mean / dec_p50) if (int_mean is not None and dec_p50) else None,
        prefill_time_share=pre_share, top_kernels=[(n, classify_kernel(n), float(t)) for n, t in top],
        ranks=ranks)


def parse_profile(path_or_obj: str | Path | dict | list) -> ProfileSummary:
    """Summarize a profile: a trace file (.json or .json.gz), a directory of per-rank traces, or a trace object."""
    if isinstance(path_or_obj, (dict, list)):
        return _summarize([_rank_profile(_events(path_or_obj, "<object>"), "<object>", {})])
    path = Path(path_or_obj)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.name.endswith((".trace.json.gz", ".trace.json", ".json.gz")))
        if not files:
            raise ProfileError(f"profile directory {path} holds no *.trace.json(.gz) files")
    elif path.exists():
        files = [path]
    else:
        raise ProfileError(f"profile trace {path} does not exist")
    ranks = [_rank_profile(_events(_load(p), str(p)), p.name, parse_trace_filename(p.name) or {}) for p in files]
    return _summarize(ranks)
