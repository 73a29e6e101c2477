"""Print the goal figures of issue 21: refused keys/flags and differences from the source
material across every preset x engine x version, as tests/serving/launchers/test_schemas.py
counts them (JSON on stdout; both numbers should be 0).

    python scripts/preset_audit.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "serving" / "launchers")]

import schema_check  # noqa: E402

if __name__ == "__main__":
    print(json.dumps(schema_check.figures(), indent=1))
