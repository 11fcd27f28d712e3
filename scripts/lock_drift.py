"""Print how an environment's installed versions differ from requirements.lock (make test-latest).

python scripts/lock_drift.py requirements.lock FREEZE.txt
"""

import re
import sys
from pathlib import Path


def pins(path: str) -> dict[str, str]:
    out = {}
    for line in Path(path).read_text().splitlines():
        if m := re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;#]+)", line):
            out[re.sub(r"[-_.]+", "-", m[1]).lower()] = m[2]
    return out


lock, now = pins(sys.argv[1]), pins(sys.argv[2])
moved = [f"{n} {lock[n]} -> {now[n]}" for n in sorted(lock.keys() & now.keys()) if lock[n] != now[n]]
new = [f"{n} {now[n]} (not in the lock)" for n in sorted(now.keys() - lock.keys())]
print(f"newest allowed vs {sys.argv[1]}: {len(moved)} moved, {len(new)} new")
print("".join(f"  {line}\n" for line in moved + new), end="")
