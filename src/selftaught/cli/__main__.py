"""`python -m selftaught.cli`, e.g. under `accelerate launch -m selftaught.cli train ...`."""

from selftaught.cli import main

main()
