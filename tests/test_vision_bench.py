"""The vision benches' CPU modes: bench/vision_attention_gpu.py --smoke checks every backend it
runs against fp32 SDPA per image before timing and writes its table."""

from __future__ import annotations

import importlib.util
import json

from conftest import REPO


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_attention_bench_smoke(tmp_path, capsys):
    assert load("vision_attention_gpu").main(["--smoke", "--out", str(tmp_path)]) == 0
    records = json.loads((tmp_path / "vision_attention.json").read_text())["records"]
    assert {r["backend"] for r in records} == {"sdpa", "flex"}
    assert all("error" not in r and r["max_error"] < 1e-4 for r in records), records
    assert "| tiny mix |" in (tmp_path / "vision_attention.md").read_text()


def test_bubbles_sim_small(tmp_path, capsys):
    """bench/vision_bubbles_sim.py at PP 2 and 4, three microbatches: its table and records, the
    bubble-filled step never above the ViT-before-the-pipeline one."""
    assert load("vision_bubbles_sim").main(["--out", str(tmp_path), "--stages", "2,4", "--microbatches", "3",
                                            "--tokens", "1024"]) == 0
    records = json.loads((tmp_path / "vision_bubbles_sim.json").read_text())["records"]
    assert len(records) == 2
    for r in records:
        assert r["text_step_ms"] <= r["bubbles_step_ms"] <= r["before_step_ms"] + 1e-6
        assert r["floor_exposed"] <= r["bubbles_exposed"] + 1e-9
    assert "| 1,024 | 4 | 3 |" in (tmp_path / "vision_bubbles_sim.md").read_text()


def test_layer_bench_smoke_drives_the_simulation(tmp_path, capsys):
    """bench/vision_layer_gpu.py --smoke checks a tiny layer against the float64 reference and times
    it; its json then drives bench/vision_bubbles_sim.py --layer-costs."""
    assert load("vision_layer_gpu").main(["--smoke", "--out", str(tmp_path)]) == 0
    measured = json.loads((tmp_path / "vision_layer.json").read_text())
    assert [r["patches"] for r in measured["records"]] == [16, 60]
    assert all(r["max_rel_error"] < 1e-4 and r["forward_backward_ms"] > 0 for r in measured["records"])
    sim = tmp_path / "sim"
    assert load("vision_bubbles_sim").main(["--out", str(sim), "--stages", "2", "--microbatches", "3", "--tokens",
                                            "1024", "--patches", "64", "--layer-costs",
                                            str(tmp_path / "vision_layer.json")]) == 0
    assert "ViT times measured instead" in (sim / "vision_bubbles_sim.md").read_text()
