"""Markdown renderings of a quote, produced by code so no model ever restates a price.

Both take the quote result JSON of ``flows.home_insurance.rating.quote`` (or its options).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MARKDOWN = "text/markdown"
DISCLOSURE = "This is a non-binding estimate: it is not proof of insurance and not an offer to bind coverage."


def usd(amount: float) -> str:
    """US dollars with thousands separators and cents, e.g. ``$1,556.12`` or ``$450,000.00``."""
    return f"-${-amount:,.2f}" if amount < 0 else f"${amount:,.2f}"


def options(result: dict[str, Any]) -> str:
    """The option table of an eligible quote, with its reference, validity and disclosure."""
    rows = [
        f"### Preliminary home insurance quote {result['quoteId']}",
        "",
        "| Option | Yearly premium | Per month (est.) | Dwelling | Extension | Deductible | Liability | Endorsements |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    rows += [
        _row(f"{o['name']} ({o['id']})", usd(o["annualPremium"]), usd(o["monthlyPremium"]), usd(o["dwellingCoverage"]),
             f"{o['dwellingExtensionPercent']}%", usd(o["deductible"]), usd(o["liabilityLimit"]), _endorsements(o))
        for o in result["options"]
    ]
    rows += [
        "",
        f"Valid through {result['validThrough']} (demo rules {result['rulesVersion']}). {DISCLOSURE}",
        "You can compare options, change the deductible, or select an option for an agent to follow up.",
    ]
    return "\n".join(rows)


def comparison(chosen: Sequence[dict[str, Any]]) -> str:
    """A table of already priced options, in the order asked for."""
    rows = [
        "### Quote comparison",
        "",
        "| Option | Annual premium | Monthly estimate | Deductible | Liability | Extension | Endorsements |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    rows += [
        _row(f"{o['name']} ({o['id']})", usd(o["annualPremium"]), usd(o["monthlyPremium"]), usd(o["deductible"]),
             usd(o["liabilityLimit"]), f"{o['dwellingExtensionPercent']}%", _endorsements(o))
        for o in chosen
    ]
    rows += ["", "Would you like to select one of them, compare others, or change the deductible?"]
    return "\n".join(rows)


def _row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def _endorsements(option: dict[str, Any]) -> str:
    return ", ".join(option["endorsements"]) or "None"
