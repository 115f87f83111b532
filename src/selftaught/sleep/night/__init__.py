"""The night: mine the log into checked tasks, replay tool traffic, split, recall, consolidate
a skill and a memory, and write the night's summary (`cycle.run_night` drives it)."""
