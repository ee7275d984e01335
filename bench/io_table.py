#!/usr/bin/python3
"""Reads `swapnet bench io --json` lines on stdin, prints one table row per line, and echoes
the JSON to stderr (to keep as the raw result)."""
import json
import sys

print(f"{'qd':>4} {'request':>9} {'raw MB/s':>9} {'fetch':>7} {'no-verify':>9} {'ratio':>6} {'ratio nv':>8} {'cache B':>8}")
for line in sys.stdin:
    j = json.loads(line)
    r = j["reader"]
    print(f"{r['queue_depth']:>4} {r['request_bytes']:>9} {j['raw_mb_s']:>9.0f} {j['fetch_mb_s']:>7.0f} "
          f"{j['fetch_noverify_mb_s']:>9.0f} {j['ratio']:>6.3f} {j['ratio_noverify']:>8.3f} "
          f"{j['page_cache_growth_bytes']:>8}")
    print(json.dumps(j), file=sys.stderr)
