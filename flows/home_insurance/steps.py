"""The steps of HomeInsuranceQuoteFlow.

The model collects and explains; code owns every decision. Each application part lives in the state of
the one step that collects it, ``RateQuoteStep`` rates the confirmed application without a model, and quote
tables reach the customer verbatim through ``direct(...)``.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from typing import Any

from langchain_core.messages import BaseMessage

from flows.home_insurance import presenter
from flows.home_insurance.rating import QUOTE_CONFIG, iso_instant, quote
from flows.home_insurance.records import (
    NO_CONTACT,
    AcknowledgeArgs,
    CompareArgs,
    ConfirmArgs,
    ContactRequest,
    CorrectionArgs,
    CoveragePreferences,
    DeductibleArgs,
    NoArguments,
    PropertyProfile,
    Qualification,
    RiskProfile,
    SelectArgs,
)
from picoflow import LogicStep, Step, TerminateSessionStep, Transition, direct, go, stay, tool
from picoflow.authoring.prompts import prompt
from picoflow.messages import HumanMessageEx

#: Pins the date quotes are calculated on for every session (an ISO date or instant), as ``config.currentDate``
#: pins it for one session.
CURRENT_DATE_VARIABLE = "HOME_INSURANCE_FLOW_CURRENT_DATE"

# What a step "hears" when it is entered without a customer message, so its model has a cue to act on.
REVIEW_OPENER = "Please summarise my application so I can check it before it is rated."
PRESENT_OPENER = "Please show me the options of my current quote."
CONTACT_OPENER = "I have selected an option. What happens next?"
REFERRAL_OPENER = "What is the outcome of my application?"


class IncompleteApplicationError(RuntimeError):
    """A step that needs application data ran before that data was collected (a programming error)."""


def quote_instant(step: Step) -> datetime:
    """When quotes are calculated: ``config.currentDate``, else ``$HOME_INSURANCE_FLOW_CURRENT_DATE``, else now."""
    pinned = step.get_context("config.currentDate") or os.environ.get(CURRENT_DATE_VARIABLE)
    if not pinned:
        return datetime.now(UTC)
    moment = datetime.fromisoformat(str(pinned).replace("Z", "+00:00"))
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def closing(message: str) -> str:
    """The closing instruction: ``message``, then what the customer must always hear last."""
    return (
        f"{message} Remind the customer that no coverage has been bound and no payment has been taken. "
        "Do not take up any other topic."
    )


def _json(value: Any) -> str:
    return json.dumps(value)


def _instructions(stage_file: str, **values: Any) -> str:
    # The shared role goes first so every stage carries the same safety rules.
    role = prompt("role.md", __file__, CARRIER=QUOTE_CONFIG.carrierName)
    return f"{role}\n\n{prompt(stage_file, __file__, **values)}"


# -- collection -------------------------------------------------------------------------------------


class _CollectionStep(Step):
    """Shared exit rule, notes and closing tool of the steps that own an application part."""

    #: The application part the step owns.
    part = ""

    def get_turn_notes(self) -> str:
        # The saved record changes as the interview goes on: it follows the conversation, outside the cached prefix.
        return (
            f"Saved {self.part} (null when nothing is saved yet): {_json(self.get_state(self.part))}\n"
            f"Correction requested by the customer (null when none): {_json(self.get_state('correctionRequest'))}"
        )

    def _save(self, record: Any, forward: type[Step]) -> Transition:
        self.save_state({self.part: record.model_dump(mode="json")})
        correcting = self.get_state("correctionMode") is True
        self.remove_state("correctionMode")
        self.remove_state("correctionRequest")
        return go(ReviewStep if correcting else forward)

    def _end(self) -> Transition:
        return go(TerminateSessionStep).with_prompt(
            closing("Thank the customer and close the unfinished preliminary quote.")
        )


class QualificationStep(_CollectionStep):
    """Collects location, purchase status, occupancy and effective date; owns ``qualification``."""

    part = "qualification"

    def get_prompt(self) -> str:
        return _instructions(
            "qualification.md",
            CURRENT_DATE=quote_instant(self).date().isoformat(),
            SUPPORTED_STATES=", ".join(QUOTE_CONFIG.supportedStates),
        )

    @tool
    async def capture_home_qualification(self, record: Qualification) -> Transition:
        """Validate and save the complete home quote qualification."""
        now = quote_instant(self)
        try:
            effective = datetime.fromisoformat(record.effectiveDate).replace(tzinfo=UTC)
        except ValueError:
            effective = None
        try:
            latest = now.replace(year=now.year + 1)
        except ValueError:  # 29 February: a year later has no such day
            latest = now.replace(year=now.year + 1, day=28)
        if effective is None or not now < effective <= latest:
            return stay(f"The effective date must be after {now.date()} and no more than one year later.")
        if record.state not in QUOTE_CONFIG.supportedStates:
            self.save_state({self.part: record.model_dump(mode="json")})
            self.remove_state("correctionMode")
            self.remove_state("correctionRequest")
            # No point interviewing further: code, not the model, says why.
            return go(ReferralStep).with_state({"decision": "unsupported", "reasonCodes": ["UNSUPPORTED_STATE"]})
        return self._save(record, PropertyStep)

    @tool
    async def end_qualification_quote(self, args: NoArguments) -> Transition:
        """End the home quote at the qualification stage."""
        return go(TerminateSessionStep).with_prompt(
            closing(f"Thank the customer for considering {QUOTE_CONFIG.carrierName}.")
        )


class PropertyStep(_CollectionStep):
    """Collects the building, roof and system update years; owns ``property``."""

    part = "property"

    def get_prompt(self) -> str:
        return _instructions("property.md", CURRENT_YEAR=str(quote_instant(self).year))

    @tool
    async def capture_home_property(self, record: PropertyProfile) -> Transition:
        """Validate and save the complete property profile."""
        year = quote_instant(self).year
        if record.yearBuilt > year:
            return stay("The year built cannot be in the future.")
        for label, updated in (
            ("plumbing", record.plumbingUpdatedYear),
            ("electrical", record.electricalUpdatedYear),
            ("HVAC", record.hvacUpdatedYear),
        ):
            if updated is not None and not record.yearBuilt <= updated <= year:
                return stay(f"The {label} update year must be between the year built and {year}, or null.")
        return self._save(record, RiskStep)

    @tool
    async def end_property_quote(self, args: NoArguments) -> Transition:
        """End the home quote during property collection."""
        return self._end()


class RiskStep(_CollectionStep):
    """Collects claims, hazards and protective devices; owns ``risk``."""

    part = "risk"

    def get_prompt(self) -> str:
        return _instructions("risk.md")

    @tool
    async def capture_home_risk(self, record: RiskProfile) -> Transition:
        """Validate and save the complete claims, hazards and protection profile."""
        if any(claim.year > quote_instant(self).year for claim in record.claims):
            return stay("A claim year cannot be in the future.")
        return self._save(record, CoverageStep)

    @tool
    async def end_risk_quote(self, args: NoArguments) -> Transition:
        """End the home quote during risk collection."""
        return self._end()


class CoverageStep(_CollectionStep):
    """Collects dwelling coverage, deductible, liability limit and endorsements; owns ``coverage``."""

    part = "coverage"

    def get_prompt(self) -> str:
        return _instructions("coverage.md")

    @tool
    async def capture_home_coverage(self, record: CoveragePreferences) -> Transition:
        """Validate and save the complete coverage preferences."""
        return self._save(record, ReviewStep)

    @tool
    async def end_coverage_quote(self, args: NoArguments) -> Transition:
        """End the home quote during coverage selection."""
        return self._end()


#: The owner of each application part; a correction of a part is routed to its owner.
APPLICATION_OWNERS: dict[str, type[Step]] = {
    "qualification": QualificationStep,
    "property": PropertyStep,
    "risk": RiskStep,
    "coverage": CoverageStep,
}


def application_parts(step: Step) -> dict[str, Any]:
    """The four application parts as their owners hold them (``None`` for a part not collected yet)."""
    return {part: step.flow.get_step_state(owner, part) for part, owner in APPLICATION_OWNERS.items()}


def current_quote(step: Step) -> dict[str, Any]:
    """The latest result of ``RateQuoteStep``; raises ``IncompleteApplicationError`` before any rating."""
    result = step.flow.get_step_state(RateQuoteStep, "quoteResult")
    if not isinstance(result, dict):
        raise IncompleteApplicationError("No quote has been calculated yet.")
    return result


# -- review and rating ------------------------------------------------------------------------------


class ReviewStep(Step):
    """Shows the application exactly as its owners hold it and routes the confirmation or one correction."""

    async def on_enter(self) -> None:
        # The summary is rebuilt from the saved records each time: an old one must not linger.
        self.erase_memory()

    def on_crossing(self, message: BaseMessage | None, prior_step: str | None = None) -> BaseMessage | None:
        return HumanMessageEx(self, REVIEW_OPENER)

    def get_prompt(self) -> str:
        return _instructions("review.md", APPLICATION=_json(application_parts(self)))

    @tool
    async def confirm_home_application(self, args: ConfirmArgs) -> Transition:
        """Confirm the reviewed application and run deterministic rating."""
        if any(value is None for value in application_parts(self).values()):
            return stay("The application is incomplete. Ask which section the customer wants to finish.")
        self.save_state({"confirmedAt": iso_instant(datetime.now(UTC))})
        return go(RateQuoteStep)

    @tool
    async def correct_home_application(self, args: CorrectionArgs) -> Transition:
        """Route one requested correction to the step that owns that information."""
        owner = APPLICATION_OWNERS[args.section]
        # The owner re-reads the customer's own words, not the tool's paraphrase of them.
        said = next(
            (m.content for m in reversed(self.get_memory()) if m.type == "human" and m.content), args.change
        )
        return (
            go(owner)
            .with_state({"correctionMode": True, "correctionRequest": args.change})
            .with_message(HumanMessageEx(owner.id, str(said)))
        )

    @tool
    async def end_review_quote(self, args: NoArguments) -> Transition:
        """End the quote during application review."""
        return go(TerminateSessionStep).with_prompt(
            closing("Thank the customer and close the reviewed preliminary quote without rating it.")
        )


class RateQuoteStep(LogicStep):
    """Rates the confirmed application with the rating rules; owns ``quoteResult``. No model is involved."""

    async def run_logic(self) -> Transition:
        parts = application_parts(self)
        missing = [part for part, value in parts.items() if value is None]
        if missing:
            raise IncompleteApplicationError(f"RateQuoteStep requires {', '.join(missing)}.")
        result = quote(parts, quote_instant(self))
        self.save_state({"quoteResult": result})
        if result["decision"] == "eligible":
            return go(PresentQuoteStep).with_state({"needsPresentation": True})
        return go(ReferralStep).with_state({"decision": result["decision"], "reasonCodes": result["reasonCodes"]})


# -- presentation and selection -----------------------------------------------------------------------


class PresentQuoteStep(Step):
    """Presents, compares and re-rates the current quote and records the selected option.

    Owns ``presentedQuoteId`` and ``selectedOption``; a selection is only ever valid for the quote it was
    made on.
    """

    async def on_enter(self) -> None:
        # The history holds nothing the prompt does not re-inject, and an old table must not linger.
        self.erase_memory()
        quote_id = current_quote(self)["quoteId"]
        if self.get_state("presentedQuoteId") != quote_id:
            self.remove_state("selectedOption")
            self.save_state({"presentedQuoteId": quote_id})

    def on_crossing(self, message: BaseMessage | None, prior_step: str | None = None) -> BaseMessage | None:
        return HumanMessageEx(self, PRESENT_OPENER)

    async def on_response(self, result: Any) -> Any:
        # The first table follows a logic step, not a tool call: if the model answered in prose
        # instead of calling show_home_quote_options, the table is still rendered by code.
        if self.get_state("needsPresentation"):
            self.remove_state("needsPresentation")
            self.content_type = presenter.MARKDOWN
            return presenter.options(current_quote(self))
        return await super().on_response(result)

    def get_prompt(self) -> str:
        return _instructions(
            "present.md",
            QUOTE_RESULT=_json(current_quote(self)),
            SELECTED_OPTION=_json(self.get_state("selectedOption")),
        )

    @tool
    async def show_home_quote_options(self, args: NoArguments) -> Transition:
        """Render the exact current quote options without model-authored prices."""
        self.remove_state("needsPresentation")
        return direct(presenter.options(current_quote(self))).with_content_type(presenter.MARKDOWN)

    @tool
    async def compare_home_quote_options(self, args: CompareArgs) -> Transition:
        """Render an exact comparison of current option ids."""
        result = current_quote(self)
        wanted = list(dict.fromkeys(option_id.strip().upper() for option_id in args.optionIds))
        chosen = [option for option in result["options"] if option["id"] in wanted]
        chosen.sort(key=lambda option: wanted.index(option["id"]))
        if len(chosen) != len(wanted):
            return stay(f"Choose only current option IDs: {', '.join(o['id'] for o in result['options'])}.")
        return direct(presenter.comparison(chosen)).with_content_type(presenter.MARKDOWN)

    @tool
    async def change_home_quote_deductible(self, args: DeductibleArgs) -> Transition:
        """Change the deductible and deterministically re-rate the application."""
        coverage = self.flow.get_step_state(CoverageStep, "coverage")
        if not isinstance(coverage, dict):
            raise IncompleteApplicationError("PresentQuoteStep requires CoverageStep.coverage.")
        # The deductible belongs to CoverageStep; the quote is then rebuilt from the updated owner.
        self.flow.save_step_state(CoverageStep, {"coverage": {**coverage, "deductible": args.deductible}})
        self.remove_state("selectedOption")
        return go(RateQuoteStep)

    @tool
    async def select_home_quote_option(self, args: SelectArgs) -> Transition:
        """Select one exact current quote option for an optional agent follow-up."""
        result = current_quote(self)
        wanted = args.optionId.strip().upper()
        option = next((o for o in result["options"] if o["id"] == wanted), None)
        if option is None:
            return stay(f"Choose one current option ID: {', '.join(o['id'] for o in result['options'])}.")
        self.save_state({"selectedOption": option})
        return go(ContactStep)

    @tool
    async def end_present_quote(self, args: NoArguments) -> Transition:
        """End the home quote while keeping its reference number."""
        result = current_quote(self)
        return go(TerminateSessionStep).with_prompt(
            closing(
                f"Thank the customer and give quote reference {result['quoteId']}, "
                f"valid through {result['validThrough']}."
            )
        )


class ContactStep(Step):
    """Asks for consent to an agent's follow-up and, only with it, for contact details; owns ``contact``."""

    async def on_enter(self) -> None:
        self.erase_memory()

    def on_crossing(self, message: BaseMessage | None, prior_step: str | None = None) -> BaseMessage | None:
        return HumanMessageEx(self, CONTACT_OPENER)

    def _selected(self) -> dict[str, Any]:
        option = self.flow.get_step_state(PresentQuoteStep, "selectedOption")
        if not isinstance(option, dict):
            raise IncompleteApplicationError("ContactStep requires PresentQuoteStep.selectedOption.")
        return option

    def get_prompt(self) -> str:
        return _instructions(
            "contact.md", SELECTED_OPTION=_json(self._selected()), QUOTE_RESULT=_json(current_quote(self))
        )

    @tool
    async def capture_home_quote_contact(self, request: ContactRequest) -> Transition:
        """Save explicit contact consent and the optional contact fields allowed with it."""
        if request.consentToContact and not (request.name and request.email):
            return stay("When contact consent is yes, collect both a name and a valid email address.")
        contact = request.model_dump() if request.consentToContact else dict(NO_CONTACT)
        self.save_state({"contact": contact})
        result, option = current_quote(self), self._selected()
        follow_up = (
            f"Confirm that an agent follow-up was requested for {request.name} at {request.email}."
            if request.consentToContact
            else "Confirm that no agent follow-up details were kept."
        )
        return go(TerminateSessionStep).with_prompt(
            closing(
                f"{follow_up} Give quote {result['quoteId']} and the selected {option['name']} ({option['id']}) "
                f"option, valid through {result['validThrough']}."
            )
        )

    @tool
    async def end_contact_quote(self, args: NoArguments) -> Transition:
        """End without recording agent follow-up contact details."""
        self.save_state({"contact": dict(NO_CONTACT)})
        return go(TerminateSessionStep).with_prompt(
            closing(
                f"Confirm that no contact details were kept and give quote reference {current_quote(self)['quoteId']}."
            )
        )


class ReferralStep(Step):
    """Explains a code-owned referral or unsupported decision from its reason codes, then ends."""

    async def on_enter(self) -> None:
        self.erase_memory()

    def on_crossing(self, message: BaseMessage | None, prior_step: str | None = None) -> BaseMessage | None:
        return HumanMessageEx(self, REFERRAL_OPENER)

    def get_prompt(self) -> str:
        return _instructions(
            "referral.md",
            DECISION=_json(self.get_state("decision") or "referral"),
            REASON_CODES=_json(self.get_state("reasonCodes") or []),
        )

    @tool
    async def finish_home_quote_referral(self, args: AcknowledgeArgs) -> Transition:
        """Finish the automated referral after explaining its reason codes."""
        return go(TerminateSessionStep).with_prompt(
            closing(
                "Thank the customer and explain that an agent would need to review the application before any "
                "quote could be offered."
            )
        )
