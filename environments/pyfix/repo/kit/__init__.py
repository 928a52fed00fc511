"""kit: small, dependency-free utilities."""

__version__ = "0.3.0"
