"""A job's page on NVIDIA's UI is shown only for jobs of NVIDIA's service: on the emulator (or any NGC_CLI_API_URL
that is not NVIDIA's) `status` and `run --detach` linked `https://bc.ngc.nvidia.com/jobs/3000003`, a page of
someone else's job, or of none (issue 50, item 12)."""

from __future__ import annotations

import pytest
from support.pipeline_fixtures import REPO

from bcp_pipeline.backends.registry import make_backend
from bcp_pipeline.config.load import load_config


def bcp_backend(tmp_path, *overrides: str):
    config = load_config(REPO / "pipelines.yaml", overrides=list(overrides), pipeline="demo")
    return make_backend("bcp", config, config.pipeline("demo"), tmp_path / "runs" / "demo-RUN")


@pytest.mark.parametrize("api", [None, "https://api.ngc.nvidia.com", "https://api.stg.ngc.nvidia.com:443/"])
def test_a_job_of_nvidia_s_service_links_its_page(tmp_path, monkeypatch, api):
    if api is None:
        monkeypatch.delenv("NGC_CLI_API_URL", raising=False)
    else:
        monkeypatch.setenv("NGC_CLI_API_URL", api)
    assert bcp_backend(tmp_path).job_url("3000003") == "https://bc.ngc.nvidia.com/jobs/3000003"


@pytest.mark.parametrize("api", ["https://127.0.0.1:36519", "https://ngc.example.org", "https://nvidia.com.evil.io"])
def test_a_job_of_another_service_gets_no_link_to_nvidia_s_ui(tmp_path, monkeypatch, api):
    monkeypatch.setenv("NGC_CLI_API_URL", api)
    assert bcp_backend(tmp_path).job_url("3000003") is None


def test_a_ui_url_the_config_gives_is_kept_whatever_the_service(tmp_path, monkeypatch):
    monkeypatch.setenv("NGC_CLI_API_URL", "https://127.0.0.1:36519")
    backend = bcp_backend(tmp_path, "backends.bcp.ui_url=https://127.0.0.1:36519/ui/{job_id}")
    assert backend.job_url("3000003") == "https://127.0.0.1:36519/ui/3000003"
