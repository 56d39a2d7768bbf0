"""CSV cells that spreadsheets show as text, and read back as they were: the quarantine list, the data health
lists, the review file and `imagepipe predict --output x.csv` hold file and class names an attacker can choose
(`=1+2.png`, a class folder `@SUM(...)`). Every CSV a user may open is written through spreadsheet_safe() (csv_text()
here, or each cell), and every one the project reads back through cell_text() (read_rows() here)."""

import csv
import io
from typing import Dict, Iterable, List, Sequence

# A cell starting with one of these is a formula to spreadsheet programs (CSV injection).
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_ESCAPE = "'"  # what spreadsheets take as "text follows", and hide


def spreadsheet_safe(value) -> str:
    """The cell as text, with a leading apostrophe where a spreadsheet would run it as a formula (or where the
    text starts with one itself, so that cell_text() gives back exactly what was written)."""
    text = "" if value is None else str(value)
    return _ESCAPE + text if text.startswith(_FORMULA_STARTS + (_ESCAPE,)) else text


def cell_text(cell: str) -> str:
    """What spreadsheet_safe() was given: its leading apostrophe taken off."""
    return cell[1:] if cell.startswith(_ESCAPE) else cell


def read_rows(text: str) -> List[Dict[str, str]]:
    """A CSV file's rows (its header naming the columns) as the project wrote their cells: each cell_text()."""
    return [
        {k: cell_text(v) if isinstance(v, str) else v for k, v in row.items()}
        for row in csv.DictReader(io.StringIO(text, newline=""))
    ]


def csv_text(columns: Sequence[str], rows: Iterable[Dict]) -> str:
    """A CSV file's text with a header, every cell made spreadsheet-safe."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: spreadsheet_safe(v) for k, v in row.items()})
    return out.getvalue()
