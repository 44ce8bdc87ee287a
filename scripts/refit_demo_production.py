"""Refit the demo logs' production service-time constants (examples/make_demo_logs.py TTFT_*/TPOT_*) on a replay of
the log on the demo endpoint as it runs (its hidden factors included; ``--default``: the documented factors), and
print the replay-vs-production checks of that replay. Run after the emulator's defaults change, set the constants,
regenerate the logs (python examples/make_demo_logs.py) and run it again until the checks pass.

Usage: python scripts/refit_demo_production.py [--default]"""
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]
from autoresearch_dagster.engines.emulator import EmulatorEngine  # noqa: E402
from autoresearch_dagster.experiments.production_replay import replay_production  # noqa: E402
from autoresearch_dagster.pool.build import build_pool  # noqa: E402
from autoresearch_dagster.pool.production import read_production  # noqa: E402
from autoresearch_dagster.pool.schema import read_pool  # noqa: E402
from autoresearch_dagster.spec import load_endpoint  # noqa: E402
from make_demo_logs import others_in_flight  # noqa: E402

ep = load_endpoint(ROOT / "examples/endpoints/demo.yaml")
if "--default" in sys.argv:
    ep = ep.model_copy(update={"engine_options": {}})
with tempfile.TemporaryDirectory() as tmp:
    res = build_pool(ep.log_paths(), ep.name, Path(tmp) / "pool")
    home = Path(res.pool_path).parent if Path(res.pool_path).suffix else Path(res.pool_path)
    prod = read_production(home)
    run = replay_production(ep, read_pool(home), prod, engine=EmulatorEngine(ep), seed=0)
recs = [r for r in run.records if r.status == "ok"]
others = others_in_flight(np.array([r.sent_s for r in recs]), np.array([r.end_s for r in recs]))
tpot = np.array([r.tpot_s if r.tpot_s is not None else np.nan for r in recs]) * 1000
ok = np.isfinite(tpot)
A = np.vstack([np.ones(ok.sum()), np.maximum(others[ok], 0)]).T
(tb, tk), *_ = np.linalg.lstsq(A, tpot[ok], rcond=None)
resid = np.median(np.abs(A @ [tb, tk] - tpot[ok]) / tpot[ok])
ttft = np.array([r.ttft_s for r in recs]) * 1000
unc = np.array([r.prompt_tokens - (r.cached_tokens or 0) for r in recs], dtype=float)
fast = ttft <= np.quantile(ttft, 0.9)
B = np.vstack([np.ones(fast.sum()), unc[fast]]).T
(fb, fk), *_ = np.linalg.lstsq(B, ttft[fast], rcond=None)
print(f"n={len(recs)} TPOT_BASE_MS={tb:.3f} TPOT_MS_PER_REQUEST={tk:.3f} (median rel residual {resid:.1%}) "
      f"TTFT_BASE_MS={fb:.2f} TTFT_MS_PER_TOKEN={fk:.5f}")
for c in run.report.get("checks", []):
    print(f"  {c['name']}: production {c['production']} replay {c['replay']} drift {c['drift']} "
          f"(limit {c['limit']}) {'ok' if c['passed'] else 'DRIFTED'}")
