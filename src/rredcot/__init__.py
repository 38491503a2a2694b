"""RREDCoT: segment-level reward redistribution for RL training of reasoning models."""

__version__ = "0.1.0"
