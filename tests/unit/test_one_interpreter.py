"""hivemind and py-libp2p cannot share an interpreter (both register the protobuf symbol
``crypto.pb.KeyType``), and pytest imports every test module into one. The LAN tests need
py-libp2p, so no unit test module may load hivemind when it is imported: the ones that need the
DHT run it in a subprocess (see tests/unit/peers/dht/test_swarm_dht_validator.py). Without this
check the clash shows only as a collection error in the LAN tests, naming neither culprit.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
PROBE = r"""
import importlib, json, sys
found = {}
for name in sys.argv[1:]:
    before = "hivemind" in sys.modules
    importlib.import_module(name)
    if not before and "hivemind" in sys.modules:
        found[name] = True
        for loaded in [m for m in sys.modules if m == "hivemind" or m.startswith("hivemind.")]:
            del sys.modules[loaded]
print(json.dumps(sorted(found)))
"""


def _unit_test_modules() -> list[str]:
    unit = ROOT / "tests" / "unit"
    return [
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for path in sorted(unit.rglob("test_*.py"))
        if "lan" not in path.relative_to(unit).parts
    ]


def test_no_unit_test_module_loads_hivemind() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *_unit_test_modules()],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    loads = json.loads(done.stdout.strip().splitlines()[-1])
    assert loads == [], f"these test modules load hivemind on import (move the import into a subprocess): {loads}"
