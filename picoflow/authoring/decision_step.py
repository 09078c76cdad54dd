"""DecisionStep: a logic step that routes on typed answers from a decision provider instead of prose.

A decision step asks a provider a batch of typed questions about the conversation and some application
facts; the turn checks the answers against the questions and hands them to ``on_decision``, which returns an
ordinary transition. It is a ``LogicStep``, so the hop loop needs nothing special for it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Self

from picoflow.authoring.decision import (
    DECISION_OPTION_NAMES,
    Answer,
    DecisionConfig,
    DecisionContext,
    DecisionErrorContext,
    Question,
    resolve_decision_config,
)
from picoflow.authoring.step import LogicStep, Step
from picoflow.authoring.transitions import Transition
from picoflow.conversation.requests import DEFAULT_MAX_PRIOR_REQUESTS
from picoflow.errors import PicoFlowError
from picoflow.models.registry import ModelSelection, ProviderRegistry

if TYPE_CHECKING:
    from picoflow.authoring.flow import Flow


class DecisionStep(LogicStep):
    """A step that routes on typed answers from a decision provider instead of generating prose.

    Implement ``define_questions()`` and ``on_decision(answers, context)``; optionally ``get_prompt()``
    (guidance prepended to every question), ``get_decision_facts()`` (JSON application facts),
    ``config_decision()`` and ``on_decision_error(error, context)``. Chat models, tools and structured
    output belong to ordinary steps and are refused here.
    """

    #: Routed by a decision provider: tools and structured output are refused when the flow collects its steps.
    calls_chat_model: ClassVar[bool] = False
    worker_configuration: ClassVar[tuple[str, ...]] = (*LogicStep.worker_configuration, "_decision_options")
    #: How many earlier human messages the provider sees as ``priorRequests``.
    max_prior_requests: ClassVar[int] = DEFAULT_MAX_PRIOR_REQUESTS

    def __init__(self, flow: Flow) -> None:
        super().__init__(flow)
        self._decision_options: dict[str, Any] = {}

    # -- registration -------------------------------------------------------------------------

    def use_model(self, selection: ModelSelection | dict[str, Any]) -> Self:
        raise PicoFlowError(
            f"DecisionStep '{self.id}' does not call a chat model: choose its decision model with "
            "use_decision(model=...) or config_decision()."
        )

    def use_decision(self, config: DecisionConfig | Mapping[str, Any] | None = None, **options: Any) -> DecisionStep:
        """Override decision options for this registered instance: a ``DecisionConfig``, a dict, or keywords
        (``provider``, ``model``, ``timeout_ms``/``timeoutMs``, ``max_retries``/``maxRetries``)."""
        given = dict(config.model_dump(exclude_unset=True) if isinstance(config, DecisionConfig) else config or {})
        given.update(options)
        unknown = sorted(str(name) for name in given if name not in DECISION_OPTION_NAMES)
        if unknown:
            raise PicoFlowError(f"use_decision() got unknown option(s) {', '.join(unknown)}.")
        self._decision_options.update(given)
        return self

    # -- hooks --------------------------------------------------------------------------------

    def define_questions(self) -> Mapping[str, Question]:
        """The questions of this invocation, by name; called afresh every time the step runs."""
        raise NotImplementedError(f"{type(self).__name__} must implement define_questions().")

    def get_decision_facts(self) -> dict[str, Any]:
        """JSON-compatible application facts the questions are about (``request``/``priorRequests`` are reserved)."""
        return {}

    def config_decision(self) -> DecisionConfig | dict[str, Any]:
        """This step's decision options over the flow's: ``provider``, ``model``, ``timeoutMs``, ``maxRetries``."""
        return {}

    async def on_decision(self, answers: dict[str, Answer], context: DecisionContext) -> Transition | type[Step] | str:
        """Route on validated answers: a transition (``go``, ``direct_to``, ``finish``), a step class or name."""
        raise NotImplementedError(f"{type(self).__name__} must implement on_decision().")

    async def on_decision_error(self, error: Exception, context: DecisionErrorContext) -> Any:
        """Recover from a failed or invalid decision with a route, or None to ask the flow (then re-raise)."""
        return None

    # -- execution ----------------------------------------------------------------------------

    def decision_config(self) -> DecisionConfig:
        """Framework defaults, then the flow's ``config_decision()``, this step's, and ``use_decision()``.

        The result is resolved: ``model`` is the ``ModelSelection`` asked and ``provider`` its provider.
        """
        layers = [
            (f"{type(self.flow).__name__}.config_decision()", self.flow.config_decision()),
            (f"{type(self).__name__}.config_decision()", self.config_decision()),
            ("use_decision()", self._decision_options),
        ]
        try:
            return resolve_decision_config(layers, self.flow.model_selection())
        except PicoFlowError as exc:
            raise PicoFlowError(f"Flow '{self.flow.id}', DecisionStep '{self.id}': {exc.message}") from exc

    async def run_logic(self) -> Transition:
        """Ask the decision provider this step's questions and route on the answers."""
        return await self.flow.run_context.require_services().decide(self)


def check_decision_setup(step: DecisionStep, providers: ProviderRegistry, decision_providers: Collection[str]) -> None:
    """Refuse, when the flow is registered, a decision configuration that neither a decision provider (by name)
    nor one of the chat ``providers`` can serve."""
    selection = step.decision_config().selection
    if selection.provider in decision_providers:
        return
    try:
        providers.validate(selection)
    except PicoFlowError as exc:
        raise PicoFlowError(
            f"Flow '{step.flow.id}', DecisionStep '{step.id}': decision provider '{selection.provider}' is "
            f"neither a registered decision provider nor a usable chat model ({exc.message}) Register it with "
            f"FlowEngine(decision_providers={{'{selection.provider}': ...}}) (PICOFLOW_DECISION_PROVIDERS where "
            "the engine is built from the environment), or choose another in config_decision()."
        ) from exc
