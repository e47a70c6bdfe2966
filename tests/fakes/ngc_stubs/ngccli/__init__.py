"""Import-only stand-in for the package ``ngccli`` that only NVIDIA's standalone ngc CLI ships.

ngcsdk 4.19.1's Base Command command modules import ``ngccli.cacerts`` and ``ngccli.api.apiclient``
at import time; nothing in the argument parser or the JobCreateRequest builder calls into them.
Used by tests/support/ngc_parser.py only (put on sys.path there). Not NVIDIA code.
"""
