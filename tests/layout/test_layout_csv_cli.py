"""`roam layout-csv`: minimalloc CSV in, offsets out, exit 1 when the capacity cannot be met."""

import csv

from conftest import ROOT, roam

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


def test_a_file_that_is_not_utf8_is_named_with_its_row(tmp_path):
    (tmp_path / "latin1.csv").write_bytes("id,lower,upper,size\ncafé,0,2,4\n".encode("latin-1"))
    r = roam("layout-csv", tmp_path / "latin1.csv", "-o", tmp_path / "out.csv")
    assert r.code == 2 and not (tmp_path / "out.csv").exists()
    assert r.err == f"roam: error: {tmp_path / 'latin1.csv'}:2: not UTF-8 text (byte 0xe9 at offset 23)\n"


def test_the_help_example_runs_from_the_clone(tmp_path):
    r = roam("layout-csv", "--help")
    example = next(line.split() for line in r.out.splitlines() if line.strip().startswith("roam layout-csv "))
    assert (ROOT / example[2]).is_file()  # inside the clone, not beside it
    r = roam(*example[1:3], "-o", tmp_path / "A.out.csv", *example[5:], cwd=ROOT)
    assert r.code == 0 and r.out.startswith("height 1048576 (peak live 1048576, 154 buffers)"), r.err
