"""Writing a benchmark's JSON report, the same way for every bench/*.py script."""

import json
import os


def write_report(path, report):
    """Writes `report` as indented JSON to `path` (making its folder) and says where."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(f"\nwrote {path}")
