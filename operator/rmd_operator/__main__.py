import sys

from rmd_operator.cli import main

sys.exit(main())
