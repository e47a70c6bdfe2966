"""The ACE's limits against the jobs a run will submit: read once from the service, checked by policy.py.

`run` refuses a pipeline the ACE would refuse (or, with --detach, deadlock) before it records a run; `plan` shows
the same check when the credentials are there, and says it did not check when they are not (plan needs nothing).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bcp_pipeline.backends.bcp.connect import (NOTHING_DONE, check_credentials, choose_transport, make_transport,
    read_ngc_config)
from bcp_pipeline.backends.bcp.policy import Violation, planned_jobs, violations
from bcp_pipeline.backends.bcp.render import JobSpec, job_spec
from bcp_pipeline.backends.bcp.transport import Transport, retry_policy
from bcp_pipeline.backends.contract import JobRequest
from bcp_pipeline.backends.retries import RetryPolicy, with_retries
from bcp_pipeline.config.resources import BcpOptions
from bcp_pipeline.errors import BackendCallError, ConfigError

PLAN_RETRIES = RetryPolicy(attempts=2, backoff=1.0, max_wait=2.0)  # `plan`'s look-up of the ACE


@dataclass(kw_only=True)
class AceCheck:
    """What checking a pipeline's jobs against the ACE found; `checked` False: why not, in `reason`."""

    ace: str | None
    checked: bool
    reason: str = ""
    violations: list[Violation] = field(default_factory=list)

    def as_json(self) -> dict:
        return {"ace": self.ace, "checked": self.checked, "reason": self.reason or None,
                "violations": [str(v) for v in self.violations]}

    def lines(self) -> list[str]:
        """For people: one line when all is well or nothing was checked, else one per violation."""
        if not self.checked:
            return [f"ACE limits not checked: {self.reason}"]
        if not self.violations:
            return [f"ACE {self.ace}: every job fits its limits"]
        return [f"ACE {self.ace} does not allow {len(self.violations)} of what this pipeline asks:",
                *(f"  {v}" for v in self.violations)]


def configured_ace(options: BcpOptions, environ: Mapping[str, str] | None = None) -> str | None:
    """The ACE jobs go to: pipelines.yaml, else NGC_CLI_ACE, else `ngc config`'s."""
    env = dict(os.environ if environ is None else environ)
    return options.ace or env.get("NGC_CLI_ACE") or read_ngc_config(env).get("ace") or None


def check_ace(options: BcpOptions, stages_dir: Path, requests: Iterable[JobRequest], *, detach: bool,
              driver: JobSpec | None = None, transport: Transport | None = None,
              policy: RetryPolicy | None = None) -> AceCheck:
    """Read the ACE (retried while the API is busy) and check every job against it, the --detach `driver` job
    too. BackendCallError when the ACE cannot be read: `job run` reads it too before it submits, so a run could
    not start either."""
    name = configured_ace(options)
    if not name:
        return AceCheck(ace=None, checked=False, reason="no ACE is configured")
    jobs = planned_jobs([(r, job_spec(r, options, stages_dir)) for r in requests], driver)
    client = transport or make_transport(options)
    ace = with_retries(lambda: client.ace(name), f"reading the limits of ACE {name}", policy or retry_policy(options))
    return AceCheck(ace=name, checked=True, violations=violations(ace, jobs, detach=detach))


def refuse_violations(check: AceCheck, pipeline: str) -> None:
    """A ConfigError naming each job the ACE would refuse, its limit and the `--set` that fixes it."""
    if check.violations:
        raise ConfigError(f"pipeline {pipeline}: " + "\n".join(check.lines())
                          + f"\n{NOTHING_DONE}")


def plan_check(options: BcpOptions, stages_dir: Path, requests: Iterable[JobRequest], *, detach: bool,
               driver: JobSpec | None = None) -> AceCheck:
    """`plan`'s view: the check when a transport and credentials are there, else why it was not made."""
    try:
        choose_transport(options)
        check_credentials(options)
        # One quick retry only: a plan is a preview, and one that waits out run's whole back-off for an API that
        # cannot be reached says no more than "not checked" a few seconds sooner would.
        return check_ace(options, stages_dir, requests, detach=detach, driver=driver, policy=PLAN_RETRIES)
    except (ConfigError, BackendCallError) as exc:
        # `run`'s refusals end in "Nothing was submitted or recorded"; plan never submits, so that says nothing here
        reason = " ".join(str(exc).replace(f". {NOTHING_DONE}", "").split())
        return AceCheck(ace=configured_ace(options), checked=False, reason=reason)
