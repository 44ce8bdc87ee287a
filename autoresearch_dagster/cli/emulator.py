"""Owns `autoresearch emulator ...`: the embedded SGLang emulator's commands.

``serve`` (EMU-HTTP) runs the emulator's real-time OpenAI-compatible HTTP server until SIGINT or
SIGTERM. Other subcommands (``grid``; ``calibrate`` and ``errors``; ``fit-device``; ``fit-profiles``) are registered
by their modules beside it.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from autoresearch_dagster.spec import SpecError, load_endpoint, load_server_config


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("emulator", help="the embedded SGLang emulator: serve it over HTTP, grid search, "
                                                "calibrate it, its error report, fit a GPU to a device probe, fit engine profiles",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="emulator_cmd", metavar="COMMAND", required=True)
    _register_serve(sub)
    from autoresearch_dagster.cli.emulator_grid import register_grid  # the emulator core's `grid`

    register_grid(sub)
    from autoresearch_dagster.cli.emulator_calibrate import register_calibrate

    register_calibrate(sub)
    from autoresearch_dagster.cli.emulator_fit_device import register_fit_device

    register_fit_device(sub)
    from autoresearch_dagster.cli.emulator_fit_profiles import register_fit_profiles

    register_fit_profiles(sub)


# ---------------------------------------------------------------------- serve (EMU-HTTP)

def _register_serve(sub: Any) -> None:
    sp = sub.add_parser(
        "serve", help="serve an endpoint's emulated SGLang server over HTTP (OpenAI API + SGLang admin)",
        description="Serve the emulated SGLang server of an endpoint in real time: /v1/chat/completions, "
                    "/v1/completions, /v1/models, /health, /server_info, /flush_cache, /metrics, /start_profile, "
                    "/stop_profile. Prints the base URL (without /v1) once listening; stops on SIGINT/SIGTERM.")
    sp.add_argument("--endpoint", required=True, help="endpoint spec YAML (model, hardware, server config)")
    sp.add_argument("--config", help="server config file to emulate instead of the endpoint's server_config")
    sp.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    sp.add_argument("--port", type=int, required=True, help="port to listen on (0: any free port)")
    sp.add_argument("--seed", type=int, default=0, help="seed of the engine noise and generated text (default 0)")
    sp.add_argument("--model-name", help="served model name (default: the endpoint's model)")
    sp.add_argument("--no-noise", action="store_true", help="turn the emulator's run-to-run noise off")
    sp.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from autoresearch_dagster.emulator.noise import NoiseSettings
    from autoresearch_dagster.emulator.server import EmulatorServer, serve

    if not 0 <= args.port <= 65535:
        raise SpecError(f"--port must be between 0 and 65535, got {args.port}")
    endpoint = load_endpoint(args.endpoint)
    config = load_server_config(args.config) if args.config else None
    server = EmulatorServer(endpoint, config, seed=args.seed, model_name=args.model_name,
                            noise=NoiseSettings.off() if args.no_noise else None)

    def ready(url: str) -> None:
        print(url, flush=True)
        print(f"serving {endpoint.name} ({endpoint.model} on {endpoint.gpus}x {endpoint.hardware.gpu}) "
              f"at {url}/v1; Ctrl-C to stop", file=sys.stderr, flush=True)

    try:
        serve(server, args.host, args.port, on_ready=ready)
    except OSError as e:
        raise SpecError(f"cannot listen on {args.host}:{args.port}: {e}") from None
    return 0
