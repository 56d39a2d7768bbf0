"""`python -m cli ...`: the same as `imagepipe ...`."""

from cli.main import console_main

console_main()
