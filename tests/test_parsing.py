from picoflow.parsing import parse_json, strip_fence


def test_parse_json_strips_code_fences_and_returns_none_for_prose():
    assert parse_json('```json\n{"a": 1}\n```') == {"a": 1}
    assert parse_json("  [1, 2]  ") == [1, 2]
    assert parse_json("```\n{\"b\": true}```") == {"b": True}
    assert parse_json("Sure! Here it is: {") is None
    assert strip_fence("plain text ") == "plain text"
