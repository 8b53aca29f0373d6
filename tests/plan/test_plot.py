"""Pictures: the files, their labels and legends, and the curves behind them."""

import copy
import json
import xml.etree.ElementTree as ET

import onnx
import pytest
from conftest import roam
from small_models import chain_model

from roam_cli.core.errors import RoamError
from roam_cli.core.units import format_bytes

pytest.importorskip("matplotlib")
from roam_cli.outputs import plot  # noqa: E402  (needs matplotlib only to draw, but skip together

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def svg_texts(path) -> str:
    """All text in an SVG (the pictures keep text as text)."""
    return " ".join(t.text or "" for t in ET.parse(path).iter("{http://www.w3.org/2000/svg}text"))


def test_plot_command_draws_both_pictures_with_labels_and_legends(sample_plan, tmp_path):
    _, plan_path, plan, _ = sample_plan
    r = roam("plot", plan_path, "-o", tmp_path, "--budget", "4MiB", "--json")
    assert r.code == 0, r.err
    written = sorted(r.json()["written"])
    assert [p.split("/")[-1] for p in written] == ["layout.png", "layout.svg", "live_memory.png", "live_memory.svg"]
    assert (tmp_path / "layout.png").read_bytes()[:8] == PNG_MAGIC
    live = svg_texts(tmp_path / "live_memory.svg")
    own = f"{plan['stats']['order']['strategy']} order (this plan): transient peak 1023.75 KiB"
    for label in ("step (operator index in execution order)", "persistent + live transient (MiB)", own,
                  "persistent: 1.07 MiB (parameter 535.00 KiB", "budget: 4.00 MiB", "gpt2_tiny/training_model.onnx"):
        assert label in live, label
    layout = svg_texts(tmp_path / "layout.svg")
    for label in ("arena offset (KiB)", "activation (", "gradient (", f"arena: {format_bytes(plan['arena_bytes'])}",
                  "peak live 1023.75 KiB at step"):
        assert label in layout, label


def test_original_curve_is_recomputed_from_the_model(tmp_path):
    model = chain_model(tmp_path / "chain.onnx")
    assert roam("optimize", model, "-o", tmp_path / "plan.json", "--dim", "batch=2").code == 0
    plan = json.loads((tmp_path / "plan.json").read_text())
    # a: steps 0..1, b: 1..2, y: 2, each 2 * 256 bytes
    assert plot.original_curve_from_model(plan, tmp_path / "chain.onnx", {}) == [512, 1024, 1024]
    # a plan whose lifetimes the model does not give (as when it was made with other --inplace pairs)
    lying = copy.deepcopy(plan)
    lying["tensors"] = [dict(t, last_step=2) if t["name"] == "a" else t for t in plan["tensors"]]
    with pytest.raises(RoamError, match="memory model rebuilt"):
        plot.original_curve_from_model(lying, tmp_path / "chain.onnx", {})
    changed = onnx.load(model)
    changed.doc_string = "another file"
    onnx.save(changed, str(tmp_path / "changed.onnx"))
    with pytest.raises(RoamError, match="the plan was made for another model"):
        plot.original_curve_from_model(plan, tmp_path / "changed.onnx", {})


def test_two_orders_are_drawn_when_the_plan_is_not_the_original_order(sample_plan, tmp_path):
    _, _, plan, _ = sample_plan
    reordered = copy.deepcopy(plan)
    reordered["stats"]["order"]["strategy"] = "roam"
    original = [v + 1024 for v in plot.plan_curve(plan)]
    plot.live_memory(reordered, original, tmp_path / "live", ("svg",))
    text = svg_texts(tmp_path / "live.svg")
    assert f"original order: transient peak {format_bytes(max(original))}" in text
    assert "roam order (this plan): transient peak" in text


PICTURES = ["layout.png", "layout.svg", "live_memory.png", "live_memory.svg"]


def test_optimize_plot_option_and_bad_requests(tmp_path):
    model = chain_model(tmp_path / "chain.onnx")
    pictures = tmp_path / "out" / "pictures"  # made, with its parent
    r = roam("optimize", model, "-o", tmp_path / "plan.json", "--dim", "batch=2", "--plot", pictures)
    assert r.code == 0, r.err
    assert sorted(p.name for p in pictures.iterdir()) == PICTURES
    r = roam("optimize", model, "-o", tmp_path / "p2.json", "--dim", "batch=2", "--plot", tmp_path / "plan.json" / "pics")
    assert r.code == 2 and "plan.json is not a directory" in r.err and not (tmp_path / "p2.json").exists()
    assert len(r.err.strip().splitlines()) == 1
    r = roam("plot", tmp_path / "plan.json", "-o", pictures, "--format", "png,gif")
    assert r.code == 2 and "gif" in r.err
    (tmp_path / "chain.onnx").unlink()  # without the model: the plan's curve only, and a note
    r = roam("plot", tmp_path / "plan.json", "-o", pictures, "--format", "svg")
    assert r.code == 0 and "is absent" in r.err


def test_plot_makes_the_folder_as_the_readme_writes_it(tmp_path):
    model = chain_model(tmp_path / "chain.onnx")
    assert roam("optimize", model, "-o", tmp_path / "plan.json", "--dim", "batch=2").code == 0
    r = roam("plot", "plan.json", "-o", "pictures/", cwd=tmp_path)
    assert r.code == 0, r.err
    assert sorted(p.name for p in (tmp_path / "pictures").iterdir()) == PICTURES
    # a plan that cannot be read: an error, and no folder made
    r = roam("plot", "nothing.json", "-o", "more/pictures/", cwd=tmp_path)
    assert r.code == 2 and not (tmp_path / "more").exists()
