"""`python -m benchmarks.load_memory` on a tiny model saved to a folder (the figures come from the real pair)."""

from __future__ import annotations

import sys

import pytest

from benchmarks.load_memory import main
from specstruct.testing import tiny_model, tiny_tokenizer


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_reports_resident_memory_after_loading_and_the_model_tensors(tmp_path, capsys):
    tok = tiny_tokenizer()
    tiny_model(tok).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    report = main(["--model", str(tmp_path), "--draft", ""])
    assert set(report["loaded_mib"]) == {"VmRSS", "RssAnon", "RssFile", "VmHWM"}
    assert report["loaded_mib"]["VmHWM"] >= report["loaded_mib"]["VmRSS"] > 0
    assert report["model_tensors_mib"]["target"] > 0 and report["model_tensors_mib"]["draft"] == 0
    assert '"loaded_mib"' in capsys.readouterr().out
