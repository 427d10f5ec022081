"""python -m pipeline.review (make review)."""

import sys

from pipeline import exits
from pipeline.review.cli import main

if __name__ == "__main__":
    exits.started()  # its Ctrl-C stops its servers (cli.serve_page); the imports' one is exits.guard_start's
    sys.exit(main())
