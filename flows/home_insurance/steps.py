"""The steps of HomeInsuranceQuoteFlow.

The model collects and explains; code owns every decision. Each application part lives in the state
of the one step that collects it, ``RateQuoteStep`` prices the confirmed application without a model,
and quote tables reach the customer verbatim through ``direct(...)``.
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from typing import Any, TypeVar

from langchain_core.messages import BaseMessage
from pydantic import BaseModel

from flows.home_insurance import presenter
from flows.home_insurance.rating import QUOTE_CONFIG, rate_application
from flows.home_insurance.records import (
    CompareArgs,
    ContactArgs,
    CoveragePreferences,
    DeductibleArgs,
    NoArguments,
    PropertyProfile,
    Qualification,
    QuoteApplication,
    QuoteResult,
    RiskProfile,
    SelectArgs,
)
from picoflow import Flow, LogicStep, Step, TerminateSessionStep, Transition, direct, go, stay, tool
from picoflow.messages import HumanMessageEx
from picoflow.prompts import prompt

Record = TypeVar("Record", bound=BaseModel)

# What a step "hears" when it is entered without a customer message, so its model has a cue to act on.
REVIEW_OPENER = "Please summarise my application so I can check it before you rate it."
PRESENT_OPENER = "Please show me the options of my current quote."
CONTACT_OPENER = "I have chosen an option. What happens next?"
REFERRAL_OPENER = "What is the outcome of my application?"


class IncompleteApplicationError(RuntimeError):
    """A step that needs application data ran before that data was collected (a programming error)."""


def quote_date(step: Step) -> date:
    """The date quotes are calculated on: ``config.currentDate`` when the request pins one, else today (UTC)."""
    pinned = step.get_context("config.currentDate")
    return date.fromisoformat(pinned) if pinned else datetime.now(UTC).date()


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _instructions(stage_file: str, **values: Any) -> str:
    # The shared role goes first so every stage carries the same safety rules.
    role = prompt("role.md", __file__, CARRIER=QUOTE_CONFIG.carrier)
    return f"{role}\n\n{prompt(stage_file, __file__, **values)}"


def _record(flow: Flow, owner: type[Step], key: str, model: type[Record]) -> Record | None:
    data = flow.get_step_state(owner, key)
    return None if data is None else model.model_validate(data)


# -- collection -------------------------------------------------------------------------------------


class _CollectionStep(Step):
    """Shared exit rule and turn notes of the steps that own an application part."""

    #: The application part the step owns, and how its notes name it.
    part = ""
    label = ""

    def get_turn_notes(self) -> str:
        # The saved record changes as the interview goes on: it follows the conversation, outside the cached prefix.
        return (
            f"Saved {self.label} (null when nothing is saved yet): {_json(self.get_state(self.part))}\n"
            f"Correction requested by the customer (null when none): {_json(self.get_state('correctionRequest'))}"
        )

    def _end_correction(self) -> bool:
        correcting = self.get_state("correctionMode") is True
        self.remove_state("correctionMode")
        self.remove_state("correctionRequest")
        return correcting

    def _leave(self, forward: type[Step]) -> Transition:
        # A correction returns to review, unless earlier parts are still missing (a correction from
        # a referral that happened before the interview was complete): then the interview goes on.
        if self._end_correction() and not missing_parts(self.flow):
            return go(ReviewStep)
        return go(forward)


class QualificationStep(_CollectionStep):
    """Collects location, purchase status, occupancy and effective date; owns ``qualification``."""

    part = "qualification"
    label = "qualification"

    def get_prompt(self) -> str:
        today = quote_date(self)
        return _instructions(
            "qualification.md",
            CURRENT_DATE=today.isoformat(),
            LATEST_DATE=(today + timedelta(days=QUOTE_CONFIG.max_effective_days)).isoformat(),
            SUPPORTED_STATES=", ".join(QUOTE_CONFIG.supported_states),
        )

    @tool
    async def capture_home_qualification(self, record: Qualification) -> Transition:
        """Save the complete qualification record once every field is known."""
        today = quote_date(self)
        latest = today + timedelta(days=QUOTE_CONFIG.max_effective_days)
        if not today < record.effective_date <= latest:
            return stay(f"The effective date must be after {today} and no later than {latest}. Ask for another date.")
        self.save_state({"qualification": record.model_dump(mode="json")})
        if record.state not in QUOTE_CONFIG.supported_states:
            # No point interviewing further: code, not the model, tells the customer why.
            self._end_correction()
            return go(ReferralStep).with_state({"decision": "unsupported", "reasonCodes": ["UNSUPPORTED_STATE"]})
        return self._leave(PropertyStep)


class PropertyStep(_CollectionStep):
    """Collects the building, roof and systems; owns ``property``."""

    part = "property"
    label = "property profile"

    def get_prompt(self) -> str:
        return _instructions(
            "property.md",
            CURRENT_YEAR=str(quote_date(self).year),
        )

    @tool
    async def capture_home_property(self, record: PropertyProfile) -> Transition:
        """Save the complete property profile (all fields, including unchanged ones)."""
        year = quote_date(self).year
        if record.year_built > year:
            return stay(f"The year built cannot be later than {year}. Ask the customer to check it.")
        if record.roof_age_years > year - record.year_built:
            return stay("The roof cannot be older than the home. Ask the customer to check both values.")
        updated = record.systems_updated_year
        if updated is not None and not record.year_built <= updated <= year:
            return stay(f"The systems update year must be between {record.year_built} and {year}.")
        self.save_state({"property": record.model_dump(mode="json")})
        return self._leave(RiskStep)


class RiskStep(_CollectionStep):
    """Collects claims history, hazards and protective devices; owns ``risk``."""

    part = "risk"
    label = "risk profile"

    def get_prompt(self) -> str:
        return _instructions("risk.md")

    @tool
    async def capture_home_risk(self, record: RiskProfile) -> Transition:
        """Save the complete risk profile once claims, hazards and protections are known."""
        self.save_state({"risk": record.model_dump(mode="json")})
        return self._leave(CoverageStep)


class CoverageStep(_CollectionStep):
    """Collects dwelling limit, deductible, liability limit and endorsements; owns ``coverage``."""

    part = "coverage"
    label = "coverage"

    def get_prompt(self) -> str:
        limits = QUOTE_CONFIG.dwelling_limit
        return _instructions(
            "coverage.md",
            MIN_DWELLING=presenter.usd(limits.min),
            MAX_DWELLING=presenter.usd(limits.max),
        )

    @tool
    async def capture_home_coverage(self, record: CoveragePreferences) -> Transition:
        """Save the complete coverage preferences once every choice is made."""
        limits = QUOTE_CONFIG.dwelling_limit
        if not limits.min <= record.dwelling_limit <= limits.max:
            return stay(
                f"The dwelling limit must be between {presenter.usd(limits.min)} and {presenter.usd(limits.max)}."
            )
        self.save_state({"coverage": record.model_dump(mode="json")})
        return self._leave(ReviewStep)


#: The owner of each application part; a correction of a part is routed to its owner.
APPLICATION_OWNERS: dict[str, type[Step]] = {
    "qualification": QualificationStep,
    "property": PropertyStep,
    "risk": RiskStep,
    "coverage": CoverageStep,
}


def application_parts(flow: Flow) -> dict[str, Any]:
    """The four application parts as their owners hold them (``None`` for a part not collected yet)."""
    return {part: flow.get_step_state(owner, part) for part, owner in APPLICATION_OWNERS.items()}


def missing_parts(flow: Flow) -> list[str]:
    """The application parts not collected yet, in interview order."""
    return [part for part, data in application_parts(flow).items() if data is None]


def application(flow: Flow) -> QuoteApplication:
    """The complete typed application; raises ``IncompleteApplicationError`` when a part is missing."""
    missing = missing_parts(flow)
    if missing:
        raise IncompleteApplicationError(f"The application lacks {', '.join(missing)}.")
    return QuoteApplication.model_validate(application_parts(flow))


def current_quote(flow: Flow) -> QuoteResult:
    """The latest result of ``RateQuoteStep``; raises ``IncompleteApplicationError`` before any rating."""
    result = _record(flow, RateQuoteStep, "quoteResult", QuoteResult)
    if result is None:
        raise IncompleteApplicationError("No quote has been calculated yet.")
    return result


class _CorrectsApplication(Step):
    """A later stage that can send a correction back to the step owning the corrected part."""

    @tool
    async def correct_home_application(self, args: dict[str, Any]) -> Transition:
        owner = APPLICATION_OWNERS[args["section"]]
        # The owner re-reads the customer's own words, not the tool's paraphrase of them.
        said = next(
            (m.content for m in reversed(self.get_memory()) if m.type == "human" and m.content),
            args["change"],
        )
        return (
            go(owner)
            .with_state({"correctionMode": True, "correctionRequest": args["change"]})
            .with_message(HumanMessageEx(owner.id, said))
        )


# -- review and rating ------------------------------------------------------------------------------


class ReviewStep(_CorrectsApplication):
    """Shows the application exactly as its owners hold it and routes confirmation or corrections."""

    async def on_enter(self) -> None:
        # Arriving here means the application may have changed: an earlier confirmation no longer counts.
        self.remove_state("confirmedAt")

    def on_crossing(self, message: BaseMessage | None, prior_step: str | None = None) -> BaseMessage | None:
        return message if message is not None else HumanMessageEx(self, REVIEW_OPENER)

    def get_prompt(self) -> str:
        return _instructions("review.md", APPLICATION=_json(application_parts(self.flow)))

    @tool
    async def confirm_home_application(self, args: NoArguments) -> Transition:
        """The customer confirmed that every application detail shown is correct."""
        missing = missing_parts(self.flow)
        if missing:
            return go(APPLICATION_OWNERS[missing[0]])
        self.save_state({"confirmedAt": datetime.now(UTC).isoformat()})
        return go(RateQuoteStep)


class RateQuoteStep(LogicStep):
    """Prices the confirmed application with the rating rules; owns ``quoteResult``. No model is involved."""

    async def run_logic(self) -> Transition:
        if not self.flow.get_step_state(ReviewStep, "confirmedAt"):
            raise IncompleteApplicationError("RateQuoteStep needs an application confirmed in ReviewStep.")
        result = rate_application(application(self.flow), quote_date(self))
        self.save_state({"quoteResult": result.model_dump(mode="json")})
        if result.decision == "eligible":
            return go(PresentQuoteStep).with_state({"needsPresentation": True})
        return go(ReferralStep).with_state({"decision": result.decision, "reasonCodes": result.reason_codes})


# -- presentation and selection -----------------------------------------------------------------------


class PresentQuoteStep(_CorrectsApplication):
    """Presents, compares and re-rates the current quote and records the chosen option.

    Owns ``presentedQuoteId`` and ``selectedOption``; a selection is only ever valid for the quote
    it was made on.
    """

    async def on_enter(self) -> None:
        # The history holds nothing the prompt does not re-inject, and an old table must not linger.
        self.erase_memory()
        quote_id = current_quote(self.flow).quote_id
        if self.get_state("presentedQuoteId") != quote_id:
            self.remove_state("selectedOption")
            self.save_state({"presentedQuoteId": quote_id})

    def on_crossing(self, message: BaseMessage | None, prior_step: str | None = None) -> BaseMessage | None:
        return message if message is not None else HumanMessageEx(self, PRESENT_OPENER)

    async def on_response(self, result: Any) -> Any:
        # The first table follows a logic step, not a tool call: if the model answered in prose
        # instead of calling show_home_quote_options, the table is still rendered by code.
        if self.get_state("needsPresentation"):
            self.remove_state("needsPresentation")
            self.content_type = presenter.MARKDOWN
            return presenter.options(current_quote(self.flow))
        return await super().on_response(result)

    def get_prompt(self) -> str:
        result = current_quote(self.flow)
        return _instructions(
            "present.md",
            QUOTE_RESULT=result.model_dump_json(),
            OPTION_IDS=", ".join(result.option_ids()),
        )

    def get_turn_notes(self) -> str:
        return f"Option chosen so far (null when none): {_json(self.get_state('selectedOption'))}"

    @tool
    async def show_home_quote_options(self, args: NoArguments) -> Transition:
        """Show the customer the exact option table of the current quote."""
        self.remove_state("needsPresentation")
        return direct(presenter.options(current_quote(self.flow))).with_content_type(presenter.MARKDOWN)

    @tool
    async def compare_home_quote_options(self, args: CompareArgs) -> Transition:
        """Show an exact side-by-side comparison of two or more current options."""
        result = current_quote(self.flow)
        wanted = list(dict.fromkeys(option_id.strip().upper() for option_id in args.option_ids))
        chosen = [option for option in (result.option(option_id) for option_id in wanted) if option]
        if len(chosen) != len(wanted) or len(chosen) < 2:
            return stay(f"Compare two or more current option ids: {', '.join(result.option_ids())}.")
        return direct(presenter.comparison(chosen, result.quote_id)).with_content_type(presenter.MARKDOWN)

    @tool
    async def change_home_quote_deductible(self, args: DeductibleArgs) -> Transition:
        """Re-rate the quote with another deductible the customer asked for."""
        coverage = _record(self.flow, CoverageStep, "coverage", CoveragePreferences)
        if coverage is None:
            raise IncompleteApplicationError("PresentQuoteStep needs CoverageStep.coverage.")
        if coverage.deductible == args.deductible:
            return stay(f"The current quote already uses a {presenter.usd(coverage.deductible)} deductible.")
        # The deductible belongs to CoverageStep; the quote is then rebuilt from the updated owner.
        changed = coverage.model_copy(update={"deductible": args.deductible})
        self.flow.save_step_state(CoverageStep, {"coverage": changed.model_dump(mode="json")})
        self.remove_state("selectedOption")
        return go(RateQuoteStep)

    @tool
    async def select_home_quote_option(self, args: SelectArgs) -> Transition:
        """Record the option the customer explicitly chose."""
        result = current_quote(self.flow)
        option = result.option(args.option_id)
        if option is None:
            return stay(f"Choose one current option id: {', '.join(result.option_ids())}.")
        self.save_state({"selectedOption": option.model_dump(mode="json")})
        return go(ContactStep)


class ContactStep(_CorrectsApplication):
    """Asks for consent to be contacted and, only with it, for contact details; owns ``contact``."""

    def on_crossing(self, message: BaseMessage | None, prior_step: str | None = None) -> BaseMessage | None:
        return message if message is not None else HumanMessageEx(self, CONTACT_OPENER)

    def get_prompt(self) -> str:
        return _instructions(
            "contact.md",
            QUOTE_ID=str(self.flow.get_step_state(PresentQuoteStep, "presentedQuoteId")),
            SELECTED_OPTION=_json(self.flow.get_step_state(PresentQuoteStep, "selectedOption")),
        )

    @tool
    async def capture_home_contact(self, details: ContactArgs) -> Transition:
        """Record whether the customer consents to be contacted and, with consent, their details."""
        selected = self.flow.get_step_state(PresentQuoteStep, "selectedOption")
        if selected is None:
            return go(PresentQuoteStep)
        if details.consent and not (details.full_name and details.email):
            return stay("With consent, a full name and an email address are required; phone and address are optional.")
        if not details.consent:
            # Without consent nothing the customer may have mentioned is kept.
            details = ContactArgs(consent=False)
        quote_id = self.flow.get_step_state(PresentQuoteStep, "presentedQuoteId")
        self.save_state({"contact": {**details.model_dump(), "quote_id": quote_id, "option_id": selected["id"]}})
        outcome = f"The customer chose the {selected['name']} option of quote {quote_id} and " + (
            "agreed to be contacted by a licensed agent." if details.consent else "declined to be contacted."
        )
        return go(TerminateSessionStep).with_prompt(_instructions("closing.md", OUTCOME=outcome))


class ReferralStep(_CorrectsApplication):
    """Explains a code-owned referral or unsupported decision, using the configured reason texts."""

    def on_crossing(self, message: BaseMessage | None, prior_step: str | None = None) -> BaseMessage | None:
        return message if message is not None else HumanMessageEx(self, REFERRAL_OPENER)

    def get_prompt(self) -> str:
        codes = self.get_state("reasonCodes") or []
        reasons = "\n".join(f"- {code}: {QUOTE_CONFIG.reason_descriptions.get(code, code)}" for code in codes)
        return _instructions("referral.md", DECISION=str(self.get_state("decision")), REASONS=reasons or "- none")

    @tool
    async def end_home_quote(self, args: NoArguments) -> Transition:
        """The customer has no correction to make and wants to finish."""
        codes = ", ".join(self.get_state("reasonCodes") or [])
        outcome = f"No online quote was given; the application was referred for review ({codes})."
        return go(TerminateSessionStep).with_prompt(_instructions("closing.md", OUTCOME=outcome))
