"""Markdown renderings of a quote, produced by code so no model ever restates a price."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal

from flows.home_insurance.records import QuoteOption, QuoteResult

MARKDOWN = "text/markdown"
DISCLOSURE = (
    "This is a preliminary, non-binding estimate: it does not bind coverage, it is not a policy "
    "and it is not proof of insurance."
)


def usd(amount: Decimal | int) -> str:
    """US dollars with thousands separators; cents only when the amount has them."""
    value = Decimal(amount)
    return f"${value:,.2f}" if value != value.to_integral_value() else f"${value:,.0f}"


def label(name: str) -> str:
    """A snake_case code as words: ``water_backup`` -> ``Water backup``."""
    return name.replace("_", " ").capitalize()


def options(result: QuoteResult) -> str:
    """The full option table of an eligible quote, with its id, validity and disclosure."""
    rows = [
        f"### Preliminary home insurance quote {result.quote_id}",
        "",
        "| Option | Annual premium | Monthly estimate | Dwelling | Extended dwelling | Deductible | Liability "
        "| Endorsements |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for option in result.options:
        rows.append(
            f"| {option.name} (`{option.id}`) | {usd(option.annual_premium)} | {usd(option.monthly_estimate)} "
            f"| {usd(option.dwelling_limit)} | {usd(option.extended_dwelling_limit)} | {usd(option.deductible)} "
            f"| {usd(option.liability_limit)} | {_endorsements(option)} |"
        )
    rows += [
        "",
        f"Valid through {result.valid_through} (rules {result.rules_version}). {DISCLOSURE}",
        "Reply with an option id to choose it, ask to compare options, or ask for a different deductible.",
    ]
    return "\n".join(rows)


def comparison(chosen: Sequence[QuoteOption], quote_id: str | None = None) -> str:
    """A side-by-side table of already priced options, cheapest first, with the yearly differences."""
    ordered = sorted(chosen, key=lambda option: option.annual_premium)
    rows = [
        f"### Comparing options of quote {quote_id}" if quote_id else "### Comparing options",
        "",
        "| | " + " | ".join(f"{option.name} (`{option.id}`)" for option in ordered) + " |",
        "| --- |" + " ---: |" * len(ordered),
        _row("Annual premium", [usd(option.annual_premium) for option in ordered]),
        _row("Monthly estimate", [usd(option.monthly_estimate) for option in ordered]),
        _row("Extended dwelling", [usd(option.extended_dwelling_limit) for option in ordered]),
        _row("Deductible", [usd(option.deductible) for option in ordered]),
        _row("Liability", [usd(option.liability_limit) for option in ordered]),
        _row("Endorsements", [_endorsements(option) for option in ordered]),
        "",
    ]
    cheapest = ordered[0]
    for option in ordered[1:]:
        extra = option.annual_premium - cheapest.annual_premium
        rows.append(f"- {option.name} costs {usd(extra)} more per year than {cheapest.name}.")
    rows += ["", DISCLOSURE]
    return "\n".join(rows)


def _row(title: str, cells: list[str]) -> str:
    return f"| {title} | " + " | ".join(cells) + " |"


def _endorsements(option: QuoteOption) -> str:
    return ", ".join(label(name) for name in option.endorsements) or "None"
