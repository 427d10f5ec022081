"""python -m pipeline.review (make review)."""

import sys

from pipeline.review.cli import main

if __name__ == "__main__":
    sys.exit(main())
