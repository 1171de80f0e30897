import sys

from rmd_agent.cli import main

sys.exit(main())
