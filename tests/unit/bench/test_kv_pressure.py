"""`python -m specstruct.bench.kv_pressure` on tiny models: the active tier overflows, the scheduler preempts and
restores, and every output equals the same request alone (the plumbing, not the speed)."""

from __future__ import annotations

import json

from specstruct.bench.kv_pressure import main


def test_kv_pressure_preempts_and_outputs_stay_identical(capsys):
    main(["--tiny", "--requests", "3", "--fit", "2", "--slack", "4", "--max-new-tokens", "24"])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["identical"] == "3/3"
    assert res["preemptions"] >= 1 and res["resumes"] == res["preemptions"] and res["restored"] >= 1
    assert res["spilled_tokens"] > 0 and res["spill_ms_per_token"] >= 0
    assert res["store_bytes_now"] == {"disk": 0}  # every spill read back and freed
