"""The records of every run under a folder, with their per-token arrays elided, as one JSON Lines file.

A model-level run's records carry per-token losses (up to 262k values a metric at the gpu profile), which put its
archive over what a device call may bring back; the elided copy keeps every value, unit and interval.
Usage: python3 .ci/compact_records.py RUNS_DIR OUT.jsonl
"""

import json
import sys
from pathlib import Path

#: Lists longer than this are replaced by a note of their length.
KEEP_LIST = 64


def main(runs: Path, out: Path) -> None:
    with out.open("w") as sink:
        for path in sorted(runs.glob("*/records.jsonl")):
            for line in path.open():
                record = json.loads(line)
                details = record.get("details") or {}
                for key, value in details.items():
                    if isinstance(value, list) and len(value) > KEEP_LIST:
                        details[key] = f"<{len(value)} values elided>"
                record["run"] = path.parent.name
                sink.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
