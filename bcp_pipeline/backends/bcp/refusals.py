"""What a saved `check` profile of an org's ACE rules out, before a run is recorded (`run` refuses, `plan` says so):
jobs under a bcprun the probe found missing, NeMo stages whose exact composition the NeMo probe saw refused or left
with a mandatory value unset, and every limit of the ACE it saw (policy.py) that a job breaks."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bcp_pipeline.backends.bcp.nemo_job import nemo_launcher_overrides, nemo_overrides_digest
from bcp_pipeline.backends.bcp.policy import planned_jobs, rendered_jobs, violations
from bcp_pipeline.backends.bcp.render import JobSpec
from bcp_pipeline.backends.contract import Submission
from bcp_pipeline.config.resources import BcpOptions


def profile_refusals(profile: dict[str, Any], submissions: list[Submission], options: BcpOptions, stages_dir: Path,
                     driver: JobSpec | None, *, detach: bool = False) -> list[str]:
    """Each job the profile rules out, named with the difference and the check that found it."""
    where = f"the check of {profile.get('key')} ({checked_when(profile)})"
    found = []
    if (((profile.get("facts") or {}).get("probe") or {}).get("bcprun") or {}).get("present") is False:
        for submission in submissions:
            spec = submission.payload.get("spec") or {}
            if str(spec.get("commandline", "")).startswith("bcprun "):
                found.append(f"{submission.request.label} starts under bcprun, which {where} found missing in jobs "
                             "here")
    found += nemo_refusals(profile, submissions, options, stages_dir, where)
    ace = (profile.get("facts") or {}).get("ace")
    if isinstance(ace, dict):
        found += [f"{violation} (as {where} saw the ACE)" for violation in
                  violations(ace, planned_jobs(rendered_jobs(submissions), driver), detach=detach)]
    return found


def nemo_refusals(profile: dict[str, Any], submissions: list[Submission], options: BcpOptions, stages_dir: Path,
                  where: str) -> list[str]:
    """NeMo stages whose exact composition (image and overrides) the profile's NeMo probe saw refused, or left with
    a mandatory value unset: the job would fail as it starts. A changed stage is not judged."""
    seen = {fact.get("digest"): fact for fact in (profile.get("facts") or {}).get("nemo") or []
            if isinstance(fact, dict)}
    found: list[str] = []
    if not seen:
        return found
    for submission in submissions:
        request = submission.request
        if request.kind != "stage" or request.stage.nemo is None or request.resources("bcp").command:
            continue
        image = (submission.payload.get("spec") or {}).get("image", "")
        fact = seen.get(nemo_overrides_digest(image, nemo_launcher_overrides(request, options, stages_dir)))
        if fact and fact.get("composed") is False:
            found.append(f"{request.label}: the NeMo launcher in {image} refused its overrides when {where} "
                         f"composed them: {fact.get('error') or '(no message)'}")
        elif fact and fact.get("missing"):
            found.append(f"{request.label}: the NeMo launcher in {image} leaves {', '.join(fact['missing'])} unset "
                         f"(???) with its overrides, as {where} composed them")
    return found


def checked_when(profile: dict[str, Any]) -> str:
    checked = profile.get("checked_at")
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(checked)) if isinstance(checked, (int, float)) else "?"
