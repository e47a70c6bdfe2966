"""A Kubernetes run is recorded only once its kubeconfig names a cluster that answers (the backend's check_ready):
else one error naming the kubeconfig, no run recorded, nothing left to block the next run. No cluster needed."""

from __future__ import annotations

import shutil

from support.cli import cli, latest
from support.golden_files import REPO

UNREACHABLE = """\
apiVersion: v1
kind: Config
clusters: [{name: gone, cluster: {server: "https://127.0.0.1:1"}}]
contexts: [{name: gone, context: {cluster: gone, user: someone}}]
current-context: gone
users: [{name: someone, user: {token: not-a-secret}}]
"""


def project(tmp_path):
    shutil.copytree(REPO / "stages", tmp_path / "stages", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pipelines.yaml", tmp_path / "pipelines.yaml")
    return tmp_path / "pipelines.yaml"


def test_no_kubeconfig_refuses_the_run_before_it_is_recorded(tmp_path, monkeypatch, capsys):
    config = project(tmp_path)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    assert cli(config, "run", "demo", "--backend", "kubernetes", "--only", "sample") == 2
    err = capsys.readouterr().err
    assert f"no kubeconfig at {tmp_path / 'missing'}" in err and "backends.kubernetes.kubeconfig" in err
    assert latest(config) is None
    assert cli(config, "run", "demo", "--only", "sample") == 0  # the local run after it is not blocked


def test_a_cluster_that_does_not_answer_refuses_the_run_before_it_is_recorded(tmp_path, monkeypatch, capsys):
    config = project(tmp_path)
    (tmp_path / "kubeconfig").write_text(UNREACHABLE)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    assert cli(config, "run", "demo", "--backend", "kubernetes", "--only", "sample") == 1
    err = capsys.readouterr().err
    assert "Kubernetes API, the version look-up before the run" in err and "`kubectl get nodes`" in err
    assert "not-a-secret" not in err
    assert latest(config) is None
