"""What every engine shares (engines.base): the one drift check and the admin HTTP helpers."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from autoresearch_dagster.engines.base import DRIFT_PREFIX, EngineError, config_drift, http_request, read_server_info


def test_config_drift_names_the_knob_and_the_values():
    drift = config_drift({"max_running_requests": 64, "page_size": 16}, {"max_running_requests": 48})
    assert len(drift) == 2 and all(d.startswith(DRIFT_PREFIX) for d in drift)
    assert "max_running_requests" in drift[0] and "48" in drift[0] and "64" in drift[0]
    assert "page_size" in drift[1] and "not reported" in drift[1]


def test_aliases_and_numbers_resolve_to_the_same_value():
    # the pair that was in dispute: the sglang engine knew bf16 == bfloat16, the harness did not
    resolved = {"chunked_prefill_size": 4096.0, "kv_cache_dtype": "bfloat16"}
    assert config_drift({"chunked_prefill_size": 4096, "kv_cache_dtype": "bf16"}, resolved) == []
    assert config_drift({"kv_cache_dtype": "bf16"}, {"server_args": {"kv_cache_dtype": "bfloat16"}}) == []
    assert config_drift({"kv_cache_dtype": "fp8_e4m3"}, resolved) != []


def test_an_engine_reporting_no_config_has_nothing_to_verify():
    assert config_drift({"page_size": 16}, {}) == []


class _Admin(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's naming
        code, body = {"/server_info": (200, json.dumps({"page_size": 16}).encode())}.get(self.path, (503, b"busy"))
        self.send_response(code)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # noqa: N802
        self.send_response(200 if self.headers.get("X-Key") == "k" else 401)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def admin_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Admin)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_admin_request_returns_status_and_body_and_zero_when_nobody_answers(admin_url):
    assert http_request(admin_url + "/health") == (503, b"busy")
    assert http_request(admin_url + "/flush_cache", method="POST", headers={"X-Key": "k"})[0] == 200
    assert http_request(admin_url + "/flush_cache", method="POST")[0] == 401
    with ThreadingHTTPServer(("127.0.0.1", 0), _Admin) as closed:
        port = closed.server_address[1]
    assert http_request(f"http://127.0.0.1:{port}/health", timeout=2) == (0, b"")


def test_read_server_info_parses_200_and_names_any_other_status(admin_url):
    assert read_server_info(admin_url, timeout=5) == {"page_size": 16}
    with pytest.raises(EngineError, match="answered HTTP 0"):
        read_server_info("http://127.0.0.1:1", timeout=2)


def test_launched_servers_get_a_seed_numpy_accepts():
    from autoresearch_dagster.engines.base import server_seed
    from autoresearch_dagster.engines.sglang import sglang_argv
    from autoresearch_dagster.engines.vllm import vllm_argv

    big = 38591144773089  # a campaign experiment's run seed: vLLM 0.32's CPU worker died on it (np.random.seed)
    assert 0 <= server_seed(big) < 2**32 and server_seed(big) == server_seed(big) and server_seed(7) == 7
    v = vllm_argv(["vllm"], {}, model_path="m", host="h", port=1, seed=big)
    s = sglang_argv(["sglang"], {}, model_path="m", host="h", port=1, seed=big)
    assert int(v[v.index("--seed") + 1]) == server_seed(big) == int(s[s.index("--random-seed") + 1])
