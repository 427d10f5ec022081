"""Put each bug of a batch into a checkout, run the test files, take it out again; one line a bug. Run from the
root of a checkout that is not being edited (a `git worktree`):
    python3 docs/measurements/2026-12-07-capacity-mutants-cpu/run_mutants.py mutants > results.txt
    python3 docs/measurements/2026-12-07-capacity-mutants-cpu/run_mutants.py mutants_publish \
        tests/test_capacity_search.py tests/test_capacity.py tests/test_report.py > results_publish.txt"""

import importlib
import pathlib
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))
batch = importlib.import_module(sys.argv[1])
tests = sys.argv[2:] or ["tests/test_capacity_search.py", "tests/test_capacity.py"]
for i, (path, old, new, name) in enumerate(batch.M):
    file = pathlib.Path(path)
    source = file.read_text()
    if source.count(old) != 1:
        print(f"{i} {name}: NOMATCH ({source.count(old)})", flush=True)
        continue
    file.write_text(source.replace(old, new))
    started = time.time()
    try:
        cmd = [".venv-serve/bin/python", "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    finally:
        file.write_text(source)
    last = [line for line in done.stdout.splitlines() if "passed" in line or "failed" in line][-1:]
    verdict = "KILLED" if done.returncode else "SURVIVED"
    print(f"{i} {name}: {verdict} {time.time() - started:.0f}s {last}", flush=True)
