"""A site's own set-up of the test cell (`scripts/sge-cluster start --site NAME`): what a real site adds to a
stock Grid Engine, so the backend meets it in tests. One site so far, `tsubame`, standing in for TSUBAME4
(Altair Grid Engine; its own configuration is not public, so this follows its user guide):

- a consumable complex `node_f` (INT, requestable, consumable), 1 on every exec host: a whole node;
- the site's parallel environment `site_node_f` (`allocation_rule 1`: one slot a host; `control_slaves TRUE`,
  `job_is_first_task FALSE`, so `qrsh -inherit` and Open MPI reach every host), in all.q's pe_list, which users
  never name;
- a server-side JSV (tsubame_jsv.py, copied into the cell and named by `jsv_url`, run by sge_qmaster for every
  job) that refuses a job without `-l node_f=N` or `-l h_rt` and turns `-l node_f=N` into `-pe site_node_f N` with
  node_f=1 a slot: N whole hosts and a $PE_HOSTFILE, though the job named no parallel environment.
What the site's users meet on the client side is not the cell's: TSUBAME's `qsub` wrapper (the group only as
`-g GROUP` on the command line) and accounting that lags are the test stand-ins tests/fakes/tsubame_qsub and
tests/fakes/slow_qacct, put on PATH by the tests (tests/support/sge_cluster.py's `tsubame_cell`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

SITES = ("tsubame",)
SITE_PE = "site_node_f"
# name -> (allocation_rule, job_is_first_task, accounting_summary), as sge_cell.PES
SITE_PES = {"tsubame": {SITE_PE: ("1", "FALSE", "TRUE")}}
# A complex as `spooldefaults complexes` reads it: one file a complex, named after it.
NODE_F = """name        node_f
shortcut    node_f
type        INT
relop       <=
requestable YES
consumable  YES
default     0
urgency     0
"""
JSV_SOURCE = Path(__file__).resolve().parent / "tsubame_jsv.py"


def site_pes(site: str | None) -> dict[str, tuple[str, str, str]]:
    """The site's parallel environments (none for a plain cell)."""
    return SITE_PES.get(site or "", {})


def write_complexes(site: str | None, stock: Path, into: Path) -> Path:
    """The folder of complexes to spool: the stock ones, plus the site's (`into`, a copy) where it has any."""
    if site != "tsubame":
        return stock
    shutil.rmtree(into, ignore_errors=True)
    shutil.copytree(stock, into)
    (into / "node_f").write_text(NODE_F)
    return into


def jsv_path(base: Path) -> Path:
    return base / "etc" / "jsv" / "tsubame_jsv.py"


def install_jsv(site: str | None, base: Path) -> None:
    """The site's JSV copied into the cell, so the cell does not depend on this checkout while it runs."""
    if site != "tsubame":
        return
    target = jsv_path(base)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(JSV_SOURCE, target)
    target.chmod(0o755)


def global_changes(site: str | None, base: Path) -> dict[str, str]:
    """Global configuration lines the site sets: its server-side JSV (install_jsv puts it there)."""
    return {"jsv_url": f"script:{jsv_path(base)}"} if site == "tsubame" else {}


def host_complex_values(site: str | None) -> str:
    """An exec host's complex_values: one whole node."""
    return "node_f=1" if site == "tsubame" else "NONE"
