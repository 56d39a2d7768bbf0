"""The model card's summary, read back for the run summary and the report: the card's figures and its files."""

from typing import Any, Dict

from components.model_card import CARD_HTML, CARD_JSON, CARD_MD
from components.summary_reading import json_output


def read(c: Dict[str, Any]) -> Dict[str, Any]:
    card = json_output(c, "model_card", CARD_JSON, card_json=CARD_JSON, card_md=CARD_MD, card_html=CARD_HTML)
    if not card:
        return {}
    return {
        "card": {k: card[k] for k in ("model", "evaluation", "training")},
        **{k: card[k] for k in ("card_json", "card_md", "card_html")},
    }
