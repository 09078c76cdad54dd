"""What a step's tools are: ``ToolSpec``, the ``@tool`` and ``@tools`` decorators, and reading a step's handlers
and typed declarations off its class."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeVar, overload

from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, ValidationError

from picoflow.errors import PicoFlowError
from picoflow.validation import validation_problems

_TOOL_ATTR = "__picoflow_tool__"
_GROUP_ATTR = "__picoflow_tools__"
_EFFECT_ATTR = "__picoflow_effect__"
_APPROVAL_ATTR = "__picoflow_approval__"
_SHOW_ATTR = "__picoflow_show__"

#: How long a call waits for a decision by default, in seconds: the session's user decides within minutes, a
#: reviewer within a day.
USER_APPROVAL_TTL = 600
REVIEWER_APPROVAL_TTL = 86_400

#: Who decides a call: the session's user or a reviewer (a second person).
Approver = typing.Literal["user", "reviewer"]
#: What ``approval=`` takes: True (the user decides), "reviewer", or a function of the validated arguments (the
#: user decides when it answers True; it may also name who decides: "user" or "reviewer"; False: nobody).
ApprovalSetting = bool | str | Callable[[Any], bool | str] | None

_Handler = TypeVar("_Handler", bound=Callable[..., Any])


@dataclass(frozen=True)
class ApprovalRule:
    """Who must decide a call of an approval tool before its handler runs, when, and for how long it waits."""

    approver: Approver
    #: Seconds a call waits for its decision before it counts as declined (None: the approver's default).
    ttl: int | None
    #: Decides, from the validated arguments, whether this call needs a decision at all (True or False), or who
    #: makes it ("user" or "reviewer"); None: every call waits for ``approver``.
    when: Callable[[Any], bool | str] | None = None

    def approver_for(self, arguments: Any) -> Approver | None:
        """Who decides a call with these validated arguments (the schema's model, or a dict); None: nobody, it
        runs at once."""
        verdict = True if self.when is None else self.when(arguments)
        if verdict is True:
            return self.approver
        if verdict in ("user", "reviewer"):
            return "user" if verdict == "user" else "reviewer"
        if verdict is False or verdict is None:
            return None
        raise PicoFlowError("An approval function returns True, False, 'user' or 'reviewer'.")

    def waiting(self, arguments: Any) -> tuple[Approver, int] | None:
        """Who decides a call with these validated arguments and how many seconds it waits; None: it runs at
        once."""
        approver = self.approver_for(arguments)
        return None if approver is None else (approver, self.ttl_for(approver))

    def ttl_for(self, approver: Approver) -> int:
        """Seconds a call decided by ``approver`` waits: ``approval_ttl=``, else that approver's default."""
        if self.ttl is not None:
            return self.ttl
        return USER_APPROVAL_TTL if approver == "user" else REVIEWER_APPROVAL_TTL


def approval_rule(approval: ApprovalSetting, ttl: float | None, where: str) -> ApprovalRule | None:
    """The rule ``approval=`` and ``approval_ttl=`` declare, or None for a tool that runs without a decision."""
    if approval is None or approval is False:
        if ttl is not None:
            raise PicoFlowError(f"{where}: approval_ttl= needs approval=.")
        return None
    when: Callable[[Any], bool | str] | None = None
    approver: Approver
    if approval is True or approval == "user":
        approver = "user"
    elif approval == "reviewer":
        approver = "reviewer"
    elif callable(approval) and not isinstance(approval, (str, bool)):
        approver, when = "user", approval
    else:
        raise PicoFlowError(f"{where}: approval= takes True, 'reviewer' or a function of the arguments.")
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or ttl <= 0):
        raise PicoFlowError(f"{where}: approval_ttl= must be a positive number of seconds.")
    return ApprovalRule(approver=approver, ttl=int(ttl) if ttl is not None else None, when=when)


@dataclass(frozen=True)
class ToolSpec:
    """A tool the model may call: its name, a description, and a pydantic model for its arguments.

    ``effect=True`` marks a tool whose handler changes something outside the session (a payment, a booking, a
    ticket, an email): its outcome is journaled and replayed, not run again, by a retry of the same turn.

    ``approval=`` makes a person decide each call before its handler runs (which makes the tool an effect):
    ``True`` (the session's user), ``"reviewer"`` (a second person), or a function of the validated arguments
    returning whether this call needs the user's decision (or naming who decides it: ``"user"`` or
    ``"reviewer"``). ``approval_ttl=`` is how many seconds a call waits
    (600 for the user, 86,400 for a reviewer by default); an undecided call then counts as declined.

    ``show=True`` lets clients that display tool calls (AG-UI) see each call's validated arguments and its result;
    ``show=False`` never; ``None`` follows the flow's ``show_tool_calls``, which never shows an effect tool's.
    """

    name: str
    description: str
    schema: type[BaseModel]
    effect: bool = False
    approval: ApprovalSetting = None
    approval_ttl: float | None = None
    show: bool | None = None

    def __post_init__(self) -> None:
        if not self.name or not self.name.strip():
            raise PicoFlowError("A tool needs a non-empty name.")
        if not (isinstance(self.schema, type) and issubclass(self.schema, BaseModel)):
            raise PicoFlowError(f"Tool '{self.name}' needs a pydantic model class as its schema.")
        if approval_rule(self.approval, self.approval_ttl, f"Tool '{self.name}'") is not None:
            object.__setattr__(self, "effect", True)
        if self.show is not None and not isinstance(self.show, bool):
            raise PicoFlowError(f"Tool '{self.name}': show= takes True or False.")

    @property
    def approval_rule(self) -> ApprovalRule | None:
        """Who decides this tool's calls, or None when they run without a decision."""
        return approval_rule(self.approval, self.approval_ttl, f"Tool '{self.name}'")

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



@lru_cache(maxsize=512)
def _parameters_schema(schema: type[BaseModel]) -> dict[str, Any]:
    # Converting a model is slow and the model class never changes, so convert it once per class.
    parameters: dict[str, Any] = convert_to_openai_tool(schema)["function"]["parameters"]
    return parameters


@overload
def tool(
    arg: _Handler, *, effect: bool = False, approval: ApprovalSetting = None, approval_ttl: float | None = None,
    show: bool | None = None,
) -> _Handler: ...


@overload
def tool(
    arg: str | None = None, *, effect: bool = False, approval: ApprovalSetting = None,
    approval_ttl: float | None = None, show: bool | None = None,
) -> Callable[[_Handler], _Handler]: ...


def tool(
    arg: Callable[..., Any] | str | None = None, *, effect: bool = False, approval: ApprovalSetting = None,
    approval_ttl: float | None = None, show: bool | None = None,
) -> Callable[..., Any] | Callable[[_Handler], _Handler]:
    """Expose and handle a tool: bare ``@tool`` uses the method name, ``@tool("name")`` an explicit one.

    ``@tool(effect=True)`` (or ``@tool("name", effect=True)``) marks a handler that changes the world outside the
    session: it runs once per turn, however often the turn is retried (see ``ToolSpec``).

    ``@tool(effect=True, approval=True)`` makes the session's user decide each call before the handler runs;
    ``approval="reviewer"`` a reviewer; a function of the validated arguments decides which calls need the
    user's decision. ``approval_ttl=`` sets how long a call waits (see ``ToolSpec``).

    ``show=True`` lets clients that display tool calls (AG-UI) see each call's validated arguments and result,
    ``show=False`` never; by default the flow's ``show_tool_calls`` decides, and it never shows an effect tool's.
    """
    rule = approval_rule(approval, approval_ttl, "@tool")
    if show is not None and not isinstance(show, bool):
        raise PicoFlowError("@tool: show= takes True or False.")

    def mark(func: _Handler, name: str) -> _Handler:
        if not callable(func) or isinstance(func, (staticmethod, classmethod)):
            raise PicoFlowError("@tool can only decorate Step instance methods.")
        setattr(func, _TOOL_ATTR, name)
        if effect or rule is not None:
            setattr(func, _EFFECT_ATTR, True)
        if rule is not None:
            setattr(func, _APPROVAL_ATTR, rule)
        if show is not None:
            setattr(func, _SHOW_ATTR, show)
        return func

    if callable(arg):
        return mark(arg, arg.__name__)
    if arg is not None and (not isinstance(arg, str) or not arg.strip()):
        raise PicoFlowError("@tool requires a non-empty tool name.")
    return lambda func: mark(func, arg.strip() if arg else func.__name__)


def tools(
    names: Iterable[str], *, effect: bool = False, approval: ApprovalSetting = None, approval_ttl: float | None = None
) -> Callable[[_Handler], _Handler]:
    """Handle one exact set of tool names returned together; the handler receives the list of calls.

    ``effect=True`` journals the group handler's outcome like an effect ``@tool``'s. ``approval=`` makes a person
    decide the whole batch before the handler runs (a predicate receives the list of validated calls).
    """
    rule = approval_rule(approval, approval_ttl, "@tools")
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

    def mark(func: _Handler) -> _Handler:
        if not callable(func) or isinstance(func, (staticmethod, classmethod)):
            raise PicoFlowError("@tools can only decorate Step instance methods.")
        setattr(func, _GROUP_ATTR, frozenset(names))
        if effect or rule is not None:
            setattr(func, _EFFECT_ATTR, True)
        if rule is not None:
            setattr(func, _APPROVAL_ATTR, rule)
        return func

    return mark


def _is_effect(registry: Mapping[str, ToolSpec], names: Iterable[str], func: Any) -> bool:
    """Whether ``func``, handling the tools ``names``, changes the world: it was declared with ``effect=True``, or
    one of its tools is a ``ToolSpec(..., effect=True)``."""
    if getattr(func, _EFFECT_ATTR, False):
        return True
    return any(getattr(registry.get(name), "effect", False) for name in names)


def _shows_call(registry: Mapping[str, ToolSpec], name: str, func: Any, show_tool_calls: bool) -> bool:
    """Whether clients that display tool calls may see the arguments and result of a call of the registry tool
    ``name`` (handled by ``func``, if any): the handler's ``show=``, else its ``ToolSpec``'s, else the flow's
    ``show_tool_calls`` for a tool without effects. A name outside the flow's registry is never shown."""
    spec = registry.get(name)
    if spec is None:
        return False
    declared: bool | None = getattr(func, _SHOW_ATTR, None)
    if declared is None:
        declared = spec.show
    if declared is not None:
        return declared
    return show_tool_calls and not _is_effect(registry, [name], func)


def _approval_of(registry: Mapping[str, ToolSpec], names: Iterable[str], func: Any) -> ApprovalRule | None:
    """Who must decide a call of ``func`` (handling the tools ``names``) before it runs, if anyone: its own
    ``approval=``, else the first of its tools' ``ToolSpec`` that declares one."""
    rule: ApprovalRule | None = getattr(func, _APPROVAL_ATTR, None)
    if rule is not None:
        return rule
    for name in names:
        spec = registry.get(name)
        found = spec.approval_rule if isinstance(spec, ToolSpec) else None
        if found is not None:
            return found
    return None


@dataclass(frozen=True)
class Handling:
    """How a step handles the calls of one tool, or one ``@tools`` batch, resolved once per model answer."""

    #: The bound handler; None when the step has none for the tool.
    handler: Any
    #: Whether the handler changes the world, so that it runs once per turn (``effect=True``).
    effect: bool
    #: Who must decide a call before it runs, if anyone.
    approval: ApprovalRule | None
    #: The tools whose calls clients that display tool calls may see.
    shown: frozenset[str]
    #: The pydantic model a typed handler takes (``args: Model``), else None for a JSON dict.
    argument: type[BaseModel] | None
    #: Whether the handler takes nothing but ``self``.
    bare: bool


@dataclass(frozen=True)
class ToolTable:
    """What handles the calls of one model answer: a ``@tools`` handler of exactly their names, which takes the
    whole batch, else one ``Handling`` per tool name."""

    group: Handling | None
    tools: Mapping[str, Handling]


def tool_table(step: Any, registry: Mapping[str, ToolSpec], names: Collection[str], offered: Collection[str],
               show_tool_calls: bool) -> ToolTable:
    """The handling of the tools ``names`` one model answer of ``step`` calls, against the flow's ``registry``: a
    group handler of exactly ``names``, else a ``Handling`` for each of them the step ``offered`` (a name the
    model made up gets none). ``show_tool_calls`` is the flow's default for showing calls of tools without
    effects."""

    def resolved(handler: Any, handled: Collection[str]) -> Handling:
        func = getattr(handler, "__func__", handler)
        shown = frozenset(name for name in handled if _shows_call(registry, name, func, show_tool_calls))
        if handler is None:
            return Handling(None, False, None, shown, None, False)
        return Handling(handler, _is_effect(registry, handled, func), _approval_of(registry, handled, func), shown,
                        argument_model(func), takes_no_arguments(func))

    group = group_handler(step, set(names))
    if group is not None:
        return ToolTable(resolved(group, names), {})
    return ToolTable(None, {name: resolved(tool_handler(step, name), (name,)) for name in names if name in offered})


def class_of(obj: object) -> type:
    """``type(obj)``, typed as the plain ``type`` the per-class caches below take: mypy does not see that a
    ``type[X]`` is hashable (python/mypy#11470)."""
    return type(obj)


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


def _parameters(func: Callable[..., Any]) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(func).parameters.values() if p.name != "self"]


@lru_cache(maxsize=1024)
def argument_model(func: Callable[..., Any]) -> type[BaseModel] | None:
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
def takes_no_arguments(func: Callable[..., Any]) -> bool:
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
        effect = bool(getattr(func, _EFFECT_ATTR, False))
        specs.append(ToolSpec(name=name, description=description, schema=schema, effect=effect,
                              show=getattr(func, _SHOW_ATTR, None)))
    return tuple(specs)


def offered_tool_names(step: Any) -> list[str]:
    """The flow-registry tools ``step`` offers its model: ``use_tools()`` then its ``@tool`` handlers.

    MCP tools are described by their servers, not by the flow's registry: they are offered separately.
    """
    return offered_names(type(step), step.use_tools(), step.use_mcp_tools())


def offered_names(cls: type, use_tools: Iterable[str], mcp_offers: Iterable[Any]) -> list[str]:
    """The flow-registry tools a step of class ``cls`` offers, from what its ``use_tools()`` and
    ``use_mcp_tools()`` returned: the names it uses, then its ``@tool`` handlers, less those an MCP server offers."""
    names = list(use_tools)
    for name in exposed_order(cls):
        if name not in names:
            names.append(name)
    mcp_names = {name for offer in mcp_offers for name in offer.tools}
    return [name for name in names if name not in mcp_names] if mcp_names else names


def tool_handler(step: Any, name: str) -> Any:
    """The bound handler of one tool on ``step``: its ``@tool`` method first, then a same-named method, else None."""
    method = decorated_tools(class_of(step)).get(name)
    if method is not None:
        return getattr(step, method)
    candidate = getattr(step, name, None)
    return candidate if callable(candidate) and not name.startswith("_") else None


def group_handler(step: Any, names: set[str]) -> Any:
    """The ``@tools`` group handler of ``step`` that handles exactly ``names``, else None."""
    method = group_handlers(class_of(step)).get(frozenset(names))
    return getattr(step, method) if method else None
