"""The night: mine the log into checked tasks, replay tool traffic, split, recall, consolidate
a skill and a memory, and write the night's summary (`cycle.run_night` drives it); and take
out of the home what came from forgotten rows (`forget`: before each night, and after `sleep
log forget`). Above the log and adoption, which it reads and writes."""
