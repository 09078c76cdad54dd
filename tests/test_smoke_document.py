from picoflow.session.document import SessionDoc


def test_minimal_document_dumps_camel_case_keys():
    doc = SessionDoc.model_validate({"id": "s1", "flow": {"name": "F"}})
    dumped = doc.to_json_dict()
    assert dumped["runStatus"] == "running"
    assert dumped["flow"]["currentStep"] is None
    assert dumped["createdOn"].endswith("Z")
