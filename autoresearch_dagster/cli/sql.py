"""Owns `autoresearch sql`: run a query against the results lake's DuckDB views and print the rows."""
from __future__ import annotations

import argparse
import csv
import json
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sql", help="query the results lake (DuckDB views over the Parquet tables)",
                       description="Tables: endpoints, configs, campaigns, runs, load_steps, requests_summary, "
                                   "experiments, verdicts, baselines, noise, findings; question views: "
                                   "capacity_by_config, campaign_gain, verdict_history. Reads never block writers.")
    p.add_argument("query", help='SQL, e.g. "SELECT * FROM verdict_history"')
    p.add_argument("--lake", default="out/lake", help="results lake root (default out/lake)")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    p.add_argument("--refresh", action="store_true", help="rebuild the view file first (after new tables appear)")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    import duckdb

    from autoresearch_dagster.results import open_lake
    from autoresearch_dagster.spec import SpecError

    lake = open_lake(args.lake)
    if args.refresh:
        lake.refresh_views()
    con = lake.connect()
    try:
        cur = con.execute(args.query)
        cols = [d[0] for d in cur.description] if cur.description else []
        rows = cur.fetchall() if cols else []
    except duckdb.Error as e:
        raise SpecError(f"query failed: {e}") from None
    finally:
        con.close()
    if args.format == "csv":
        w = csv.writer(sys.stdout)
        w.writerow(cols)
        w.writerows(rows)
    elif args.format == "json":
        print(json.dumps([dict(zip(cols, r)) for r in rows], indent=2, default=str))
    else:
        from autoresearch_dagster.outputs.console import print_table

        print_table(cols, rows)
    return 0
