"""`roam layout-csv`: minimalloc CSV in, offsets out, exit 1 when the capacity cannot be met."""

import csv

from conftest import roam

# Three buffers: a [0,2) 4 B, b [1,3) 4 B, c [2,4) 4 B. a and c never meet: peak live 8, height 8.
ROWS = "id,lower,upper,size\na,0,2,4\nb,1,3,4\nc,2,4,4\n"


def test_layout_csv_places_within_capacity_and_fails_below_the_peak(tmp_path):
    (tmp_path / "in.csv").write_text(ROWS)
    r = roam("layout-csv", tmp_path / "in.csv", "-o", tmp_path / "out.csv", "--capacity", "8")
    assert r.code == 0 and "height 8" in r.out, r.err
    rows = list(csv.DictReader((tmp_path / "out.csv").open()))
    offsets = {row["id"]: int(row["offset"]) for row in rows}
    assert offsets["a"] != offsets["b"] and offsets["b"] != offsets["c"]
    assert max(offsets.values()) + 4 <= 8
    r = roam("layout-csv", tmp_path / "in.csv", "-o", tmp_path / "out2.csv", "--capacity", "7")
    assert r.code == 1 and "capacity 7 not met" in r.err


def test_layout_csv_bad_input_exits_2_without_output(tmp_path):
    (tmp_path / "bad.csv").write_text("id,lower,upper\na,0,2\n")
    r = roam("layout-csv", tmp_path / "bad.csv", "-o", tmp_path / "out.csv")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and not (tmp_path / "out.csv").exists()
