"""Import-only stand-in for ``ngccli.api`` (see ngccli/__init__.py)."""
