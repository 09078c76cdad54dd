"""Documents written by older releases and by the original runtime, read into today's shape: pure functions over
the raw JSON that the document's validators apply before validating."""

from __future__ import annotations

from typing import Any


def legacy_envelope(data: Any) -> Any:
    """An envelope without its retired keys: ``expireAfter``, a database's ``_id``, a ``flows`` list of one."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    data.pop("expireAfter", None)  # older releases persisted an expiry; policy now lives in the flow
    legacy_id = data.pop("_id", None)  # a document database's own key, beside or instead of ``id``
    if not data.get("id") and legacy_id is not None:
        data["id"] = str(legacy_id)
    if "flows" in data:
        flows = data.pop("flows")
        if "flow" in data or not isinstance(flows, list) or len(flows) != 1:
            raise ValueError("a session document holds exactly one flow")
        data["flow"] = flows[0]
    revision = data.get("revision")
    if isinstance(revision, float) and revision.is_integer():
        data["revision"] = int(revision)
    return data


def legacy_flow(data: Any) -> Any:
    """A flow object with list-shaped memory, plain-name sequence entries, ``isActive`` and per-step model fields
    brought to the current form."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    memory = data.get("memory")
    if isinstance(memory, list):
        # Older releases stored memory as [{nameSpace, history}].
        converted: dict[str, Any] = {}
        for entry in memory:
            if not isinstance(entry, dict) or "nameSpace" not in entry:
                raise ValueError("legacy memory entries need a nameSpace")
            converted[entry["nameSpace"]] = {"messages": entry.get("history") or []}
        data["memory"] = converted
    if "sequence" in data:
        data["sequence"] = normalise_sequence(data["sequence"])
    steps = data.get("steps")
    if isinstance(steps, list):
        active = None
        steps_out: list[Any] = []
        for step in steps:
            if isinstance(step, dict):
                step = dict(step)
                # The original runtime marked the cursor on the step itself rather than in currentStep.
                if step.pop("isActive", False) and active is None:
                    active = step.get("name")
                legacy_model = _legacy_step_model(step, data.get("model"))
                if legacy_model is not None and step.get("model") is None:
                    step["model"] = legacy_model
            steps_out.append(step)
        data["steps"] = steps_out
        if not data.get("currentStep") and active:
            data["currentStep"] = active
    return data


def normalise_sequence(sequence: Any) -> Any:
    """Plain step names (an older form) as level-1 sequence entries; anything else as it is."""
    if not isinstance(sequence, list):
        return sequence
    return [{"level": 1, "stepName": item} if isinstance(item, str) else item for item in sequence]


def _legacy_step_model(step: dict[str, Any], flow_model: Any) -> dict[str, Any] | None:
    """A step's model from the original runtime's ``modelName`` / ``modelParamsName`` / ``modelParams``."""
    name = step.pop("modelName", None)
    params_name = step.pop("modelParamsName", None)
    params = step.pop("modelParams", None)
    if not name and not params:
        return None
    default = flow_model if isinstance(flow_model, dict) else {}
    # The params type is named after its provider (e.g. "OpenAIParams" or "openai").
    provider = str(params_name).lower().removesuffix("params").strip(" _-") if params_name else ""
    provider = provider or str(default.get("provider") or "")
    if not provider:
        return None
    return {"provider": provider, "name": name or default.get("name") or "", "params": dict(params or {})}
