"""The deployments' puller: one published version from an S3 store, every file verified (__main__.py says how).
A folder that runs alone in the serving image (`python3 /pull ...`), Python's standard library only; make pull
runs it as `python3 pipeline/publish/puller`. A deployment carries every module of the folder but this one."""

from pathlib import Path

FOLDER = Path(__file__).parent
