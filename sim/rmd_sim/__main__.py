"""Entry point for `python -m rmd_sim`."""

from rmd_sim.cli import main

raise SystemExit(main())
