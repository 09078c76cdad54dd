"""Step: one stage of a flow, owning a prompt, tools, durable state and a memory namespace; and the transitions
(``go``, ``stay``, ``direct``, ...) its handlers, logic and ``on_response`` return."""

from __future__ import annotations

import contextlib
import contextvars
import copy
import hashlib
import inspect
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any, ClassVar

from langchain_core.messages import BaseMessage
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, ValidationError

from picoflow.errors import PicoFlowError
from picoflow.messages import OPENER_TEXT, DirectMessage, HumanMessageEx, as_text, gen_message_id, message_step
from picoflow.models.registry import ModelSelection
from picoflow.recovery import LlmAttemptErrorContext, LlmBlockedContext, LlmErrorContext
from picoflow.session.document import format_timestamp, validate_namespace
from picoflow.state import PROMPT_KEY, SAVE_ON_KEY, TRANSIENT_KEY, deep_merge, read_path
from picoflow.validation import validation_problems
from picoflow.wire import PLAIN_TEXT

if TYPE_CHECKING:
    from langchain_core.messages import AIMessage

    from picoflow.flow import Flow
    from picoflow.mcp import MCPTools
    from picoflow.parallel import (
        CancellationSignal,
        Checkpoint,
        FailurePolicy,
        ParallelBatchResult,
        ParallelInvocation,
        RunStepRequest,
        StateChannel,
    )
    from picoflow.turn.parallel import WorkerView



# -- tools --------------------------------------------------------------------------------------

_TOOL_ATTR = "__picoflow_tool__"
_GROUP_ATTR = "__picoflow_tools__"

# The step whose tool handler runs in this task (stay() and direct() need it) and the individual call it
# handles (None inside a group handler).
_handling_step: contextvars.ContextVar[Step | None] = contextvars.ContextVar("picoflow_handling_step", default=None)
_handled_call: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "picoflow_handled_tool_call", default=None
)


@dataclass(frozen=True)
class ToolSpec:
    """A tool the model may call: its name, a description, and a pydantic model for its arguments."""

    name: str
    description: str
    schema: type[BaseModel]

    def __post_init__(self) -> None:
        if not self.name or not self.name.strip():
            raise PicoFlowError("A tool needs a non-empty name.")
        if not (isinstance(self.schema, type) and issubclass(self.schema, BaseModel)):
            raise PicoFlowError(f"Tool '{self.name}' needs a pydantic model class as its schema.")

    def as_model_tool(self) -> dict[str, Any]:
        """The OpenAI-style function description handed to ``bind_tools``: LangChain's conversion of the schema,
        under this tool's name and description."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": _parameters_schema(self.schema),
            },
        }


@dataclass(frozen=True)
class InvalidToolArguments:
    """A tool call whose arguments failed the tool's schema, as ``Step.on_invalid_tool_arguments`` receives it."""

    #: The tool the model called.
    name: str
    #: The arguments as the model sent them (never logged by the framework).
    args: dict[str, Any]
    #: The schema's verdict.
    error: ValidationError

    @property
    def problems(self) -> str:
        """Each problem as ``field: what is wrong``, joined with ``; ``."""
        return validation_problems(self.error, "arguments")

    def default_feedback(self) -> str:
        """The tool result the model gets when the step gives no feedback of its own."""
        return (
            f"Invalid arguments for tool '{self.name}': {self.problems}. "
            "Call the tool again with corrected arguments."
        )


class NoArguments(BaseModel):
    """The schema of a tool whose handler takes no arguments (``async def show_table(self)``)."""


@dataclass(frozen=True)
class ToolDeclaration:
    """One declaration of a tool, as the flow collects them: the spec, who declared it, and how."""

    spec: ToolSpec
    #: Who declared it, for error messages: ``step 'ExploreStep'`` or ``the flow's define_tools()``.
    source: str
    #: Declared by a ``@tool`` handler's signature rather than by a ``ToolSpec`` written out.
    derived: bool = False


def tool_registry(declarations: Iterable[ToolDeclaration], flow_id: str) -> dict[str, ToolSpec]:
    """The flow-wide tool registry: one spec per name, or an error naming both declarations of a clash.

    A typed handler's declaration gives way to another of the same name that has its schema (so a base step's
    typed tool inherited by two registered subclasses is one tool, and a handler annotated with
    ``TerminateSessionStep.TerminateArgs`` reuses that step's definition); a handler taking no arguments gives
    way to any other. Two ``ToolSpec``s written out with one name are a clash, as are two schemas.
    """
    chosen: dict[str, ToolDeclaration] = {}
    for declaration in declarations:
        name = declaration.spec.name
        held = chosen.get(name)
        if held is None or (_gives_way(held, declaration) and not _gives_way(declaration, held)):
            chosen[name] = declaration
        elif not _gives_way(declaration, held):
            raise PicoFlowError(_duplicate_message(name, flow_id, held, declaration))
    return {name: declaration.spec for name, declaration in chosen.items()}


def _gives_way(declaration: ToolDeclaration, other: ToolDeclaration) -> bool:
    """Whether ``declaration``, made by a handler's signature, yields to ``other`` of the same name."""
    schema = declaration.spec.schema
    return declaration.derived and (schema is NoArguments or schema is other.spec.schema)


def _duplicate_message(name: str, flow_id: str, held: ToolDeclaration, clash: ToolDeclaration) -> str:
    return (
        f"Duplicate tool '{name}' registered in flow '{flow_id}': declared by {held.source} (schema "
        f"{held.spec.schema.__name__}) and by {clash.source} (schema {clash.spec.schema.__name__}). Declare the "
        "tool once (in Flow.define_tools() or on a base step the handling steps share) and annotate every "
        "handler with that schema (or let it take no arguments), or rename one of the tools."
    )


@lru_cache(maxsize=512)
def _parameters_schema(schema: type[BaseModel]) -> dict[str, Any]:
    # Converting a model is slow and the model class never changes, so convert it once per class.
    return convert_to_openai_tool(schema)["function"]["parameters"]


def tool(arg: Callable | str | None = None) -> Any:
    """Expose and handle a tool: bare ``@tool`` uses the method name, ``@tool("name")`` an explicit one."""

    def mark(func: Callable, name: str) -> Callable:
        if not callable(func) or isinstance(func, (staticmethod, classmethod)):
            raise PicoFlowError("@tool can only decorate Step instance methods.")
        setattr(func, _TOOL_ATTR, name)
        return func

    if callable(arg):
        return mark(arg, arg.__name__)
    if arg is not None and (not isinstance(arg, str) or not arg.strip()):
        raise PicoFlowError("@tool requires a non-empty tool name.")
    return lambda func: mark(func, arg.strip() if arg else func.__name__)


def tools(names: Iterable[str]) -> Callable[[Callable], Callable]:
    """Handle one exact set of tool names returned together; the handler receives the list of calls."""
    if isinstance(names, str) or not names:
        raise PicoFlowError("@tools requires at least one tool name.")
    names = list(names)
    if any(not isinstance(n, str) or not n.strip() for n in names):
        raise PicoFlowError("@tools requires non-empty tool names.")
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise PicoFlowError(f"@tools cannot declare tool '{name}' more than once.")
        seen.add(name)

    def mark(func: Callable) -> Callable:
        if not callable(func) or isinstance(func, (staticmethod, classmethod)):
            raise PicoFlowError("@tools can only decorate Step instance methods.")
        setattr(func, _GROUP_ATTR, frozenset(names))
        return func

    return mark


@lru_cache(maxsize=1024)
def decorated_tools(cls: type) -> dict[str, str]:
    """Tool name -> method name for every ``@tool`` on ``cls``, the nearest class winning (cached: read-only)."""
    found: dict[str, str] = {}
    for klass in cls.__mro__:
        claimed: dict[str, str] = {}
        for attr, value in vars(klass).items():
            name = getattr(value, _TOOL_ATTR, None)
            if name is None:
                continue
            if name in claimed:
                raise PicoFlowError(f"Tool '{name}' is already handled by method '{claimed[name]}'.")
            claimed[name] = attr
        for name, attr in claimed.items():
            found.setdefault(name, attr)
    return found


@lru_cache(maxsize=1024)
def exposed_order(cls: type) -> tuple[str, ...]:
    """Decorated tool names, base classes first, so a subclass adds to what its parent exposed."""
    names: list[str] = []
    for klass in reversed(cls.__mro__):
        for value in vars(klass).values():
            name = getattr(value, _TOOL_ATTR, None)
            if name is not None and name not in names:
                names.append(name)
    return tuple(names)


@lru_cache(maxsize=1024)
def group_handlers(cls: type) -> dict[frozenset[str], str]:
    """Name set -> method name for every ``@tools`` handler on ``cls``, the nearest class winning."""
    found: dict[frozenset[str], str] = {}
    for klass in cls.__mro__:
        for attr, value in vars(klass).items():
            names = getattr(value, _GROUP_ATTR, None)
            if names is not None:
                found.setdefault(names, attr)
    return found


def _parameters(func: Callable) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(func).parameters.values() if p.name != "self"]


@lru_cache(maxsize=1024)
def argument_model(func: Callable) -> type[BaseModel] | None:
    """The pydantic model a typed handler's argument is annotated with (``args: Model``), else None."""
    try:
        hints = typing.get_type_hints(func)
    except (NameError, TypeError):
        return None
    parameters = _parameters(func)
    if not parameters:
        return None
    hint = hints.get(parameters[0].name)
    return hint if isinstance(hint, type) and issubclass(hint, BaseModel) else None


@lru_cache(maxsize=1024)
def takes_no_arguments(func: Callable) -> bool:
    """Whether a handler (the plain function, not a bound method) takes nothing but ``self``."""
    return not _parameters(func)


@lru_cache(maxsize=1024)
def typed_tool_specs(cls: type) -> tuple[ToolSpec, ...]:
    """A ``ToolSpec`` for every ``@tool`` handler of ``cls`` whose argument is annotated with a pydantic model,
    or that takes no arguments at all (its schema is then the empty ``NoArguments``).

    The name is the tool's, the description the handler's docstring (first paragraph), the schema the annotation:
    such a tool is declared once, by its handler.
    """
    specs = []
    for name, attr in decorated_tools(cls).items():
        func = getattr(cls, attr)
        schema = argument_model(func) or (NoArguments if takes_no_arguments(func) else None)
        if schema is None:
            continue
        doc = inspect.getdoc(func) or ""
        description = doc.split("\n\n", 1)[0].replace("\n", " ").strip() or name.replace("_", " ")
        specs.append(ToolSpec(name=name, description=description, schema=schema))
    return tuple(specs)


@contextlib.contextmanager
def handling(step: Step, call: dict[str, Any] | None) -> Iterator[None]:
    """Mark a handler of ``step`` (a tool handler for ``call`` when it handles a single one, or a decision hook)
    as running in the block: ``stay()`` and ``direct()`` answer for that step."""
    step_token = _handling_step.set(step)
    call_token = _handled_call.set(call)
    try:
        yield
    finally:
        _handled_call.reset(call_token)
        _handling_step.reset(step_token)


def handling_step() -> Step | None:
    """The step whose tool handler is running in this task, if any."""
    return _handling_step.get()


def handled_tool_call() -> dict[str, Any] | None:
    """The tool call whose individual handler is running, if any."""
    return _handled_call.get()


def new_worker(step: Step) -> Step:
    """A new instance of ``step``'s class for one ``run_steps()`` invocation, configured like the registered one
    (its class's constructor runs, so a step that needs more than a flow cannot be a worker)."""
    worker = type(step)(step.flow)
    for name in step.worker_configuration:
        setattr(worker, name, copy.copy(getattr(step, name)))
    return worker


def collect_steps(flow: Any) -> None:
    """Register ``flow``'s steps and its flow-wide tool registry in its run context (ids and tool names checked)."""
    context = flow.run_context
    steps: dict[str, Any] = {}
    for step in flow.define_steps():
        if step.id in steps:
            raise PicoFlowError(
                f"Step '{step.id}' is registered twice in flow '{flow.id}': register it once in define_steps(), "
                "or subclass it (with its own id) for a second role."
            )
        steps[step.id] = step
    if not steps:
        raise PicoFlowError(f"Flow '{flow.id}' defines no steps: return at least one step from define_steps().")
    context.steps = steps
    declarations = [ToolDeclaration(spec, "the flow's define_tools()") for spec in flow.define_tools()]
    for step in steps.values():
        derived = set(typed_tool_specs(type(step)))
        source = f"step '{step.id}'"
        declarations += [ToolDeclaration(spec, source, spec in derived) for spec in step.define_tools()]
    context.tools = tool_registry(declarations, flow.id)
    for step in steps.values():
        if not step.calls_chat_model:
            _refuse_chat_features(step, [d for d in declarations if d.source == f"step '{step.id}'"])
        for name in offered_tool_names(step):
            if name not in context.tools:
                raise PicoFlowError(
                    f"Tool '{name}' is not defined in flow '{flow.id}': step '{step.id}' offers it. Define it "
                    "with a typed @tool handler or a ToolSpec in define_tools(), or stop offering it."
                )


def _refuse_chat_features(step: Any, declared: list[Any]) -> None:
    """Refuse tools and structured output on a step that answers without a chat model (a decision step)."""
    features = []
    if declared or step.use_tools() or exposed_order(type(step)) or group_handlers(type(step)):
        features.append("tools")
    if step.struct_output_schema() is not None:
        features.append("struct_output_schema()")
    if features:
        raise PicoFlowError(
            f"Step '{step.id}' answers without a chat model and cannot use {' or '.join(features)}: "
            "use a regular Step when a model must generate text or call tools."
        )


def offered_tool_names(step: Any) -> list[str]:
    """The flow-registry tools ``step`` offers its model: ``use_tools()`` then its ``@tool`` handlers.

    MCP tools are described by their servers, not by the flow's registry: they are offered separately.
    """
    names = list(step.use_tools())
    for name in exposed_order(type(step)):
        if name not in names:
            names.append(name)
    mcp_names = {name for offer in step.use_mcp_tools() for name in offer.tools}
    return [name for name in names if name not in mcp_names] if mcp_names else names


def tool_handler(step: Any, name: str) -> Any:
    """The bound handler of one tool on ``step``: its ``@tool`` method first, then a same-named method, else None."""
    method = decorated_tools(type(step)).get(name)
    if method is not None:
        return getattr(step, method)
    candidate = getattr(step, name, None)
    return candidate if callable(candidate) and not name.startswith("_") else None


def group_handler(step: Any, names: set[str]) -> Any:
    """The ``@tools`` group handler of ``step`` that handles exactly ``names``, else None."""
    method = group_handlers(type(step)).get(frozenset(names))
    return getattr(step, method) if method else None


# -- transitions --------------------------------------------------------------------------------

TOOL_VALIDATED = "input validated"


def step_name(target: Any) -> str:
    """Normalise a step class, step or name to the registered name (a step is known by its ``id``)."""
    if isinstance(target, str):
        name = target.strip()
        if not name:
            raise PicoFlowError("go() requires a non-empty Step name.")
        return name
    name = getattr(target, "id", None)
    if isinstance(name, str) and name:
        return name
    raise PicoFlowError("go() requires a Step class with a non-empty id.")


@dataclass(frozen=True)
class Transition:
    """Where to go next and what to apply on the destination; every ``with_*`` returns a new object."""

    step: str
    tool: str | None = None
    message: BaseMessage | None = None
    prompt: str | None = None
    state: dict[str, Any] | None = None
    content_type: str | None = None
    finish: bool = False

    def with_tool_feedback(self, feedback: str) -> Transition:
        """The tool result the model reads for the call that returned this (default ``input validated``)."""
        return replace(self, tool=feedback)

    def with_state(self, state: dict[str, Any]) -> Transition:
        """Save ``state`` on the destination step, as its ``save_state(state)`` would, once the cursor is there.

        The destination is the step this transition goes to: ``go(X).with_state(...)`` writes X's state (hand-over
        of what X owns); ``stay(...)``, ``direct(...)`` and ``finish(...)`` write the executing step's.
        """
        return replace(self, state=dict(state))

    def with_prompt(self, prompt: str) -> Transition:
        """Save ``prompt`` as the destination step's ``_prompt``, which its default ``get_prompt()`` returns."""
        return replace(self, prompt=prompt)

    def with_message(self, message: BaseMessage) -> Transition:
        """Hand ``message`` to the destination step: it opens the step's next model call (after the tool results).

        Crossing into another step, that step's ``on_crossing(message, prior_step)`` receives it first and decides
        what is kept. A ``DirectMessage`` is the reply itself, sent without a model call.
        """
        return replace(self, message=message)

    def with_content_type(self, content_type: str) -> Transition:
        """Set the destination step's response content type (e.g. ``application/json``)."""
        return replace(self, content_type=content_type)


def go(target: Any) -> Transition:
    """Move the cursor to ``target`` (a Step class or a registered step name)."""
    return Transition(step=step_name(target))


def _handler_step(what: str) -> Step:
    step = handling_step()
    if step is None:
        raise PicoFlowError(f"{what}() can only be returned from inside a running tool handler or decision hook.")
    return step


def stay(feedback: str | None = None) -> Transition:
    """Keep the executing step and send ``feedback`` (default ``input validated``) back to the model."""
    step = _handler_step("stay")
    return Transition(step=step.id, tool=feedback or TOOL_VALIDATED)


def direct(content: Any) -> Transition:
    """Answer the caller with ``content`` verbatim and keep the cursor; no further model call this turn.

    Returned from a tool handler, or from a ``DecisionStep``'s ``on_decision``/``on_decision_error``.
    """
    step = _handler_step("direct")
    return Transition(step=step.id, message=DirectMessage(step, content))


def direct_to(target: Any, content: Any) -> Transition:
    """Move the cursor to ``target`` and answer with ``content`` verbatim, without a model call."""
    name = step_name(target)
    return Transition(step=name, message=DirectMessage(name, content))


def finish(content: Any) -> Transition:
    """Complete the session, keep the cursor, and answer with ``content`` verbatim."""
    step = handling_step()
    # Outside a handler (on_response, a logic step) the step is known only when the answer is delivered.
    message = DirectMessage(step, content) if step else DirectMessage("", content, id=None)
    # An empty step name keeps the cursor wherever it is.
    return Transition(step="", message=message, finish=True)


@dataclass(frozen=True)
class DirectResult:
    """A worker tool's answer that ends the worker with ``value`` as its output (no further model call)."""

    value: Any


def direct_result(value: Any) -> DirectResult:
    """From a tool handler of a ``run_steps()`` worker: stop that worker and use ``value`` as its output."""
    # Imported here: only run_steps() workers return direct results, and the parallel machinery is theirs.
    from picoflow.parallel import check_json

    check_json(value, "The direct_result() value")
    return DirectResult(copy.deepcopy(value))


def as_transition(value: Any) -> Transition | None:
    """Interpret a handler/logic/on_response result as a transition, or ``None`` if it is not one.

    A class with a non-empty string ``id`` (a step class) routes to that step.
    """
    if isinstance(value, Transition):
        return value
    if isinstance(value, str) and value.strip():
        return Transition(step=value.strip())
    name = getattr(value, "id", None) if isinstance(value, type) else None
    if isinstance(name, str) and name:
        return Transition(step=name)
    return None


# -- steps --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LlmCallPolicy:
    """The resolved, code-owned call policy of one step; never persisted."""

    timeout_ms: int | None = None


def _checked_policy(policy: Any, owner: str) -> Mapping[str, Any]:
    if policy is None:
        return {}
    if not isinstance(policy, Mapping):
        raise PicoFlowError(f"{owner} config_llm_call_policy() must return a dict.")
    unknown = sorted(set(policy) - {"timeout_ms"})
    if unknown:
        raise PicoFlowError(f"{owner} config_llm_call_policy() has unknown key(s) {', '.join(unknown)}.")
    timeout = policy.get("timeout_ms")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0):
        raise PicoFlowError(f"{owner} timeout_ms must be a positive integer or None.")
    return policy


def resolve_call_policy(flow_policy: Any, step_policy: Any) -> LlmCallPolicy:
    """Apply a step's override to the flow policy: an absent key inherits, an int replaces, None removes."""
    flow_side = _checked_policy(flow_policy, "Flow")
    step_side = _checked_policy(step_policy, "Step")
    timeout = flow_side.get("timeout_ms")
    if "timeout_ms" in step_side:
        timeout = step_side["timeout_ms"]
    return LlmCallPolicy(timeout_ms=timeout)


class Step:
    """Subclass this for each conversational stage; register instances in ``Flow.define_steps``."""

    id: ClassVar[str] = ""
    #: False for steps that route without a chat model (``DecisionStep``): they may not offer tools.
    calls_chat_model: ClassVar[bool] = True
    #: What a ``run_steps()`` worker copies from the registered instance: the configuration chained onto it.
    worker_configuration: ClassVar[tuple[str, ...]] = ("_namespace", "_model_override", "_content_type")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "id" not in cls.__dict__:
            cls.id = cls.__name__

    def __init__(self, flow: Flow) -> None:
        self.flow = flow
        self._namespace: str | None = None
        self._model_override: ModelSelection | None = None
        self._content_type = PLAIN_TEXT

    # -- registration -------------------------------------------------------------------------

    def use_memory(self, namespace: str) -> Step:
        """Read and write history in ``namespace`` (steps sharing one share history)."""
        try:
            self._namespace = validate_namespace(namespace)
        except ValueError as exc:
            raise PicoFlowError(str(exc)) from exc
        return self

    def use_model(self, selection: ModelSelection | dict[str, Any]) -> Step:
        """Use another model than the flow's for this step.

        Leave out ``retry_attempts`` to keep the flow's attempt budget; the flow's params are merged in only
        when the provider and model name are the same as the flow's.
        """
        self._model_override = selection if isinstance(selection, ModelSelection) else ModelSelection(**selection)
        return self

    @property
    def namespace(self) -> str:
        return self._namespace or self.id

    def model_selection(self) -> ModelSelection:
        """The effective selection: the flow's, or this step's override inheriting what it leaves unset."""
        context = self.flow.run_context
        base = context.model or self.flow.model_selection()
        # A session keeps the model a step started with, unless the code now chooses one.
        override = self._model_override or context.step_models.get(self.id)
        return base if override is None else override.inherit(base)

    # -- hooks --------------------------------------------------------------------------------

    def get_prompt(self) -> str | None:
        """The system prompt; by default whatever ``.with_prompt()`` stored."""
        return self.flow.run_context.state_of(self).get(PROMPT_KEY)

    def get_turn_notes(self) -> str | None:
        """Data that changes between calls (saved state, the step's progress), sent after the conversation
        instead of in the system prompt, so that prompt and history stay a cacheable prefix; never stored."""
        return None

    def define_tools(self) -> list[ToolSpec]:
        """Tool definitions this step contributes to the flow-wide registry.

        By default, one per typed ``@tool`` handler (``async def book(self, args: BookArgs)``): its name, its
        docstring as the description and its annotation as the schema. An override that declares more
        ``ToolSpec``s keeps those with ``[*super().define_tools(), ...]``.
        """
        return list(typed_tool_specs(type(self)))

    def use_tools(self) -> list[str]:
        """Names of tools to expose without a decorated handler here."""
        return []

    async def on_invalid_tool_arguments(self, invalid: InvalidToolArguments) -> Any:
        """Answer a tool call whose arguments failed the tool's schema; the handler does not run.

        Return ``stay("what to fix")`` or a plain sentence (the tool result the model reads next; the step stays),
        any other transition a handler may return (``go``, ``direct``, ...), or None for the default feedback
        (``invalid.default_feedback()``: the tool, each problem and a request to call it again).
        """
        return None

    def use_mcp_tools(self) -> list[MCPTools]:
        """Tools of the flow's MCP servers this step offers the model, named per server (an allowlist).

        E.g. ``[MCPTools(server="hotel", tools=("search_hotels",))]``. A ``@tool`` handler of the same name
        receives the server's ``MCPToolResult`` instead of the model reading it.
        """
        return []

    async def on_start(self) -> BaseMessage | None:
        """Runs once, for the initial step of a new session."""
        await self.on_enter()
        return self.on_crossing(None)

    async def on_restore(self) -> None:
        """Runs on the current step when a stored session is resumed."""

    async def on_enter(self) -> None:
        """Runs every time this step becomes the current step."""

    async def on_exit(self) -> None:
        """Runs when this step stops being the current step."""

    def on_crossing(self, message: BaseMessage | None, prior_step: str | None = None) -> BaseMessage | None:
        """Decide what this step's model sees on arrival; opens with "Start" when there is nothing."""
        if message is None and message_step(self.get_last_message()) != self.id:
            return HumanMessageEx(self, OPENER_TEXT, origin="framework")
        return message

    async def on_response(self, result: Any) -> Any:
        """Turn a final model answer into a reply (str) or a route (step class, name or transition)."""
        return as_text(result)

    def check_response(self, result: AIMessage | Any) -> bool:
        """Return True to reject this model result and ask for another one."""
        return False

    def accepts_attachments(self) -> bool:
        """Whether the files attached to a turn join the user's message when the turn starts at this step.

        Return False for a step whose model should never see them (a router): they stay out of its memory and
        requests, and flow code still reaches them with ``flow.get_attachments()`` to attach them later.
        """
        return True

    async def run(self, user_message: str | None = None) -> Any:
        """Execute this step: by default the model loop, starting from ``user_message`` when given.

        Override to prepare state (then call ``super().run(...)``) or to compute a nested worker's output.
        """
        return await self.flow.run_context.require_services().model_loop(self, user_message)

    # -- model-call policy and recovery ---------------------------------------------------------

    def config_llm_call_policy(self) -> dict[str, Any]:
        """Override the flow's call policy: omit ``timeout_ms`` to inherit, an int replaces, None removes."""
        return {}

    def get_llm_call_policy(self) -> LlmCallPolicy:
        """The flow's call policy with this step's override applied."""
        return resolve_call_policy(self.flow.config_llm_call_policy(), self.config_llm_call_policy())

    def should_retry_llm_error(self, context: LlmAttemptErrorContext) -> bool | None:
        """After a model invocation raised: True retries, False stops, None asks the flow."""
        return None

    async def on_llm_error(self, context: LlmErrorContext) -> Any:
        """Once a model call failed for good: a reply, a route, ``retry_with_model(...)``, or None for the flow."""
        return None

    async def on_llm_blocked(self, context: LlmBlockedContext) -> Any:
        """When the provider refused or filtered the call: a safe reply or a route, or None for the flow."""
        return None

    def struct_output_schema(self) -> type[BaseModel] | dict[str, Any] | None:
        """A schema to constrain the model's answer, or None for free text."""
        return None

    def is_logic(self) -> bool:
        return False

    def is_end(self) -> bool:
        """Whether the response reports the session as completed."""
        return self.flow.run_context.require_doc().run_status == "completed"

    # -- state --------------------------------------------------------------------------------

    def save_state(self, data: dict[str, Any]) -> None:
        """Replace ``data``'s first key, deep-merge the rest, and stamp ``_saveOn``."""
        if not data:
            return
        context = self.flow.run_context
        context.view(self.flow).record_write(self, list(data))
        state = context.state_of(self)
        state.pop(next(iter(data)), None)
        deep_merge(state, data)
        state[SAVE_ON_KEY] = format_timestamp(datetime.now(UTC))

    def get_state(self, path: str | None = None) -> Any:
        """The whole durable state, or one dotted path in it."""
        return read_path(self.flow.run_context.state_of(self), path)

    def get_step_state(self, step_cls: type[Step] | str, key: str | None = None) -> Any:
        """Another registered step's state, by class or name: the whole state, or the value at ``key`` (a dotted
        path; None when absent). The flow reads it, so a parallel worker sees its snapshot."""
        return self.flow.get_step_state(step_cls, key)

    def remove_state(self, key: str) -> None:
        context = self.flow.run_context
        context.view(self.flow).record_write(self, [key])
        context.state_of(self).pop(key, None)

    def save_transient_state(self, data: dict[str, Any]) -> None:
        """Keep ``data`` for this request only; it is never persisted."""
        context = self.flow.run_context
        context.view(self.flow).record_write(self, [])
        deep_merge(context.state_of(self).setdefault(TRANSIENT_KEY, {}), data)

    def get_transient_state(self, path: str | None = None) -> Any:
        return read_path(self.flow.run_context.state_of(self).get(TRANSIENT_KEY, {}), path)

    def get_context(self, path: str | None = None) -> Any:
        """The flow context (or one dotted path in it), as ``flow.get_context`` reads it."""
        return copy.deepcopy(read_path(self.flow.run_context.values, path))

    # -- memory -------------------------------------------------------------------------------

    def get_memory(self) -> list[BaseMessage]:
        """The live history of this step's namespace (index 0 is the system slot)."""
        return self.flow.run_context.view(self.flow).memory().messages(self.namespace)

    def get_last_message(self) -> BaseMessage | None:
        messages = self.get_memory()
        return messages[-1] if len(messages) > 1 else None

    def erase_memory(self) -> list[BaseMessage]:
        """Clear this namespace's messages (every step sharing it loses them); state is untouched.

        A rolling summary of the namespace is kept and still reaches the model; call
        ``flow.get_memory().clear_summary(namespace)`` as well for a completely fresh start.
        """
        return self.flow.run_context.view(self.flow).memory().namespace(self.namespace).erase()

    def gen_message_id(self) -> str:
        return gen_message_id(self)

    def tool_idempotency_key(self, call: dict[str, Any] | None = None) -> str:
        """A stable key for the tool call being handled (in a ``@tools`` handler, pass one of its calls).

        It is the same for the same session, step, tool and model call id, and differs everywhere else: hand it
        to payment, booking or ticketing APIs so that a repeated call is recognised instead of applied twice.
        """
        call = call or handled_tool_call()
        if not call or not call.get("id"):
            raise PicoFlowError("tool_idempotency_key() needs a tool call: use it inside a tool handler.")
        raw = f"{self.flow.run_context.require_doc().id}|{self.id}|{call.get('name')}|{call['id']}"
        return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:32]

    # -- content type and completion ------------------------------------------------------------

    @property
    def content_type(self) -> str:
        return self._content_type

    @content_type.setter
    def content_type(self, value: str) -> None:
        self._content_type = value or PLAIN_TEXT

    def session_completed(self) -> None:
        """Mark the session completed without moving the cursor."""
        self.flow.mark_completed()

    # -- nested execution -----------------------------------------------------------------------

    async def run_step(self, step_cls: type[Step] | str, user_message: str | None = None) -> Any:
        """Run a registered child step inside this turn and return its answer; the cursor stays put."""
        return await self.flow.run_context.require_services().run_child(self.flow, step_cls, user_message)

    async def run_steps(
        self,
        requests: list[RunStepRequest | dict[str, Any] | type[Step] | str],
        *,
        failure_policy: FailurePolicy = "retain-successes",
        max_concurrency: int | None = None,
        checkpoint: Checkpoint = "none",
        signal: CancellationSignal | None = None,
    ) -> ParallelBatchResult:
        """Run isolated workers of registered steps concurrently and publish their state at the join.

        Branch results come back in request order. ``failure_policy="atomic"`` publishes nothing when a
        branch fails; ``checkpoint="root-join"`` saves the session right after a top-level join.
        """
        return await self.flow.run_context.require_services().run_steps(
            self,
            requests,
            failure_policy=failure_policy,
            max_concurrency=max_concurrency,
            checkpoint=checkpoint,
            signal=signal,
        )

    def parallel_state_channels(self) -> dict[str, StateChannel]:
        """State fields that parallel workers combine through ``contribute_state`` (see ``StepChannels``)."""
        return {}

    def parallel_params_schema(self) -> type[BaseModel] | None:
        """A pydantic model that every ``run_steps`` request's params for this step must satisfy."""
        return None

    def contribute_state(self, name: str, value: Any) -> None:
        """From a worker: add ``value`` to the channel ``name``; contributions reduce in request order."""
        self._own_worker("contribute_state() can only be called by a run_steps() worker on itself.").contribute(
            name, value
        )

    def get_parallel_invocation(self) -> ParallelInvocation:
        """From a worker: its read-only params, branch key, request index, path and cancellation signal."""
        return self._own_worker(f"Step '{self.id}' is not running as a run_steps() worker.").invocation

    def _own_worker(self, refusal: str) -> WorkerView:
        worker = self.flow.run_context.view(self.flow).worker
        if worker is None or worker.step is not self:
            raise PicoFlowError(refusal)
        return worker


class LogicStep(Step):
    """A deterministic step: ``run_logic`` routes without calling a model."""

    def is_logic(self) -> bool:
        return True

    def on_crossing(self, message: BaseMessage | None, prior_step: str | None = None) -> BaseMessage | None:
        # No model reads a logic step's history, so there is nothing to open with.
        return message

    async def run_logic(self) -> Transition | type[Step] | str:
        raise NotImplementedError(f"{type(self).__name__} must implement run_logic().")


CLOSING_PROMPT = (
    "The user has ended the conversation. Confirm briefly and politely that the chat is over, "
    "and do not take up any other topic."
)


class TerminateSessionStep(Step):
    """The closing stage: entering it completes the session; the model says goodbye."""

    class TerminateArgs(BaseModel):
        prompt: str

    def is_end(self) -> bool:
        return True

    async def on_enter(self) -> None:
        self.flow.mark_completed()

    def on_crossing(self, message: BaseMessage | None, prior_step: str | None = None) -> BaseMessage | None:
        if prior_step:
            prior = self.flow.get_step(prior_step)
            if prior is not None:
                self.content_type = prior.content_type
        return HumanMessageEx(self, "I'm done with chat", origin="framework")

    def get_prompt(self) -> str | None:
        return super().get_prompt() or CLOSING_PROMPT

    def define_tools(self) -> list[ToolSpec]:
        """The flow-wide ``terminate_session`` definition, after the subclass's typed tools.

        A handler of it elsewhere may take ``args: TerminateSessionStep.TerminateArgs``, a dict or no arguments.
        """
        return [
            *super().define_tools(),
            ToolSpec(
                name="terminate_session",
                description="End the conversation when the user asks to stop.",
                schema=self.TerminateArgs,
            ),
        ]

    async def terminate_session(self, args: dict[str, Any]) -> Transition:
        # Deliberately undecorated: conversational steps expose and handle the tool themselves.
        return go(TerminateSessionStep).with_prompt(args.get("prompt") or CLOSING_PROMPT)
