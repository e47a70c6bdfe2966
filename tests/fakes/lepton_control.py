"""Test controls of the Lepton API EMULATOR (tests/fakes/lepton_api.py): `FakeLepton` starts it as a process on
loopback, gives the environment NVIDIA's SDK reads (LEPTON_WORKSPACE_ID/URL/TOKEN) and drives it over its /_fake/
routes. Test code, not NVIDIA's; only the standard library."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

FAKES_DIR = Path(__file__).resolve().parent
WORKSPACE_ID = "emulated"


class FakeLepton:
    def __init__(self, home: Path, token: str = "emulated-token") -> None:
        self.home, self.token = home, token
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> FakeLepton:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "api.json").unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, str(FAKES_DIR / "lepton_api.py"), "--home", str(self.home), "--token", self.token],
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while not (self.home / "api.json").is_file():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the Lepton emulator did not start")
            time.sleep(0.05)
        self.url = json.loads((self.home / "api.json").read_text())["url"]
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)

    def __enter__(self) -> FakeLepton:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def env(self) -> dict[str, str]:
        """What NVIDIA's SDK reads (and HOME, where it keeps its `lep login` records: none here)."""
        return {
            "LEPTON_WORKSPACE_ID": WORKSPACE_ID,
            "LEPTON_WORKSPACE_URL": self.url,
            "LEPTON_WORKSPACE_TOKEN": self.token,
        }

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + "/_fake/" + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"null")

    def settings(self, **values: Any) -> dict[str, Any]:
        return self._call("POST", "settings", values)

    def jobs(self) -> dict[str, dict[str, Any]]:
        return self._call("GET", "jobs")

    def requests(self, clear: bool = False) -> list[list[str]]:
        return self._call("DELETE" if clear else "GET", "requests")

    def release(self, prefix: str = "") -> None:
        self._call("POST", f"release/{prefix}", {})

    def vanish(self, job_id: str) -> None:
        self._call("POST", f"vanish/{job_id}", {})

    def storage(self, folder: str, storage: str = "node-nfs:lepton-shared-fs") -> Path:
        return self.home / "storage" / storage.replace(":", "_") / folder.strip("/")

    def wait_for(self, job_id: str, states: set[str], timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = (self.jobs().get(job_id) or {}).get("state")
            if state in states:
                return state
            time.sleep(0.05)
        raise AssertionError(f"job {job_id} not in {states} after {timeout} s: {self.jobs().get(job_id)}")
