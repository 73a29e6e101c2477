"""Loading problem sets by path and by name, with clear errors that name the line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mathagent.evals.datasets import DatasetError, data_folders, load_dataset, load_file
from mathagent.evals.grading import answers_match

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "datasets"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/datasets not present")


def test_sample_set_ships_in_the_package_with_verified_integer_answers():
    problems = load_dataset("sample")
    assert 25 <= len(problems) <= 40
    assert len({p.id for p in problems}) == len(problems)
    assert all(p.answer.lstrip("-").isdigit() for p in problems)
    by_id = {p.id: p for p in problems}
    assert by_id["sample-01"].answer == str(17 * 23 + 5)
    assert by_id["sample-05"].answer == str(pow(3, 2024, 1000))


def test_jsonl_with_column_mapping(tmp_path: Path):
    path = tmp_path / "set.jsonl"
    rows = [
        {"key": "a", "question": "1+1?", "solution": "2"},
        {"key": "b", "question": "2+2?", "solution": "4"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    problems = load_file(path, columns={"id": "key", "problem": "question", "answer": "solution"})
    assert [(p.id, p.problem, p.answer) for p in problems] == [
        ("a", "1+1?", "2"),
        ("b", "2+2?", "4"),
    ]


def test_csv_with_aliases_and_row_modulo(tmp_path: Path):
    path = tmp_path / "set.csv"
    path.write_text('id,question,answer,modulo\nx,"Find 2, then 3",1024,1000\ny,Find 5,5,\n')
    problems = load_file(path)
    assert [(p.id, p.problem, p.modulo) for p in problems] == [
        ("x", "Find 2, then 3", 1000),
        ("y", "Find 5", None),
    ]
    assert answers_match("24", problems[0].answer, modulo=problems[0].modulo)


def test_parquet_without_pyarrow_or_with_it(tmp_path: Path):
    path = tmp_path / "set.parquet"
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        path.write_bytes(b"PAR1")
        with pytest.raises(DatasetError, match="pyarrow"):
            load_file(path)
        return
    pq.write_table(pa.table({"problem": ["1+1?"], "answer": ["2"]}), path)
    assert load_file(path)[0].answer == "2"


def test_bad_json_line_is_named(tmp_path: Path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"problem": "a", "answer": "1"}\n{"problem": "b", "answer": \n')
    with pytest.raises(DatasetError, match=r"bad\.jsonl:2: invalid JSON"):
        load_file(path)


def test_missing_field_and_duplicate_id_are_named(tmp_path: Path):
    path = tmp_path / "gaps.jsonl"
    path.write_text('{"id": 1, "problem": "a", "answer": "1"}\n{"id": 2, "problem": "b"}\n')
    with pytest.raises(DatasetError, match=r"gaps\.jsonl:2: missing 'answer'"):
        load_file(path)
    path.write_text(
        '{"id": 1, "problem": "a", "answer": "1"}\n{"id": 1, "problem": "b", "answer": "2"}\n'
    )
    with pytest.raises(DatasetError, match=r":2: duplicate id '1' \(first on 1\)"):
        load_file(path)


def test_unknown_file_type_and_missing_file(tmp_path: Path):
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(DatasetError, match="unsupported file type"):
        load_file(tmp_path / "x.txt")
    with pytest.raises(DatasetError, match="not found"):
        load_dataset(tmp_path / "nope.jsonl")


def test_name_resolves_from_data_dir_first(tmp_path: Path):
    (tmp_path / "gsm8k_test.jsonl").write_text('{"id": "g", "problem": "p", "answer": "1,000"}\n')
    problems = load_dataset("gsm8k", data_dir=tmp_path)
    assert [p.id for p in problems] == ["g"]
    assert data_folders(tmp_path)[0] == tmp_path


def test_unknown_name_offline_gives_a_clear_message(tmp_path: Path, clean_env):
    with pytest.raises(DatasetError, match="no Hugging Face Hub source"):
        load_dataset("no_such_set", data_dir=tmp_path)


def test_hub_fallback_without_datasets_package_says_how_to_fix(tmp_path: Path):
    # A child process where `import datasets` fails and the shared folder is not searched.
    code = (
        "import sys, builtins\n"
        "real = builtins.__import__\n"
        "def fake(name, *a, **k):\n"
        "    if name == 'datasets': raise ImportError('no')\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = fake\n"
        "import mathagent.evals.datasets as d\n"
        "d.data_folders = lambda data_dir=None: [data_dir]\n"
        "from pathlib import Path\n"
        f"try: d.load_dataset('math500', data_dir=Path({str(tmp_path)!r}))\n"
        "except d.DatasetError as e: print(e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "install the optional 'datasets' package" in done.stdout, done.stderr
    assert "HuggingFaceH4/MATH-500" in done.stdout


@needs_shared
@pytest.mark.parametrize(
    ("name", "count", "modulo"),
    [
        ("aime24", 30, None),
        ("amc23", 40, None),
        ("gsm8k", 1319, None),
        ("aimo2", 10, 1000),
        ("aimo3", 10, 100_000),
    ],
)
def test_named_sets_from_the_shared_folder(name: str, count: int, modulo: int | None, clean_env):
    problems = load_dataset(name)
    assert len(problems) == count
    assert {p.modulo for p in problems} == {modulo}
    assert len(load_dataset(name, limit=3)) == 3
