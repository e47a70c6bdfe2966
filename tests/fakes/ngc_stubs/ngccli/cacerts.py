"""Import-only stand-in: ngcsdk only takes ``os.path.dirname(cacerts.__file__)`` of this module."""
