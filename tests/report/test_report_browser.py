"""`bcp-pipeline report` as a person sees it: the report of a finished demo run (the real pipeline on the local
backend, 12 training steps), opened in a real headless Chromium (Debian's `chromium`, driven by Playwright over
the DevTools protocol; no browser is downloaded). Checks the timeline and loss chart plotly drew, with the run's
jobs and steps, no console errors, no network request, and a screenshot that is not blank. Also: the report of a
failed run, secrets kept out, and the message when the `report` extra is missing.

One demo run serves the whole module (about 30 s on 2 cores). Skipped, with the reason, where Chromium, Playwright,
plotly or megatron-core (the demo's pretrain) is not installed; `scripts/setup --test` installs all four (Chromium
with apt-get, as root).
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from support.pipeline_fixtures import write_chain_project

from bcp_pipeline.cli.main import main
from bcp_pipeline.engine.state import RunStore

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
STEPS = 12
SECRET_KEY = "nvapi-report-test-0123456789"  # an API key in the environment, as a user of BCP has one


def report_data_of(html: str) -> dict:
    """The data the page was drawn from (embedded as JSON for tools and tests)."""
    match = re.search(r'<script type="application/json" id=report-data>(.*?)</script>', html, re.S)
    assert match, "the report has no embedded data"
    return json.loads(match.group(1).replace("<\\/", "</"))


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory) -> tuple[Path, RunStore]:
    pytest.importorskip("plotly", reason="the report's charts need the `report` extra (plotly)")
    pytest.importorskip("megatron.core", reason="the demo's smoke pretrain needs the [pretrain] extra")
    project = tmp_path_factory.mktemp("demo")
    shutil.copytree(REPO / "stages", project / "stages", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pipelines.yaml", project / "pipelines.yaml")
    config = str(project / "pipelines.yaml")
    assert (
        main(
            [
                "--config",
                config,
                "run",
                "demo",
                "--set",
                f"vars.steps={STEPS}",
                "--set",
                "pretrain.args=[--data-dir, '${data}/preprocessed', --results, '${workspace}/results', "
                "--run-name, '${train_run}', --steps, '${steps}', --checkpoint-every, '6', --hidden, '64']",
            ]
        )
        == 0
    )
    out = project / "report.html"
    assert main(["--config", config, "report", "--out", str(out)]) == 0
    return out, RunStore(project / ".bcp-pipeline")


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).is_file():
        pytest.skip(
            f"{CHROMIUM} is not installed (scripts/setup --test installs Debian's chromium as root "
            "where apt-get exists)"
        )
    sync_api = pytest.importorskip("playwright.sync_api", reason="the browser test drives Chromium with playwright")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


def test_the_report_of_the_demo_run_renders_its_jobs_and_steps_in_chromium(demo_report, browser, tmp_path):
    path, store = demo_report
    state = store.latest()
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems, requests = [], []
    page.on(
        "console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None
    )
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    page.route(
        "**/*",
        lambda route: (
            (requests.append(route.request.url), route.abort())
            if not route.request.url.startswith("file://")
            else route.continue_()
        ),
    )
    page.goto(path.as_uri())
    page.wait_for_selector("#chart-timeline .bars path", state="attached")
    page.wait_for_selector("#chart-loss-pretrain .scatterlayer path.js-line", state="attached")

    # The timeline: one row per job of the run, each with a bar plotly drew.
    traces = page.evaluate(
        "() => document.getElementById('chart-timeline').data.map(t => ({name: t.name, y: t.y, x: t.x}))"
    )
    jobs = [job.job_id for stage in state.stages.values() for job in stage.jobs]
    assert len(jobs) == 22  # 11 stages, each a stage job and a verification job
    running = [label for t in traces if t["name"] != "queued" for label in t["y"]]
    assert sorted(running) == sorted(jobs)
    drawn = page.evaluate("() => document.querySelectorAll('#chart-timeline .bars .point path').length")
    assert drawn >= len(jobs)
    labels = page.evaluate(
        "() => [...document.querySelectorAll('#chart-timeline .yaxislayer-above text')].map(t => t.textContent)"
    )
    assert sorted(labels) == sorted(jobs)

    # The loss chart: the run's steps, 1..12, and a line drawn through them.
    loss = page.evaluate("() => document.getElementById('chart-loss-pretrain').data.map(t => ({x: t.x, y: t.y}))")
    # Beside it, the held-out loss of the evaluate stage: the one checkpoint of the schedule (every 20 steps and
    # the last) at step 12.
    assert [list(t["x"]) for t in loss] == [list(range(1, STEPS + 1)), [STEPS]]
    assert 0 < loss[1]["y"][0] < loss[0]["y"][0]
    assert 9 < loss[0]["y"][0] < 12 and loss[0]["y"][-1] < loss[0]["y"][0]  # GPT-2 vocabulary: ~ln(50257) at first
    line = page.evaluate(
        "() => document.querySelector('#chart-loss-pretrain .scatterlayer path.js-line').getAttribute('d')"
    )
    assert line.count("L") >= STEPS - 1

    assert problems == [] and requests == []
    shot = page.screenshot(full_page=True)
    (tmp_path / "report.png").write_bytes(shot)
    assert pixel_variance(browser, shot) > 100, "the screenshot is blank"
    page.close()


def pixel_variance(browser, png: bytes) -> float:
    """Variance of the grey levels of a PNG, decoded by the browser itself (a blank page gives 0)."""
    page = browser.new_page()
    try:
        return page.evaluate(
            """async (b64) => {
            const img = new Image(); img.src = 'data:image/png;base64,' + b64; await img.decode();
            const canvas = document.createElement('canvas'); canvas.width = img.width; canvas.height = img.height;
            const ctx = canvas.getContext('2d'); ctx.drawImage(img, 0, 0);
            const d = ctx.getImageData(0, 0, img.width, img.height).data;
            let n = 0, sum = 0, squares = 0;
            for (let i = 0; i < d.length; i += 4) {
                const v = (d[i] + d[i+1] + d[i+2]) / 3; sum += v; squares += v * v; n++;
            }
            const mean = sum / n; return squares / n - mean * mean; }""",
            base64.b64encode(png).decode(),
        )
    finally:
        page.close()


def test_a_blank_screenshot_is_recognised_as_blank(browser):
    """The check above can fail: a white page has no variance."""
    page = browser.new_page(viewport={"width": 400, "height": 300})
    page.set_content("<html><body style='background:#fff'></body></html>")
    assert pixel_variance(browser, page.screenshot()) == 0
    page.close()


def test_the_report_keeps_every_command_and_the_data_of_the_demo_run(demo_report):
    path, store = demo_report
    state = store.latest()
    data = report_data_of(path.read_text())
    assert data["run"]["status"] == "succeeded"
    assert {c["job_id"]: c["source"] for c in data["commands"]} == {
        job.job_id: "recorded at submission" for stage in state.stages.values() for job in stage.jobs
    }
    pretrain = next(c for c in data["commands"] if c["job_id"] == "pretrain.1")
    assert "pretrain_local.py" in pretrain["text"] and f"--steps {STEPS}" in pretrain["text"]
    verified = {s["stage"]: [c["found"] for c in s["checks"]] for s in data["stages"]}
    assert verified["download"] == [8] and verified["concat"] == [2]
    assert all(row["queued_s"] >= 0 and row["running_s"] > 0 for row in data["timeline"])


def test_the_report_of_a_failed_run_shows_the_failure_and_keeps_secrets_out(tmp_path, monkeypatch, capsys):
    pytest.importorskip("plotly", reason="the report's charts need the `report` extra (plotly)")
    monkeypatch.setenv("NGC_CLI_API_KEY", SECRET_KEY)
    config = write_chain_project(tmp_path)
    (tmp_path / "ws" / "main" / "second").mkdir(parents=True)
    (tmp_path / "ws" / "main" / "second" / "FAIL-item-0001.txt").write_text("")
    # The environment's key, copied into a plain env: value (a credential under a secret name is refused at load:
    # tests/config/test_secret_env.py).
    env = f"second.local.env={{ECHO: {SECRET_KEY}}}"
    assert main(["--config", str(config), "run", "chain", "--set", env]) == 1
    assert main(["--config", str(config), "report"]) == 0
    path = Path(capsys.readouterr().out.strip().rsplit(": ", 1)[1])
    html = path.read_text()
    data = report_data_of(html)
    assert data["run"]["status"] == "failed"
    assert [s["status"] for s in data["stages"]] == ["succeeded", "failed", "pending"]
    assert "item-0001.txt" in data["stages"][1]["error"] and data["training"] == []
    assert [row["state"] for row in data["timeline"]] == ["succeeded", "succeeded", "failed"]
    assert "No training log" in html and "chart-timeline" in html
    second = next(c for c in data["commands"] if c["stage"] == "second")
    assert "ECHO=<redacted>" in second["text"]
    kept = [html, *(p.read_text() for p in (tmp_path / ".bcp-pipeline").rglob("submitted/*.txt"))]
    assert all(SECRET_KEY not in text for text in kept)


def test_without_the_report_extra_report_names_the_extra_to_install(tmp_path, monkeypatch, capsys):
    config = write_chain_project(tmp_path)
    assert main(["--config", str(config), "run", "chain", "--only", "first"]) == 0
    capsys.readouterr()
    monkeypatch.setitem(sys.modules, "plotly", None)  # `import plotly` now raises ImportError
    monkeypatch.setitem(sys.modules, "plotly.graph_objects", None)
    monkeypatch.setitem(sys.modules, "plotly.io", None)
    assert main(["--config", str(config), "report"]) == 1
    error = capsys.readouterr().err
    assert "pip install 'bcp-pipeline[report]'" in error and "plotly" in error
    assert not list((tmp_path / ".bcp-pipeline").rglob("report.html"))


def test_status_shows_the_training_stages_step_time_and_tokens_per_second(demo_report, capsys):
    """Without a declared CPU peak the demo's CPU training shows no MFU, and says why."""
    path, _ = demo_report
    capsys.readouterr()
    assert main(["--config", str(path.parent / "pipelines.yaml"), "status"]) == 0
    line = next(
        line for line in capsys.readouterr().out.splitlines() if line.startswith("pretrain: ") and "s/step" in line
    )
    assert re.fullmatch(
        r"pretrain: [\d.]+ s/step, [\d,]+ tokens/s \(median of 11 logged step\(s\) of job "
        r"pretrain\.1, the first left out\); no MFU: the smoke pretrain ran on CPU and the "
        r"pipeline declares no CPU peak \(estimates\.cpu_peak_tflops\)",
        line,
    ), line


def test_profile_demo_gives_a_trace_and_its_report_draws_step_time_mfu_and_the_timer_breakdown(
    demo_report, browser, capsys
):
    """`profile demo` on the demo run's data: a Chrome trace, a top-operators table, and a report whose step
    time, tokens/s and MFU charts and timer bars Chromium draws; MFU against the CPU peak declared here (10
    TFLOP/s, a figure of this test, not a measurement), and the report says it is declared."""
    path, _ = demo_report
    project = path.parent
    config = project / "pipelines.yaml"
    text = config.read_text()
    anchor = "    workspace: {name: demo, mount: /mount_workspace}\n"
    assert anchor in text
    # Far above what 2 cores reach (about 0.15 TFLOP/s on this model, idle), so MFU is a fraction however fast the
    # machine runs: 0.1 gave MFU over 1 on an idle machine.
    config.write_text(text.replace(anchor, anchor + "    estimates: {cpu_peak_tflops: 10}\n"))
    capsys.readouterr()
    assert main(["--config", str(config), "profile", "demo", "--steps", "2:4"]) == 0
    out = capsys.readouterr().out
    # The profile trains a model of its own: the demo's `demo-gpt-<run id>` with the profile suffix.
    [profiled] = (project / ".bcp-pipeline" / "workspaces" / "demo" / "results").glob("demo-gpt-*-profile")
    trace = json.loads((profiled / "profile" / "trace_rank0.json").read_text())
    assert {"step 2", "step 3", "step 4"} <= {event.get("name") for event in trace["traceEvents"]}
    assert "aten::" in (profiled / "profile" / "top_ops_rank0.txt").read_text()
    assert not (profiled / "checkpoints").exists() or list((profiled / "checkpoints").glob("*.pt")) == []
    report = Path(re.search(r"profile report \(.*\): (\S+)", out).group(1))
    run_id = re.search(r"^profile run (\S+): stage pretrain, steps 2:4", out, re.M).group(1)
    assert report == project / ".bcp-pipeline" / "profiles" / run_id / "report.html"
    assert re.search(
        r"^measured: [\d.]+ s/step, [\d,]+ tokens/s, MFU [\d.]+% \(median after the first step\)", out, re.M
    )
    assert main(["--config", str(config), "status", run_id]) == 0  # found among the profile runs
    assert f"run {run_id}  pipeline demo" in capsys.readouterr().out

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems = []
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    page.goto(report.as_uri())
    for chart in ("step-s", "tokens-per-s", "mfu"):
        page.wait_for_selector(f"#chart-{chart}-pretrain .scatterlayer path.js-line", state="attached")
    page.wait_for_selector("#chart-timers-pretrain .bars path", state="attached")
    steps = page.evaluate("() => document.getElementById('chart-step-s-pretrain').data[0].x")
    assert list(steps) == [1, 2, 3, 4, 5]  # max_steps one past the window's last step
    mfu = page.evaluate("() => document.getElementById('chart-mfu-pretrain').data[0].y")
    assert all(0 < value < 1 for value in mfu), mfu
    timers = page.evaluate("() => document.getElementById('chart-timers-pretrain').data.map(t => t.name)")
    assert timers == ["forward-compute", "backward-compute", "optimizer"]
    bars = page.evaluate("() => document.querySelectorAll('#chart-timers-pretrain .bars .point path').length")
    assert bars == 3 * 5
    summary = page.inner_text("#throughput-pretrain")
    assert "s/step" in summary and "tokens/s" in summary and "MFU" in summary
    assert "declared 10 TFLOP/s" in summary
    assert problems == []
    page.close()
