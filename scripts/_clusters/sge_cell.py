"""The files and configuration of a Son of Grid Engine test cell (see sge.py): every path derived from its base
folder, the cell written under it (links to the packaged binaries, bootstrap, spool, global configuration,
parallel environments), and the scheduler, hosts and queue set through qconf once qmaster runs."""

from __future__ import annotations

import os
import re
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from .common import REPO, ClusterError, PidFile, run
from .netns import Network
from .sge_site import global_changes, host_complex_values, install_jsv, site_pes, write_complexes

# openmpi-bin: Open MPI's mpirun, how TSUBAME4's multi-node jobs start their hosts (gridengine.start_hosts: mpirun;
# the cell itself runs without it).
PACKAGES = ["gridengine-master", "gridengine-exec", "gridengine-client", "iproute2", "openmpi-bin"]
BINARIES = ["sge_qmaster", "sge_execd", "qsub", "qstat", "qacct", "qconf", "qdel", "qrsh"]
SGE_LIB = Path("/usr/lib/gridengine")
SGE_SHARE = Path("/usr/share/gridengine")
ARCH = "lx-amd64"
# qmaster; execd gets port+1. Not Grid Engine's 6444/6445, so a system cell does not clash, and not within the test
# Kubernetes' 16443-16447 (k8s_layout.py), so both test clusters run at once on their defaults.
DEFAULT_PORT = 16454
SECOND_HOST = "node2"
PE_TEMPLATE = """pe_name            {name}
slots              9999
user_lists         NONE
xuser_lists        NONE
start_proc_args    NONE
stop_proc_args     NONE
allocation_rule    {rule}
control_slaves     TRUE
job_is_first_task  {first}
urgency_slots      min
accounting_summary {summary}
qsort_args         NONE
"""
# name -> (allocation_rule, job_is_first_task, accounting_summary). pe_node: one slot per host, the job script on
# the first host is no task of its own (it starts one `qrsh -inherit` per host, its own included).
PES = {
    "smp": ("$pe_slots", "TRUE", "TRUE"),
    "mpi": ("$fill_up", "TRUE", "FALSE"),
    "make": ("$round_robin", "FALSE", "TRUE"),
    "pe_node": ("1", "FALSE", "TRUE"),
}


@dataclass(frozen=True)
class Layout:
    """Every path and name of one cell, derived from its base folder."""

    base: Path
    nodes: int = 1
    site: str | None = None  # a site's own set-up (sge_site.py), e.g. tsubame

    @classmethod
    def load(cls, base: Path) -> Layout:
        try:
            nodes = int((base / "etc" / "nodes").read_text().strip())
        except (OSError, ValueError):
            return cls(base)
        try:
            site = (base / "etc" / "site").read_text().strip() or None
        except OSError:
            site = None
        return cls(base, nodes, site)

    @property
    def root(self) -> Path:
        return self.base / "root"

    @property
    def common(self) -> Path:
        return self.root / "default" / "common"

    @property
    def qmaster_spool(self) -> Path:
        return self.base / "spool" / "qmaster"

    @property
    def execd_spool(self) -> Path:
        return self.base / "spool" / "execd"

    @property
    def hosts_file(self) -> Path:
        return self.base / "etc" / "hosts"

    @property
    def lock(self) -> Path:
        return self.base / ".lock"

    @property
    def net(self) -> Network:
        """The exec hosts after the first each get a namespace: node2 is namespace 1."""
        return Network.of(self.base)

    @property
    def first_host(self) -> str:
        return socket.gethostname()

    @property
    def hosts(self) -> list[str]:
        return [self.first_host] + ([SECOND_HOST] if self.nodes > 1 else [])

    def port(self) -> int:
        try:
            return int((self.base / "etc" / "port").read_text().strip())
        except (OSError, ValueError):
            return DEFAULT_PORT

    def env(self) -> dict[str, str]:
        return {
            "SGE_ROOT": str(self.root),
            "SGE_CELL": "default",
            "SGE_QMASTER_PORT": str(self.port()),
            "SGE_EXECD_PORT": str(self.port() + 1),
        }

    def qmaster_pid_file(self) -> PidFile:
        return self.pid_file(self.qmaster_spool / "qmaster.pid", "sge_qmaster")

    def execd_pid_file(self, host: str) -> PidFile:
        """execd names its spool folder as it resolves itself: `localhost` where the name maps to loopback."""
        own = self.execd_spool / host / "execd.pid"
        if host == self.first_host and self.nodes == 1 and not own.exists():
            own = self.execd_spool / "localhost" / "execd.pid"
        return self.pid_file(own, "sge_execd")

    def pid_file(self, path: Path, program: str) -> PidFile:
        # Grid Engine's daemons take no arguments: this cell's are told apart by the SGE_ROOT they started with.
        return PidFile(path, program, (f"SGE_ROOT={self.root}",))

    def daemons(self) -> dict[str, PidFile]:
        """qmaster's and each execd's pid file, by label."""
        return {
            "sge_qmaster": self.qmaster_pid_file(),
            **{f"sge_execd@{host}": self.execd_pid_file(host) for host in self.hosts},
        }

    def running(self) -> dict[str, int | None]:
        """Live pid (or None) of qmaster and each execd, by label."""
        return {label: pid_file.live_pid() for label, pid_file in self.daemons().items()}


def default_base() -> Path:
    if env := os.environ.get("BCP_SGE_BASE"):
        return Path(env).resolve()
    return REPO / ".sge"


def export_line(lay: Layout) -> str:
    return "export " + " ".join(f"{key}={value}" for key, value in lay.env().items())


def cell_env(lay: Layout) -> dict[str, str]:
    return {**os.environ, **lay.env()}


def in_qmaster_namespace(lay: Layout, argv: list[str]) -> list[str]:
    """`argv` run in qmaster's mount namespace (where node2 resolves), for a two-host cell."""
    pid = lay.qmaster_pid_file().live_pid()
    if lay.nodes == 1 or pid is None:
        return argv
    return ["nsenter", "-t", str(pid), "-m", "--", *argv]


def admin(lay: Layout, *args: str) -> str:
    res = run(in_qmaster_namespace(lay, ["qconf", *args]), env=cell_env(lay), timeout=30)
    if res.returncode != 0:
        raise ClusterError(
            f"`qconf {' '.join(args)}` failed (exit {res.returncode}): {(res.stderr or res.stdout).strip()}"
        )
    return res.stdout


def render_bootstrap(lay: Layout) -> str:
    return "\n".join(
        [
            "# Version: 8.1.9",
            "admin_user none",
            "default_domain none",
            "ignore_fqdn true",
            "spooling_method classic",
            "spooling_lib libspoolc",
            f"spooling_params {lay.common};{lay.qmaster_spool}",
            f"binary_path {lay.root / 'bin'}",
            f"qmaster_spool_dir {lay.qmaster_spool}",
            "security_mode none",
            "listener_threads 2",
            "worker_threads 2",
            "scheduler_threads 1",
            "jvm_threads 0",
            "",
        ]
    )


def render_global_config(lay: Layout) -> str:
    """Debian's default global configuration with the settings tests need (see sge.py's docstring)."""
    changes = {
        "execd_spool_dir": str(lay.execd_spool),
        "mailer": "/bin/true",
        "min_uid": "0",
        "min_gid": "0",
        "shell_start_mode": "unix_behavior",
        "load_report_time": "00:00:05",
        "max_unheard": "00:00:30",
        "reporting_params": "accounting=true reporting=false flush_time=00:00:01 joblog=false sharelog=00:00:00 "
        "accounting_flush_time=00:00:00",
        "execd_params": "KEEP_ACTIVE=FALSE",
        **global_changes(lay.site, lay.base),
    }
    lines = []
    for line in (SGE_SHARE / "default-configuration").read_text().splitlines():
        key = line.split()[0] if line.split() and not line.startswith("#") else None
        lines.append(f"{key} {changes[key]}" if key in changes else line)
    return "\n".join(lines) + "\n"


def render_hosts(lay: Layout) -> str:
    net = lay.net
    return (
        "# Written by scripts/sge-cluster for the cell's mount namespaces; rewritten on every start.\n"
        f"127.0.0.1 localhost\n{net.host_address} {lay.first_host}\n{net.address(1)} {SECOND_HOST}\n"
    )


def prepare(lay: Layout, port: int) -> None:
    """A fresh cell under BASE: links to the packaged binaries, bootstrap, spool, global config, complexes."""
    make_tree(lay, port)
    (lay.common / "bootstrap").write_text(render_bootstrap(lay))
    (lay.common / "act_qmaster").write_text(lay.first_host + "\n")
    # The machine's name may resolve to 127.0.x.x and back to `localhost`: qmaster then refuses every client
    # ("local host name error") unless `localhost` is an alias of it.
    (lay.common / "host_aliases").write_text(f"{lay.first_host} localhost\n")
    install_jsv(lay.site, lay.base)
    (lay.base / "etc" / "global").write_text(render_global_config(lay))  # qconf -Mconf wants this file name
    if lay.nodes > 1:
        lay.hosts_file.write_text(render_hosts(lay))
    pe_dir = lay.base / "etc" / "pe"
    pe_dir.mkdir(exist_ok=True)
    for name, (rule, first, summary) in {**PES, **site_pes(lay.site)}.items():
        (pe_dir / name).write_text(PE_TEMPLATE.format(name=name, rule=rule, first=first, summary=summary))
    spool_defaults(lay, pe_dir)


def make_tree(lay: Layout, port: int) -> None:
    """SGE_ROOT (its program folders linked to the packages'), the spools and a tmpdir per host, all new."""
    for folder in (lay.root, lay.base / "spool", lay.base / "tmp"):
        shutil.rmtree(folder, ignore_errors=True)
    (lay.base / "etc").mkdir(parents=True, exist_ok=True)
    (lay.base / "etc" / "nodes").write_text(f"{lay.nodes}\n")
    (lay.base / "etc" / "site").write_text(f"{lay.site or ''}\n")
    (lay.base / "etc" / "port").write_text(f"{port}\n")
    for name in ("bin", "lib", "utilbin"):
        (lay.root / name).mkdir(parents=True)
        (lay.root / name / ARCH).symlink_to(SGE_LIB)
    (lay.root / "util").symlink_to(SGE_SHARE / "util")
    lay.common.mkdir(parents=True)
    lay.qmaster_spool.mkdir(parents=True)
    lay.execd_spool.mkdir(parents=True)
    for host in lay.hosts:
        (lay.base / "tmp" / host).mkdir(parents=True)


def spool_defaults(lay: Layout, pe_dir: Path) -> None:
    """qmaster's classic spool, filled with the configuration, complexes, usersets, PEs and managers."""
    steps = [
        [str(SGE_LIB / "spoolinit"), "classic", "libspoolc", f"{lay.common};{lay.qmaster_spool}", "init"],
        [str(SGE_LIB / "spooldefaults"), "configuration", str(lay.base / "etc" / "global")],
        [
            str(SGE_LIB / "spooldefaults"),
            "complexes",
            str(write_complexes(lay.site, SGE_SHARE / "util/resources/centry", lay.base / "etc" / "centry")),
        ],
        [str(SGE_LIB / "spooldefaults"), "usersets", str(SGE_SHARE / "util/resources/usersets")],
        [str(SGE_LIB / "spooldefaults"), "pes", str(pe_dir)],
        [str(SGE_LIB / "spooldefaults"), "managers", "root"],
    ]
    for argv in steps:
        res = run(argv, env=cell_env(lay), timeout=60)
        if res.returncode != 0:
            raise ClusterError(
                f"`{' '.join(argv)}` failed (exit {res.returncode}): {(res.stderr or res.stdout).strip()}"
            )


def configure(lay: Layout, slots: int) -> None:
    """Scheduler, hosts and the queue, through qconf once qmaster runs."""
    work = lay.base / "etc"
    sconf = admin(lay, "-ssconf")
    for key, value in (("schedule_interval", "0:0:1"), ("flush_submit_sec", "1"), ("flush_finish_sec", "1")):
        sconf = re.sub(rf"^{key}\s+.*$", f"{key} {value}", sconf, flags=re.MULTILINE)
    (work / "sconf").write_text(sconf)
    admin(lay, "-Msconf", str(work / "sconf"))
    for host in lay.hosts:
        (work / f"exechost-{host}").write_text(
            f"hostname {host}\nload_scaling NONE\n"
            f"complex_values {host_complex_values(lay.site)}\n"
            "user_lists NONE\nxuser_lists NONE\nprojects NONE\nxprojects NONE\n"
            "usage_scaling NONE\nreport_variables NONE\n"
        )
        admin(lay, "-Ae", str(work / f"exechost-{host}"))
        if host != lay.first_host:
            admin(lay, "-ah", host)
        admin(lay, "-as", host)  # jobs (and check's probe) may submit from any host
    configure_queue(lay, slots)


def configure_queue(lay: Layout, slots: int) -> None:
    """all.q on every exec host: `slots` slots, every PE, no load thresholds, a tmpdir per host, bash."""
    work = lay.base / "etc"
    tmpdirs = ",".join(f"[{host}={lay.base / 'tmp' / host}]" for host in lay.hosts)
    queue = admin(lay, "-sq").replace("hostlist              NONE", f"hostlist {' '.join(lay.hosts)}")
    queue = re.sub(r"^qname\s+.*$", "qname all.q", queue, flags=re.MULTILINE)
    pe_list = " ".join([*PES, *site_pes(lay.site)])
    for key, value in (
        ("load_thresholds", "NONE"),
        ("slots", str(slots)),
        ("pe_list", pe_list),
        ("tmpdir", f"/tmp,{tmpdirs}"),
        ("shell", "/bin/bash"),
    ):
        queue = re.sub(rf"^{key}\s+.*$", f"{key} {value}", queue, flags=re.MULTILINE)
    (work / "all.q").write_text(queue)
    admin(lay, "-Aq", str(work / "all.q"))


def queue_states(lay: Layout) -> dict[str, str]:
    """Each queue instance's state letters ('' when healthy), by host."""
    res = run(["qstat", "-f", "-q", "all.q", "-xml"], env=cell_env(lay), timeout=10)
    found = {}
    for block in re.findall(r"<Queue-List>(.*?)</Queue-List>", res.stdout, flags=re.DOTALL):
        name = re.search(r"<name>all\.q@([^<]+)</name>", block)
        state = re.search(r"<state>([^<]*)</state>", block)
        if name:
            found[name.group(1)] = state.group(1) if state else ""
    return found
