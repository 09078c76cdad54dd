"""What a step is registered with: the memory namespace it reads and writes, the model it calls instead of the
flow's, and the content type of its replies. Registration chains them (``AskNameStep(self).use_memory("chat")``);
a ``run_steps()`` worker copies them from the registered instance."""

from __future__ import annotations

from typing import Any, ClassVar, Self

from picoflow.errors import PicoFlowError
from picoflow.models.registry import ModelSelection
from picoflow.session.document import validate_namespace
from picoflow.wire import PLAIN_TEXT


class StepSettings:
    """The settings a step is registered with; ``Step`` inherits them."""

    #: The step's registered name (``Step`` defaults it to the class name).
    id: ClassVar[str]
    #: What a ``run_steps()`` worker copies from the registered instance: the settings chained onto it.
    worker_configuration: ClassVar[tuple[str, ...]] = ("_namespace", "_model_override", "_content_type")

    def __init__(self) -> None:
        self._namespace: str | None = None
        self._model_override: ModelSelection | None = None
        self._content_type = PLAIN_TEXT

    def use_memory(self, namespace: str) -> Self:
        """Read and write history in ``namespace`` (steps sharing one share history).

        Args:
            namespace: Letters, digits, ``-`` and ``_``, starting with a letter (at most 128 characters).

        Returns:
            This step, so registrations chain.

        Raises:
            PicoFlowError: the name is not a valid namespace.

        Example:
            ```python
            AskNameStep(self).use_memory("chat")
            ```
        """
        try:
            self._namespace = validate_namespace(namespace)
        except ValueError as exc:
            raise PicoFlowError(str(exc)) from exc
        return self

    def use_model(self, selection: ModelSelection | dict[str, Any]) -> Self:
        """Use another model than the flow's for this step.

        Leave out ``retry_attempts`` to keep the flow's attempt budget; the flow's params are merged in only
        when the provider and model name are the same as the flow's.

        Args:
            selection: A ``ModelSelection``, or the same as a dict (``{"provider": ..., "name": ...}``).

        Returns:
            This step, so registrations chain.

        Example:
            ```python
            FavoritesStep(self).use_model(ModelSelection(provider="openai", name="gpt-4o"))
            ```
        """
        self._model_override = selection if isinstance(selection, ModelSelection) else ModelSelection(**selection)
        return self

    @property
    def namespace(self) -> str:
        """The memory namespace: the one ``use_memory`` chose, else the step's id."""
        return self._namespace or self.id

    @property
    def content_type(self) -> str:
        """The content type of the step's replies (plain text unless a transition or the step sets another)."""
        return self._content_type

    @content_type.setter
    def content_type(self, value: str) -> None:
        self._content_type = value or PLAIN_TEXT
