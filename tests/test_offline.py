"""The guards of tests/support/offline.py hold (a guard that let a test through would hide one that reaches out)."""

from __future__ import annotations

import os
import socket

import pytest
import requests


def test_a_dotted_name_off_this_machine_is_not_looked_up():
    with pytest.raises(socket.gaierror, match="tests never reach the internet: 'authn.nvidia.com'"):
        socket.getaddrinfo("authn.nvidia.com", 443)
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get("https://api.ngc.nvidia.com/v2/org", timeout=5)


def test_loopback_and_the_test_network_are_allowed():
    assert socket.getaddrinfo("127.0.0.1", 80) and socket.getaddrinfo("localhost", 80)
    assert socket.getaddrinfo("198.18.0.11", 80)


def test_nvidias_client_points_at_a_closed_loopback_port_without_the_emulator():
    assert os.environ["NGC_CLI_API_URL"] == os.environ["NGC_CLI_AUTH_URL"] == "https://127.0.0.1:9"
