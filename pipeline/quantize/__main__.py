"""python -m pipeline.quantize (make quantize)."""

from pipeline import exits

if __name__ == "__main__":  # a process a library spawns re-imports the main module
    from pipeline.quantize.cli import main

    # an interrupted build leaves no variant folder of its own: pipeline.artifacts.staging_dir
    INTACT = "an earlier build of it is untouched and nothing is half-written: a variant is moved in only when complete"
    exits.run("quantize", main, INTACT)
