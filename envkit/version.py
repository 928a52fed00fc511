"""envkit's version (in its own module, so that importing it imports nothing else)."""

__version__ = "0.1.0"
