"""CSV cells that spreadsheets show as text: the quarantine list, the data health lists and `imagepipe
predict --output x.csv` hold file and class names an attacker can choose (`=1+2.png`, a class folder
`@SUM(...)`)."""

import csv
import io
from typing import Dict, Iterable, Sequence

# A cell starting with one of these is a formula to spreadsheet programs (CSV injection).
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(value) -> str:
    """The cell as text, with a leading apostrophe where a spreadsheet would run it as a formula."""
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(_FORMULA_STARTS) else text


def csv_text(columns: Sequence[str], rows: Iterable[Dict]) -> str:
    """A CSV file's text with a header, every cell made spreadsheet-safe."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: spreadsheet_safe(v) for k, v in row.items()})
    return out.getvalue()
