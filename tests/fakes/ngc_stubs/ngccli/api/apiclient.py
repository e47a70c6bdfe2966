"""Import-only stand-in: the standalone CLI's APIClient; the SDK's own class serves for type names."""

from ngcsdk import APIClient  # noqa: F401  (re-exported: organization.command.user imports it from here)
