"""`python -m cli ...`: the same as `imagepipe ...`."""

import sys

from cli.main import main

sys.exit(main())
