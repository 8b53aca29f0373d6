"""minimalloc-format CSV input/output for `roam layout-csv`."""

import os

import pytest

from roam_cli import layout
from roam_cli.layout.csv_io import read_csv, write_csv


def test_round_trip(tmp_path):
    src = tmp_path / "in.csv"
    src.write_text("id,lower,upper,size,extra\nb1,0,3,4,x\nb2,3,9,4,y\nb3,0,9,4,z\nb4,9,21,4,\nb5,0,21,4,\n")
    ids, buffers = read_csv(src)
    assert ids == ["b1", "b2", "b3", "b4", "b5"]
    assert buffers == [(0, 3, 4), (3, 9, 4), (0, 9, 4), (9, 21, 4), (0, 21, 4)]
    placed = layout.place(buffers, "roam", capacity=12, time_limit=5)
    assert placed.stats["fits"] and placed.arena == 12
    out = tmp_path / "out.csv"
    write_csv(out, ids, buffers, placed.offsets)
    lines = out.read_text().splitlines()
    assert lines[0] == "id,lower,upper,size,offset"
    assert len(lines) == 6
    ids2, buffers2 = read_csv(out)  # the output is itself a valid input
    assert ids2 == ids and buffers2 == buffers
    offsets = [int(line.split(",")[-1]) for line in lines[1:]]
    assert offsets == placed.offsets
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_columns_in_any_order(tmp_path):
    src = tmp_path / "in.csv"
    src.write_text("size,upper,id,lower\n8,2,a,0\n")
    assert read_csv(src) == (["a"], [(0, 2, 8)])


@pytest.mark.parametrize("text, message", [
    ("id,lower,size\na,0,4\n", "missing column(s) upper"),
    ("id,lower,upper,size\na,0,2,four\n", "size is not an integer"),
    ("id,lower,upper,size\na,0,2.5,4\n", "upper is not an integer"),
    ("id,lower,upper,size\na,0,2,-4\n", "negative size"),
    ("id,lower,upper,size\na,2,2,4\n", "lower (2) must be < upper (2)"),
    ("id,lower,upper,size\na,3,2,4\n", "lower (3) must be < upper (2)"),
    ("id,lower,upper,size\na,0,2,4\na,1,3,4\n", "duplicate id"),
    ("id,lower,upper,size\na,0,2\n", "expected 4 columns"),
    ("", "empty file"),
    ("id,lower,upper,size\na,0,2,4\nb,0,2,100000000000000000000000\n",
     "bad.csv:3: size 100000000000000000000000 for buffer 'b' is over 2^63 - 1"),
    ("id,lower,upper,size\na,0,2,4\nb,0,2,9223372036854775807\n",
     "bad.csv:3: the sizes up to this row sum to 9223372036854775811, over 2^63 - 1"),
    ("id,lower,upper,size\na,0,9223372036854775808,4\n", "bad.csv:2: upper 9223372036854775808 for buffer 'a' is over"),
    ("id,lower,upper,size\na,-1,2,4\n", "bad.csv:2: negative lower -1 for buffer 'a'"),
    ("id,lower,upper,size\na,0,2,4e3\n", "bad.csv:2: size is not an integer: '4e3'"),
    pytest.param("id,lower,upper,size\na,0,2," + "9" * 5000 + "\n", "bad.csv:2: size is not an integer: '" + "9" * 40 + "'",
                 id="5000 digits"),
    pytest.param("id,lower,upper,size\n" + "a" * 200_000 + ",0,2,4\n", "bad.csv:2: field larger than field limit",
                 id="a 200,000-character id"),
    (b"id,lower,upper,size\na,0,2,4\nb\xe9,0,2,4\n", "bad.csv:3: not UTF-8 text (byte 0xe9 at offset 29)"),
])
def test_bad_input_is_one_clear_line(tmp_path, text, message):
    src = tmp_path / "bad.csv"
    if isinstance(text, bytes):
        src.write_bytes(text)
    else:
        src.write_text(text)
    with pytest.raises(ValueError) as e:
        read_csv(src)
    assert message in str(e.value)
    assert "\n" not in str(e.value)
    assert "bad.csv" in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match="cannot read"):
        read_csv(tmp_path / "nope.csv")


def test_write_is_atomic_on_error(tmp_path):
    out = tmp_path / "out.csv"
    out.write_text("keep me\n")
    with pytest.raises(ValueError):
        write_csv(out, ["a"], [(0, 1, 4)], [0, 1])  # length mismatch
    assert out.read_text() == "keep me\n"
    assert os.listdir(tmp_path) == ["out.csv"]
