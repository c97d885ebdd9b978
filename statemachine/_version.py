"""The version, in one place: pyproject.toml reads it from here (setuptools ``attr:``)."""

__version__ = "0.1.0"
DISTRIBUTION = "agent-statemachine"
