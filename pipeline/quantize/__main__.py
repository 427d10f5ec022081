import sys

from pipeline.quantize.cli import main

sys.exit(main())
