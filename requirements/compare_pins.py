"""Helper of check-locks.sh: compares a lock's pins with what a resolver or installer chose.

  python3 compare_pins.py uv  LOCK UV_OUTPUT       -> "ok" or "BAD <differences>"
  python3 compare_pins.py pip LOCK REPORT.json...  -> "<n> wheels + <m> sdists" or "BAD <differences>"
"""
import json
import re
import sys


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path):
    out = {}
    for line in open(path):
        line = line.split("#")[0].split(";")[0].strip()
        if line and not line.startswith("-"):
            name, version = line.split("==", 1)
            out[norm(name)] = version.strip()
    return out


def main(mode, lock, *others):
    want = pins(lock)
    if mode == "uv":
        got = pins(others[0])
        diff = [f"{n}=={v} (lock: {want.get(n, 'absent')})" for n, v in got.items() if want.get(n) != v]
        diff += [f"{n}=={v} (resolver drops it)" for n, v in want.items() if n not in got]
        return ("BAD " + " ".join(diff)) if diff else "ok"
    got, files = {}, {}
    for report in others:
        for item in json.load(open(report))["install"]:
            n = norm(item["metadata"]["name"])
            got[n] = item["metadata"]["version"]
            files[n] = item["download_info"]["url"].rsplit("/", 1)[1]
    bad = [f"{n}=={v} (got {got.get(n, 'nothing')})" for n, v in want.items() if got.get(n) != v]
    sdists = sum(1 for f in files.values() if not f.endswith(".whl"))
    return ("BAD " + " ".join(bad)) if bad else f"{len(files) - sdists} wheels + {sdists} sdists"


if __name__ == "__main__":
    print(main(*sys.argv[1:]))
