"""The release, in one place (the package, /version and --version read it)."""

__version__ = "0.1.0"
