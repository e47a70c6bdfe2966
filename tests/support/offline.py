"""Tests never reach the internet (README: Tests). Two guards, for every test:

- NVIDIA's client (ngcsdk in this process, the ngc CLI in a child) is pointed at a closed port on loopback unless
  the test starts the NGC API emulator, which points it at itself: a code path that calls the NGC API without the
  emulator fails at once instead of calling the real service (found when `run`/`plan` began reading the ACE).
- In this process, a dotted host name other than localhost is not looked up: a test that would reach the internet
  fails with a message naming the host, instead of waiting on the network.
"""

from __future__ import annotations

import ipaddress
import socket

import pytest

CLOSED_LOOPBACK_URL = "https://127.0.0.1:9"  # the discard port: nothing listens there
TEST_NETWORK = ipaddress.ip_network("198.18.0.0/15")  # the test hosts' own namespaces (RFC 2544)


def allowed(host: object) -> bool:
    """Loopback, unspecified, the test network, and names that stay on this machine (no dot: a Slurm node's)."""
    if host is None:
        return True
    name = host.decode() if isinstance(host, bytes) else str(host)
    try:
        address = ipaddress.ip_address(name.split("%")[0])
    except ValueError:
        return name == "localhost" or name == socket.gethostname() or "." not in name
    return address.is_loopback or address.is_unspecified or address in TEST_NETWORK


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NGC_CLI_API_URL", CLOSED_LOOPBACK_URL)
    monkeypatch.setenv("NGC_CLI_AUTH_URL", CLOSED_LOOPBACK_URL)
    lookup = socket.getaddrinfo

    def guarded(host, *args, **kwargs):
        if not allowed(host):
            raise socket.gaierror(socket.EAI_NONAME, f"tests never reach the internet: {host!r} is not looked up")
        return lookup(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", guarded)
