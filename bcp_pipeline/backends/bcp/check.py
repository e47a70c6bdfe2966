"""Checks of a Base Command Platform org and ACE: first a few look-ups through the configured transport (NVIDIA's
ngc CLI or ngcsdk), all that `--no-jobs` does; then, by default, the probe jobs of probe.py.

Credentials and the key's org; the team; the ACE, and every job of the pipeline against its instances and limits
(admission.py, the driver too with --detach); each image; each workspace with the user's quota; the secrets the jobs
name (names and key names only); the client's version. A look-up that fails for a reason other than "not there" or
"refused" is "could not check", with the reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from bcp_pipeline.backends.bcp.account import account_of
from bcp_pipeline.backends.bcp.admission import PlannedJob, planned_jobs, rendered_jobs, violations
from bcp_pipeline.backends.bcp.connect import SCOPED_KEY_PREFIX, configured_api_key, make_transport, scoped_key_org
from bcp_pipeline.backends.bcp.transport import CONFIG_HINT, SDK_VERSION, Transport
from bcp_pipeline.backends.checks import CheckInput, CheckOutcome, Row, different, ok, unchecked
from bcp_pipeline.backends.contract import job_label
from bcp_pipeline.errors import BackendCallError, PipelineError, is_not_found, is_refused_credentials

VERSION = re.compile(r"\b\d+\.\d+\.\d+\b")
HTTP_ANSWER = re.compile(r"\b([45]\d\d) (?:Client|Server) Error: ([A-Za-z ]+?)(?= for url|$|:|\.)")
NO_VERSION_COMMAND = "invalid choice: 'version'"


@dataclass(kw_only=True)
class Account:
    org: str
    team: str | None
    ace: str


def account(ctx: CheckInput) -> Account:
    """org/team/ACE as the backend resolves them (account.py: pipelines.yaml, NGC_CLI_*, ngc's config)."""
    org, team, ace = account_of(ctx.config.options["bcp"], ctx.environ)
    return Account(org=org or "(no org)", team=team, ace=ace or "(no ACE)")


def check_bcp(ctx: CheckInput) -> CheckOutcome:
    who = account(ctx)
    target = {"org": who.org, "ace": who.ace, **({"team": who.team} if who.team else {})}
    transport = make_transport(ctx.config.options["bcp"])
    jobs = planned_jobs(rendered_jobs(ctx.submissions()), ctx.detach_driver if ctx.detach else None)
    credentials, answer = credentials_row(transport, who, configured_api_key(ctx.environ))
    if credentials.verdict.value == "different":
        return outcome(target, [credentials])  # every other call in that org would be refused the same way
    rows: list[Row | None] = [credentials, team_row(who, answer)]  # a row is None where it does not apply
    ace_row_, ace_data = ace_row(transport, who)
    rows.append(ace_row_)
    facts: dict = {"transport": transport.name}
    if ace_data is not None:
        rows += policy_rows(ace_data, jobs, ctx.detach)
        facts.update(ace_facts(ace_data))
    rows += [
        image_row(transport, jobs),
        workspace_row(transport, jobs, who.ace),
        secrets_row(transport, jobs),
        version_row(transport),
    ]
    notes: list[str] = []
    blocking = [
        r.topic
        for r in rows
        if r is not None and r.topic in ("credentials", "image", "workspace") and r.verdict.value == "different"
    ]
    if ctx.jobs and blocking:
        rows.append(
            unchecked(
                "probe job",
                "a probe job shows how jobs run here",
                f"not submitted: it would fail on what the {', '.join(blocking)} row(s) show",
                "fix those, then run `check` again",
            )
        )
    elif ctx.jobs and ace_data is not None:
        from bcp_pipeline.backends.bcp.probe import run_probes

        probe_rows, probe_facts = run_probes(ctx, transport, ace_data, notes)
        rows += probe_rows
        facts.update(probe_facts)
    elif ctx.jobs:
        rows.append(unchecked("probe job", "a probe job shows how jobs run here", "no ACE to run it in (above)"))
    return outcome(target, [r for r in rows if r is not None], facts, notes)


def outcome(
    target: dict[str, str], rows: list[Row], facts: dict | None = None, notes: list[str] | None = None
) -> CheckOutcome:
    """The check of an org's ACE: its profile is named after both."""
    return CheckOutcome(
        target=target, profile_parts=(target["org"], target["ace"]), rows=rows, facts=facts or {}, notes=notes or []
    )


MASKED_KEY = re.compile(r"\s*Using API key: '[^']*'[^.]*\.?", re.I)  # ngcsdk shows the key's last characters


def _answer(exc: BaseException) -> str:
    """A failed call in a few words: the HTTP status and its name where the error carries them (`401
    Unauthorized`), else its first line (ngc's error text runs to the URL, the client's usage, ...)."""
    text = _reason(exc)
    found = HTTP_ANSWER.search(text)
    return f"{found.group(1)} {found.group(2)}" if found else text.split(" usage: ")[0][:120]


def _reason(exc: BaseException) -> str:
    """The error in one line, without the transport's generic hint about ngc's settings and without any part of
    the key (the row is saved in the profile)."""
    return " ".join(MASKED_KEY.sub("", str(exc).replace(CONFIG_HINT, "")).split())[:300]


def credentials_row(transport: Transport, who: Account, key: str) -> tuple[Row, dict | None]:
    """The key and the org it may act in; `user who`'s answer too (None when it failed), for the team row.

    A legacy API key acts in every org its user has a role in. A personal or service key (nvapi-) acts in the one
    org it was made for: the key service names it (`user who` shows what it says of a personal key; ngcsdk asks it
    for a service key, of which `user who` shows nothing)."""
    assumes = f"the API key is accepted and may act in org {who.org}"
    scoped = key.startswith(SCOPED_KEY_PREFIX)
    try:
        answer = transport.who()
    except BackendCallError as exc:
        if is_refused_credentials(exc):  # ngcsdk refuses an org the key has no role in before any call
            key_org = scoped_key_org(key) if scoped else None
            return different(
                "credentials",
                assumes,
                f"{'an nvapi- key' if scoped else 'the key'}: refused: {_reason(exc)}",
                _other_org_fix(who.org, key_org),
            ), None
        return unchecked("credentials", assumes, f"`user who` failed: {_reason(exc)}"), None
    user = found if isinstance(found := answer.get("user"), dict) else {}
    if scoped:
        return _scoped_key_row(assumes, who, key, answer, user), answer
    orgs = sorted({str((r.get("org") or {}).get("name")) for r in user.get("roles") or [] if isinstance(r, dict)})
    showed = f"key of user {user.get('name', '?')}; its orgs: {', '.join(orgs) or 'none listed'}"
    if who.org in orgs:
        return ok("credentials", assumes, showed), answer
    return different(
        "credentials",
        assumes,
        showed,
        f"every call in org {who.org} would be refused: set backends.bcp.org (or NGC_CLI_ORG) to one of "
        f"{', '.join(orgs) or 'the key’s orgs'}, or use a key of {who.org}; nothing else was checked",
    ), answer


def _scoped_key_row(assumes: str, who: Account, key: str, answer: dict, user: dict) -> Row:
    personal = answer.get("type") == "PERSONAL_KEY" or (answer.get("type") is None and bool(user))
    key_org = str(answer.get("orgName") or "") or scoped_key_org(key)
    showed = (
        f"a personal key (nvapi-) of user {user.get('name', '?')}" if personal else "a service key (nvapi-), of no user"
    ) + f", made for org {key_org or '(not stated)'}"
    if key_org is None:
        return unchecked(
            "credentials", assumes, showed, f"such a key works in one org: the ACE row shows whether it is {who.org}"
        )
    if key_org != who.org:
        return different("credentials", assumes, showed, _other_org_fix(who.org, key_org))
    return ok(
        "credentials",
        assumes,
        showed,
        "" if personal else "a service key has no user: the team row and the storage quota cannot be read for it",
    )


def _other_org_fix(org: str, key_org: str | None) -> str:
    if key_org and key_org != org:
        return (
            f"the key works in org {key_org} only: set backends.bcp.org: {key_org} (or NGC_CLI_ORG={key_org}), "
            f"or use a key made in org {org}; nothing else was checked"
        )
    return (
        "set a key of that org (NGC_CLI_API_KEY or `ngc config set`), or set backends.bcp.org (or NGC_CLI_ORG) "
        "to the key's org; nothing else was checked"
    )


def team_row(who: Account, answer: dict | None) -> Row:
    assumes = "jobs run in the configured team (or in the org, with no team)"
    if not who.team:
        return ok("team", assumes, "no team configured: jobs run in the org")
    if answer is None:
        return unchecked("team", assumes, "`user who` failed (the credentials row)")
    user = answer.get("user") if isinstance(answer.get("user"), dict) else None
    if user is None:
        return unchecked(
            "team",
            assumes,
            f"team {who.team}; the key has no user whose roles would name teams (a service key)",
            "a job in a team the key may not use is refused at submission",
        )
    teams = sorted(
        {
            str((r.get("team") or {}).get("name"))
            for r in user.get("roles") or []
            if isinstance(r, dict) and isinstance(r.get("team"), dict)
        }
    )
    if who.team in teams:
        return ok("team", assumes, f"team {who.team} is among the key's teams")
    return different(
        "team",
        assumes,
        f"team {who.team}; the key's roles name teams: {', '.join(teams) or 'none'}",
        "jobs and workspaces of that team may be refused: set backends.bcp.team to one of those, or leave it unset",
    )


def ace_row(transport: Transport, who: Account) -> tuple[Row, dict | None]:
    assumes = f"ACE {who.ace} exists in org {who.org} and this key may use it"
    try:
        data = transport.ace(who.ace)
    except BackendCallError as exc:
        if is_not_found(exc) or is_refused_credentials(exc):
            return different(
                "ace",
                assumes,
                _reason(exc),
                "set backends.bcp.ace (or NGC_CLI_ACE) to an ACE of the org: `ngc base-command ace list`",
            ), None
        return unchecked("ace", assumes, f"`ace info` failed: {_reason(exc)}"), None
    ace = found if isinstance(found := data.get("ace"), dict) else data
    instances = [str(i.get("name")) for i in ace.get("instances") or [] if isinstance(i, dict)]
    return ok("ace", assumes, f"ACE {ace.get('name', who.ace)}: {len(instances)} instance type(s)"), ace


def ace_facts(ace: dict) -> dict:
    """The ACE as `ace info` answered (limits and instances; not its storage endpoints), for the backend to hold
    jobs against (admission.py) and to wait out its termination grace without asking again."""
    return {"ace": {key: value for key, value in ace.items() if key not in ("storageServiceConfig",)}}


INSTANCE_LIMITS = ("instances", "allowMultinode", "allowMultinodePreemptable", "multiNodeSupportedArrayTypes")


def policy_rows(ace: dict, jobs: list[PlannedJob], detach: bool) -> list[Row]:
    """admission.py's violations of this ACE, as two rows: the instances (multi-node, array types) and the limits
    (runtime, replicas, active jobs; the driver's needs with --detach)."""
    if not jobs:
        return []
    found = violations(ace, [replace(j, continues="") for j in jobs], detach=detach)
    offered = [str(i.get("name")) for i in ace.get("instances") or [] if isinstance(i, dict)]
    used = sorted({job.spec.instance for job in jobs})
    limits = {
        key: ace.get(key)
        for key in ("maxRuntimeSeconds", "maxAllowedReplicas", "maxActiveJobsPerUser")
        if ace.get(key) is not None
    }
    rows = []
    for topic, instance_kind, assumes, showed_ok, todo in (
        (
            "instances",
            True,
            "every job's instance is in the ACE, multi-node (and its array type) allowed where replicas > 1",
            f"{', '.join(used)}: in the ACE, as each job uses it",
            "the jobs are refused at submission",
        ),
        (
            "ace limits",
            False,
            "every job fits the ACE's maxRuntimeSeconds, maxAllowedReplicas and "
            "maxActiveJobsPerUser"
            + (" (with the --detach driver)" if detach else "")
            + (" (a streamed edge's jobs at once)" if any(j.streams_from for j in jobs) else ""),
            "; ".join(f"{k} {v}" for k, v in limits.items()) or "the ACE states no limits",
            "NVIDIA's client or the scheduler refuses (or never starts) them",
        ),
    ):
        mine = [v for v in found if (v.limit in INSTANCE_LIMITS) == instance_kind]
        if mine:
            rows.append(
                different(
                    topic,
                    assumes,
                    _grouped(mine) + (f" (the ACE offers: {', '.join(offered)})" if instance_kind else ""),
                    f"{todo}: " + "; ".join(dict.fromkeys(_fix_of(v) for v in mine)),
                )
            )
        else:
            rows.append(ok(topic, assumes, showed_ok))
    return rows


def _grouped(found: list) -> str:
    """One clause per limit: what it allows, and which jobs ask what (`run` names each job in full)."""
    by_limit: dict[tuple[str, str], list[str]] = {}
    for v in found:
        job = "the driver" if v.kind == "driver" else job_label(v.stage, v.kind).removeprefix("stage ")
        by_limit.setdefault((v.limit, v.allowed), []).append(f"{job}: {v.value}")
    return "; ".join(f"{limit} allows {allowed}, but {', '.join(jobs)}" for (limit, allowed), jobs in by_limit.items())


def _fix_of(v) -> str:
    """admission.py's fix, without its explanation in brackets (kept in `run`'s refusal)."""
    return re.sub(r"\s*\([^)]*\)$", "", v.fix)


def image_row(transport: Transport, jobs: list[PlannedJob]) -> Row | None:
    images = sorted({job.spec.image for job in jobs})
    if not images:
        return None
    assumes = "every job's image exists in the registry and this key may pull it"
    found: list[str] = []
    missing: list[str] = []
    unknown: list[str] = []
    for name in images:
        try:
            info = transport.image(name)
            size = info.get("size")
            found.append(name + (f" ({int(size) / 1e9:.1f} GB)" if isinstance(size, (int, float)) else ""))
        except BackendCallError as exc:
            (missing if is_not_found(exc) or is_refused_credentials(exc) else unknown).append(f"{name}: {_reason(exc)}")
    if missing:
        return different(
            "image",
            assumes,
            "; ".join(missing + found),
            "jobs with it fail to start: fix the stage's bcp.image, or ask the image's owner for access",
        )
    if unknown:
        return unchecked("image", assumes, "; ".join(unknown + found), "`ngc registry image info` could not answer")
    return ok("image", assumes, "; ".join(found))


def workspace_row(transport: Transport, jobs: list[PlannedJob], ace: str) -> Row | None:
    names = sorted({mount.split(":")[0] for job in jobs for mount in job.spec.workspaces})
    if not names:
        return None
    assumes = "every workspace the jobs mount exists (its size, and the user's storage quota where the service says)"
    shown: list[str] = []
    missing: list[str] = []
    unknown: list[str] = []
    for name in names:
        try:
            info = transport.workspace(name)
            info = info.get("workspace", info) if isinstance(info.get("workspace"), dict) else info
            size = info.get("sizeInBytes")
            shown.append(f"{name}: {int(size) / 1e9:,.1f} GB used" if isinstance(size, (int, float)) else name)
        except BackendCallError as exc:
            (missing if is_not_found(exc) else unknown).append(f"{name}: {_reason(exc)}")
    quota = quota_text(transport, ace)
    if missing:
        return different(
            "workspace",
            assumes,
            "; ".join(missing + shown) + f"; {quota}",
            "create it before the first run: `ngc workspace create --name NAME`",
        )
    if unknown:
        return unchecked("workspace", assumes, "; ".join(unknown + shown) + f"; {quota}")
    return ok("workspace", assumes, "; ".join(shown) + f"; {quota}")


def quota_text(transport: Transport, ace: str) -> str:
    try:
        quotas = transport.storage_quota()
    except BackendCallError as exc:
        return f"storage quota not shown (`user storage` answered {_answer(exc)})"
    mine = [q for q in quotas if q.get("aceName") in (ace, None)] or quotas
    if not mine:
        return "quota unknown (none listed)"
    q = mine[0]
    if isinstance(q.get("quota"), (int, float)) and isinstance(q.get("available"), (int, float)):
        return f"storage quota {q['quota'] / 1e12:,.1f} TB, {q['available'] / 1e12:,.1f} TB available"
    return "quota unknown (not in the answer)"


def secrets_row(transport: Transport, jobs: list[PlannedJob]) -> Row | None:
    wanted = sorted({secret for job in jobs for secret in job.spec.secrets})
    if not wanted:
        return None
    assumes = "every secret the jobs name exists, with the key they take (names only, never values)"
    try:
        have = transport.secret_keys()
    except BackendCallError as exc:
        return unchecked("secrets", assumes, f"`user secret list` failed: {_reason(exc)}")
    problems = []
    for secret in wanted:
        name, _, rest = secret.partition(":")
        key = rest.split(":")[0] if rest else None
        if name not in have:
            problems.append(f"secret {name} does not exist")
        elif key and key not in have[name]:
            problems.append(f"secret {name} has no key {key} (it has: {', '.join(have[name]) or 'none'})")
    names = ", ".join(sorted({s.split(":")[0] for s in wanted}))
    if problems:
        return different(
            "secrets",
            assumes,
            "; ".join(problems),
            "`job run` refuses those jobs: create them with `ngc user secret create NAME --pair KEY:VALUE`",
        )
    return ok("secrets", assumes, f"{names}: present")


def version_row(transport: Transport) -> Row:
    """ngcsdk: the one version the backend was built against. The CLI: its version is shown (the look-ups above
    already proved it has base-command); an answer without a version number is not recognised."""
    if transport.name == "sdk":
        assumes = f"ngcsdk {SDK_VERSION}, the last with Base Command, whose requests the backend was built on"
    else:
        assumes = "NVIDIA's ngc CLI with base-command (its version is recorded)"
    try:
        version = transport.client_version()
    except (BackendCallError, PipelineError) as exc:
        if NO_VERSION_COMMAND in str(exc):  # argparse's refusal of the verb: ngcsdk's CLI code has no `version`
            return unchecked(
                "client version",
                assumes,
                "this `ngc` has no `version` command (ngcsdk's CLI code, as "
                "on the emulator; NVIDIA's standalone CLI has one), so its version is not recorded",
                "nothing to do: the look-ups above show it has base-command",
            )
        return unchecked("client version", assumes, f"`ngc version info` failed: {_answer(exc)}")
    if version == f"ngcsdk {SDK_VERSION}" or (transport.name == "cli" and VERSION.search(version)):
        return ok("client version", assumes, version)
    return different(
        "client version",
        assumes,
        version,
        f"untested with this client: if calls fail, use ngcsdk {SDK_VERSION} (backends.bcp.transport: sdk)",
    )
