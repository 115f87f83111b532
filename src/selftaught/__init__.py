"""selftaught: LLM agents that improve themselves on their own tasks, safely."""

__version__ = "0.1.0"
