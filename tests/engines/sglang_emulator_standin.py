"""A stand-in for ``python -m sglang.launch_server`` (tests only): the emulator's HTTP server impersonating
SGLang (its /health, /server_info, /metrics, /start_profile and /stop_profile follow SGLang 0.5.23), launched
with the SGLang runner's flags. The knob flags become the emulated server config; ``--emulate-endpoint
SPEC`` names the endpoint whose model and GPU it emulates. Logs a line per admin call, as a server log."""
from __future__ import annotations

import sys

from autoresearch_dagster.emulator.noise import NoiseSettings
from autoresearch_dagster.emulator.server import EmulatorServer, serve
from autoresearch_dagster.spec import KNOBS, load_endpoint, validate_server_config
from autoresearch_dagster.tinymodel import build_arg_parser


def main(argv: list[str] | None = None) -> int:
    p = build_arg_parser()
    p.add_argument("--emulate-endpoint", required=True)
    args = p.parse_args(argv)
    config = validate_server_config({k: getattr(args, k) for k in KNOBS if getattr(args, k) is not None})
    endpoint = load_endpoint(args.emulate_endpoint)
    server = EmulatorServer(endpoint, config, seed=args.random_seed, noise=NoiseSettings.off(),
                            model_name=args.served_model_name or args.model_path)

    def ready(url: str) -> None:
        print(f"emulated SGLang server for {endpoint.model} serving on {url} (config {config})", flush=True)

    serve(server, args.host, args.port, on_ready=ready)
    print("emulated SGLang server stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
