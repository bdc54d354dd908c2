"""`python -m deltaserve ...` is the `deltaserve` command."""

import sys

from .cli import main

sys.exit(main())
