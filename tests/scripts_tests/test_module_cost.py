"""scripts/module_cost.py on the CPU: a tiny real transformers model patched everywhere, under the interpreter."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

if os.environ.get("CI"):
    import transformers  # noqa: F401  (CI installs the [hf] extra)
else:
    pytest.importorskip("transformers", minversion="5")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import module_cost  # noqa: E402


def test_cpu_smoke_times_every_patched_module_of_the_first_layer_and_the_head(tmp_path: Path, capsys) -> None:
    assert module_cost.main(["--cpu-smoke", "--everywhere", "--models", "Llama-3.1-8B", "--rows", "1,3",
                             "--pairs", "1", "--calls", "21", "--out", str(tmp_path)]) == 0
    cells = json.loads((tmp_path / "module_cost.json").read_text())
    modules = {(c["module"], c["rows"]) for c in cells}
    for name in ("self_attn.q_proj", "self_attn.o_proj", "mlp"):
        assert {(f"model.layers.0.{name}", 1), (f"model.layers.0.{name}", 3)} <= modules
    assert ("lm_head", 1) in modules and ("lm_head", 3) not in modules  # generate's head: the last token
    assert not any(".layers.1." in c["module"] for c in cells)
    norms = {c["module"] for c in cells if c["path"] == "one launch"}
    assert norms == {"model.layers.0.input_layernorm", "model.layers.0.post_attention_layernorm"}
    assert {c["path"] for c in cells if c["module"] not in norms} == {"ours, everywhere"}
    assert {c["kind"] for c in cells if c["module"].endswith(".mlp")} == {"FusedLlamaMLP"}
    assert all(t["host_us"] > 0 and t["loop_us"] > 0 for c in cells for t in c["vanilla"] + c["patched"])
    assert "loop x, host x" in capsys.readouterr().out


def test_bad_arguments_are_refused_with_the_fix(capsys) -> None:
    with pytest.raises(SystemExit):
        module_cost.parse_args(["--cpu-smoke", "--models", "GPT-5", "--out", "x"])
    assert "unknown model(s) GPT-5" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        module_cost.parse_args(["--cpu-smoke", "--calls", "5", "--out", "x"])
    assert "at least 21" in capsys.readouterr().err
