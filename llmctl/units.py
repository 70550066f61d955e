"""Byte units, defined once."""

GiB = 1024**3
