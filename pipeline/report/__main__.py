"""python -m pipeline.report (make report)."""

from pipeline import exits
from pipeline.report.cli import main

if __name__ == "__main__":
    # report.build: built in a staging folder, then moved in together (exits.held)
    INTACT = "the earlier report files are untouched: they are built aside and moved in together when complete"
    exits.run("report", main, INTACT)
