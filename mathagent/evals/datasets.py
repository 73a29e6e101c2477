"""Problem sets: loaded from a file, from the data folder by name, or from the Hugging Face Hub.

A name resolves in this order: the sample set shipped in the package (``sample``); ``<file>``
in the data folder (``MATHAGENT_DATA_DIR``), then in the repository's sibling
``../shared/datasets`` (a development checkout); then the Hub through the optional ``datasets``
package. Files are JSONL, JSON, CSV or Parquet; columns are mapped to id / problem / answer.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

FIELDS = ("id", "problem", "answer")
# Column names other harnesses use, tried when a file lacks the canonical one.
ALIASES = {
    "id": ("id", "unique_id", "problem_id", "idx"),
    "problem": ("problem", "question", "prompt", "Problem"),
    "answer": ("answer", "expected_answer", "ground_truth", "final_answer", "Answer"),
}


@dataclass(frozen=True)
class NamedSet:
    """Where a named benchmark lives: its file in the data folder and its Hub source."""

    file: str
    hub: tuple[str, str | None, str] | None = None  # (repo, config, split)
    columns: Mapping[str, str] = field(default_factory=dict)
    modulo: int | None = None


NAMED: dict[str, NamedSet] = {
    "aime24": NamedSet("aime24.jsonl", ("HuggingFaceH4/aime_2024", None, "train")),
    "aime25": NamedSet("aime25.jsonl", ("math-ai/aime25", None, "test")),
    "amc23": NamedSet("amc23.jsonl", ("math-ai/amc23", None, "test"), {"problem": "question"}),
    "math500": NamedSet(
        "math500.jsonl", ("HuggingFaceH4/MATH-500", None, "test"), {"id": "unique_id"}
    ),
    "gsm8k": NamedSet(
        "gsm8k_test.jsonl", ("openai/gsm8k", "main", "test"), {"problem": "question"}
    ),
    "aimo1": NamedSet(
        "aimo1_train.jsonl", ("AI-MO/aimo-validation-aime", None, "train"), modulo=1000
    ),
    "aimo2": NamedSet("aimo2_reference.jsonl", modulo=1000),
    "aimo3": NamedSet("aimo3_reference.jsonl", modulo=100_000),
}
SAMPLE = "sample"


class DatasetError(ValueError):
    """A dataset that cannot be found or read; the message says where and why."""


@dataclass(frozen=True)
class Problem:
    """One problem with its reference answer."""

    id: str
    problem: str
    answer: str
    modulo: int | None = None  # compare integer answers modulo this (AIMO asks for mod 1000)


def load_dataset(
    spec: str | Path,
    *,
    data_dir: Path | None = None,
    columns: Mapping[str, str] | None = None,
    limit: int | None = None,
) -> list[Problem]:
    """Problems of ``spec``: a file path or a dataset name (see the module docstring)."""
    path = Path(spec)
    if path.suffix and path.exists():
        problems = load_file(path, columns=columns)
    elif path.suffix or ("/" in str(spec) and not _looks_like_hub(str(spec))):
        raise DatasetError(f"dataset file not found: {spec}")
    else:
        problems = _load_named(str(spec), data_dir, columns)
    return problems[:limit] if limit else problems


def load_file(
    path: Path, *, columns: Mapping[str, str] | None = None, modulo: int | None = None
) -> list[Problem]:
    """Problems from a JSONL, JSON, CSV or Parquet file; ``columns`` maps our field -> column."""
    readers = {".jsonl": _jsonl_rows, ".json": _json_rows, ".csv": _csv_rows}
    reader = readers.get(path.suffix.lower())
    if path.suffix.lower() == ".parquet":
        reader = _parquet_rows
    if reader is None:
        raise DatasetError(f"{path}: unsupported file type (use .jsonl, .json, .csv or .parquet)")
    return _to_problems(reader(path), str(path), columns or {}, modulo)


def data_folders(data_dir: Path | None = None) -> list[Path]:
    """Folders searched for named datasets, in order."""
    folders = []
    if data_dir is None:
        from mathagent.config import Settings

        data_dir = Settings().data_dir
    if data_dir is not None:
        folders.append(Path(data_dir))
    repo_sibling = Path(__file__).resolve().parents[2].parent / "shared" / "datasets"
    if repo_sibling.is_dir():
        folders.append(repo_sibling)
    return folders


def _looks_like_hub(spec: str) -> bool:
    return spec.count("/") == 1 and not spec.startswith((".", "/"))


def _load_named(
    name: str, data_dir: Path | None, columns: Mapping[str, str] | None
) -> list[Problem]:
    if name == SAMPLE:
        with resources.as_file(resources.files("mathagent.evals") / "data" / "sample.jsonl") as p:
            return load_file(p)
    known = NAMED.get(name, NamedSet(f"{name}.jsonl"))
    folders = data_folders(data_dir)
    for folder in folders:
        if (folder / known.file).is_file():
            return load_file(folder / known.file, columns=columns, modulo=known.modulo)
    hub = known.hub or ((name, None, "test") if _looks_like_hub(name) else None)
    where = ", ".join(str(f) for f in folders) or "no data folder (set MATHAGENT_DATA_DIR)"
    if hub is None:
        raise DatasetError(
            f"dataset {name!r}: {known.file} is not in {where}, and it has no Hugging Face Hub "
            f"source; known names: {', '.join([SAMPLE, *NAMED])}, or give a file path"
        )
    return _load_hub(name, hub, {**known.columns, **(columns or {})}, known.modulo, where)


def _load_hub(
    name: str,
    hub: tuple[str, str | None, str],
    columns: Mapping[str, str],
    modulo: int | None,
    where: str,
) -> list[Problem]:
    repo, config, split = hub
    try:
        import datasets as hf_datasets
    except ImportError as exc:
        raise DatasetError(
            f"dataset {name!r} is not in {where}; to download it from the Hugging Face Hub "
            f"({repo}) install the optional 'datasets' package, or put {name}.jsonl in "
            "MATHAGENT_DATA_DIR"
        ) from exc
    try:
        rows = hf_datasets.load_dataset(repo, config, split=split)
    except Exception as exc:
        raise DatasetError(
            f"dataset {name!r} is not in {where}, and downloading {repo} from the Hugging Face "
            f"Hub failed (offline?): {exc}"
        ) from exc
    records = (_gsm8k_answer(dict(row)) if repo == "openai/gsm8k" else dict(row) for row in rows)
    return _to_problems(((i + 1, r) for i, r in enumerate(records)), repo, columns, modulo)


def _gsm8k_answer(row: dict[str, Any]) -> dict[str, Any]:
    """GSM8K's answer field is a worked solution ending in '#### N'."""
    final = str(row["answer"]).rsplit("####", 1)[-1].strip().replace(",", "")
    return {**row, "solution": row["answer"], "answer": final}


def _jsonl_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from exc
            if not isinstance(row, dict):
                raise DatasetError(f"{path}:{lineno}: expected a JSON object per line")
            yield lineno, row


def _json_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})") from exc
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise DatasetError(f"{path}: expected a JSON list of objects")
    yield from ((i + 1, row) for i, row in enumerate(data))


def _csv_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        for row in reader:
            if None in row:
                raise DatasetError(f"{path}:{reader.line_num}: more fields than the header has")
            yield reader.line_num, row


def _parquet_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise DatasetError(f"{path}: reading Parquet needs the 'pyarrow' package") from exc
    yield from ((i + 1, row) for i, row in enumerate(pq.read_table(path).to_pylist()))


def _to_problems(
    rows: Iterator[tuple[int, dict[str, Any]]],
    source: str,
    columns: Mapping[str, str],
    modulo: int | None,
) -> list[Problem]:
    unknown = set(columns) - {*FIELDS, "modulo"}
    if unknown:
        raise DatasetError(f"unknown column mapping keys {sorted(unknown)}; use {FIELDS}")
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    for lineno, row in rows:
        values = {key: _column(row, key, columns) for key in FIELDS}
        for key in ("problem", "answer"):
            if values[key] is None or not str(values[key]).strip():
                raise DatasetError(f"{source}:{lineno}: missing {key!r} ({_hint(key, columns)})")
        pid = str(values["id"]) if values["id"] is not None else str(len(problems))
        if pid in seen:
            raise DatasetError(f"{source}:{lineno}: duplicate id {pid!r} (first on {seen[pid]})")
        seen[pid] = lineno
        row_modulo = row.get(columns.get("modulo", "modulo"))
        problems.append(
            Problem(pid, str(values["problem"]), str(values["answer"]), _modulo(row_modulo, modulo))
        )
    if not problems:
        raise DatasetError(f"{source}: no problems")
    return problems


def _column(row: Mapping[str, Any], key: str, columns: Mapping[str, str]) -> Any:
    if key in columns:
        return row.get(columns[key])
    return next((row[name] for name in ALIASES[key] if row.get(name) is not None), None)


def _hint(key: str, columns: Mapping[str, str]) -> str:
    if key in columns:
        return f"column {columns[key]!r}"
    return f"looked for columns {', '.join(ALIASES[key])}; map another with {key}=COLUMN"


def _modulo(value: Any, default: int | None) -> int | None:
    if value is None or value == "":
        return default
    return int(value)
