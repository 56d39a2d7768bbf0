"""CSV cells that spreadsheets show as text: the quarantine list and `imagepipe predict --output x.csv`
both hold file and class names an attacker can choose (`=1+2.png`, a class folder `@SUM(...)`)."""

# A cell starting with one of these is a formula to spreadsheet programs (CSV injection).
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(value) -> str:
    """The cell as text, with a leading apostrophe where a spreadsheet would run it as a formula."""
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(_FORMULA_STARTS) else text
